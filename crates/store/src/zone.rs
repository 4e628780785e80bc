//! IANA time zones, read from the system's time zone database when one is
//! named (`/usr/share/zoneinfo`, Debian's `tzdata`; `$TZDIR` if set, as for
//! glibc), not compiled in.
//!
//! Why: the compiled-in tables of `chrono-tz` were 28,575 of the binary's
//! 34,657 relative relocations, on 251 of its 276 relocated pages: ld.so
//! applied them, and copied those pages, at every start of every process,
//! `session begin` and `end` included, which never use a zone (issue 21,
//! bench/hooks/README.md). Now a process that names no zone reads nothing,
//! and one that does reads one small TZif file per zone name.
//!
//! [`Zone`] is a `chrono::TimeZone`, so the rest of the crate computes with
//! chrono as before. A zone's data is read once per process and kept (like
//! the compiled-in tables it replaces: a tzdata upgrade is seen at the next
//! start). `UTC` needs no database.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;

use chrono::{
    Datelike, FixedOffset, LocalResult, NaiveDate, NaiveDateTime, Offset, TimeZone, Timelike,
};

/// Where Debian's `tzdata` puts the database, when `$TZDIR` is not set.
pub const DEFAULT_DIR: &str = "/usr/share/zoneinfo";

/// The largest TZif file read (the biggest in tzdata is about 3 KiB).
const MAX_FILE: u64 = 1 << 20;

/// A time zone of the IANA database, such as `Europe/Berlin`; `Copy`, and
/// equal when the names are.
#[derive(Clone, Copy)]
pub struct Zone(&'static Loaded);

struct Loaded {
    name: &'static str,
    tz: jiff::tz::TimeZone,
}

static UTC_LOADED: Loaded = Loaded {
    name: "UTC",
    tz: jiff::tz::TimeZone::UTC,
};

/// The zones this process has read, by name (one entry per name ever
/// configured: a handful).
static LOADED: Mutex<Vec<&'static Loaded>> = Mutex::new(Vec::new());

/// Why a name gives no zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZoneError {
    /// The database has no zone of that name (or it is not a name at all).
    Unknown,
    /// There is no time zone database at `dir`.
    NoDatabase { dir: PathBuf },
}

impl ZoneError {
    /// The problem with `name` for a config field: `unknown` is the site's
    /// own wording for a name the database lacks.
    pub fn describe(&self, name: &str, unknown: impl FnOnce() -> String) -> String {
        match self {
            ZoneError::Unknown => unknown(),
            ZoneError::NoDatabase { dir } => format!(
                "time zone {name:?} cannot be looked up: there is no time zone database at {} \
                 (install the tzdata package, or set TZDIR to where it is)",
                dir.display()
            ),
        }
    }
}

impl fmt::Display for ZoneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZoneError::Unknown => f.write_str("not an IANA time zone name"),
            ZoneError::NoDatabase { dir } => write!(
                f,
                "no time zone database at {} (install the tzdata package)",
                dir.display()
            ),
        }
    }
}

impl std::error::Error for ZoneError {}

/// The database this process reads: `$TZDIR` if it is set to an absolute
/// path, else [`DEFAULT_DIR`].
pub fn database_dir() -> PathBuf {
    match std::env::var_os("TZDIR") {
        Some(dir) if Path::new(&dir).is_absolute() => PathBuf::from(dir),
        _ => PathBuf::from(DEFAULT_DIR),
    }
}

/// Whether the database at `dir` is there (has the `UTC` zone, which every
/// tzdata has).
pub fn database_present(dir: &Path) -> bool {
    dir.join("UTC").is_file() || dir.join("Etc/UTC").is_file()
}

/// Whether `name` can be an IANA zone name: `Area/Location` components of
/// letters, digits, `_`, `-` and `+` (`America/Port-au-Prince`, `Etc/GMT+5`),
/// so it cannot leave the database directory. The database's files that are
/// not zones (`localtime`, `posixrules`, `Factory`, the `posix/` and `right/`
/// copies) are not names either: the compiled-in tables had none of them.
fn plausible_name(name: &str) -> bool {
    if name.is_empty() || name.len() > 255 {
        return false;
    }
    if matches!(name, "localtime" | "posixrules" | "Factory")
        || name.starts_with("posix/")
        || name.starts_with("right/")
    {
        return false;
    }
    name.split('/').all(|part| {
        part.starts_with(|c: char| c.is_ascii_alphanumeric())
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+'))
    })
}

/// Reads the zone `name` from the database at `dir`, bypassing the cache:
/// what [`Zone::get`] does the first time, and what tests call with a
/// database of their own.
pub fn load_from(dir: &Path, name: &str) -> Result<jiff::tz::TimeZone, ZoneError> {
    if !plausible_name(name) {
        return Err(ZoneError::Unknown);
    }
    let mut data = Vec::new();
    let read =
        std::fs::File::open(dir.join(name)).and_then(|f| f.take(MAX_FILE).read_to_end(&mut data));
    if read.is_err() {
        return Err(if database_present(dir) {
            ZoneError::Unknown
        } else {
            ZoneError::NoDatabase {
                dir: dir.to_path_buf(),
            }
        });
    }
    jiff::tz::TimeZone::tzif(name, &data).map_err(|_| ZoneError::Unknown)
}

impl Zone {
    /// UTC, without the database.
    pub const UTC: Zone = Zone(&UTC_LOADED);

    /// The zone `name` (case matters, as in the database): `UTC` at once,
    /// any other from the database the first time it is asked for.
    pub fn get(name: &str) -> Result<Zone, ZoneError> {
        if name == "UTC" {
            return Ok(Zone::UTC);
        }
        let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(z) = loaded.iter().find(|z| z.name == name) {
            return Ok(Zone(z));
        }
        let tz = load_from(&database_dir(), name)?;
        let z: &'static Loaded = Box::leak(Box::new(Loaded {
            name: Box::leak(name.to_string().into_boxed_str()),
            tz,
        }));
        loaded.push(z);
        Ok(Zone(z))
    }

    /// The zone's IANA name, e.g. `Europe/Berlin`.
    pub fn name(&self) -> &'static str {
        self.0.name
    }

    fn fixed_at(&self, ts: jiff::Timestamp) -> FixedOffset {
        offset(self.0.tz.to_offset(ts))
    }
}

impl FromStr for Zone {
    type Err = ZoneError;
    fn from_str(s: &str) -> Result<Zone, ZoneError> {
        Zone::get(s)
    }
}

impl PartialEq for Zone {
    fn eq(&self, other: &Zone) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Zone {}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Zone({:?})", self.0.name)
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.name)
    }
}

/// A zone's offset at one instant: the zone (so a `DateTime<Zone>` knows
/// its zone) and the offset from UTC then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZoneOffset {
    zone: Zone,
    fixed: FixedOffset,
}

impl Offset for ZoneOffset {
    fn fix(&self) -> FixedOffset {
        self.fixed
    }
}

impl fmt::Display for ZoneOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.fixed, f)
    }
}

fn offset(o: jiff::tz::Offset) -> FixedOffset {
    // jiff's offsets are within ±25:59:59, chrono's within ±23:59:59; no
    // zone of the database comes near either.
    FixedOffset::east_opt(o.seconds()).unwrap_or(FixedOffset::east_opt(0).expect("zero offset"))
}

/// `utc` as jiff's instant; outside jiff's range (years -9999..=9999), the
/// nearest end of it.
fn instant(utc: &NaiveDateTime) -> jiff::Timestamp {
    let t = utc.and_utc();
    jiff::Timestamp::new(t.timestamp(), 0).unwrap_or(if t.timestamp() < 0 {
        jiff::Timestamp::MIN
    } else {
        jiff::Timestamp::MAX
    })
}

/// `local` as jiff's civil time; outside jiff's range, the nearest end of it.
fn civil(local: &NaiveDateTime) -> jiff::civil::DateTime {
    let clamp = |y: i32| y.clamp(-9999, 9999);
    if clamp(local.year()) != local.year() {
        return if local.year() < 0 {
            jiff::civil::DateTime::MIN
        } else {
            jiff::civil::DateTime::MAX
        };
    }
    jiff::civil::DateTime::new(
        local.year() as i16,
        local.month() as i8,
        local.day() as i8,
        local.hour() as i8,
        local.minute() as i8,
        local.second().min(59) as i8,
        local.nanosecond().min(999_999_999) as i32,
    )
    .unwrap_or(jiff::civil::DateTime::MAX)
}

impl TimeZone for Zone {
    type Offset = ZoneOffset;

    fn from_offset(offset: &ZoneOffset) -> Zone {
        offset.zone
    }

    fn offset_from_local_date(&self, local: &NaiveDate) -> LocalResult<ZoneOffset> {
        self.offset_from_local_datetime(&local.and_hms_opt(0, 0, 0).expect("midnight"))
    }

    fn offset_from_local_datetime(&self, local: &NaiveDateTime) -> LocalResult<ZoneOffset> {
        use jiff::tz::AmbiguousOffset;
        let with = |o: jiff::tz::Offset| ZoneOffset {
            zone: *self,
            fixed: offset(o),
        };
        match self.0.tz.to_ambiguous_timestamp(civil(local)).offset() {
            AmbiguousOffset::Unambiguous { offset } => LocalResult::Single(with(offset)),
            // Skipped by a jump forward: no instant has this wall time.
            AmbiguousOffset::Gap { .. } => LocalResult::None,
            // Repeated by a jump back: the earlier instant first.
            AmbiguousOffset::Fold { before, after } => {
                LocalResult::Ambiguous(with(before), with(after))
            }
        }
    }

    fn offset_from_utc_date(&self, utc: &NaiveDate) -> ZoneOffset {
        self.offset_from_utc_datetime(&utc.and_hms_opt(0, 0, 0).expect("midnight"))
    }

    fn offset_from_utc_datetime(&self, utc: &NaiveDateTime) -> ZoneOffset {
        ZoneOffset {
            zone: *self,
            fixed: self.fixed_at(instant(utc)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn at(s: &str) -> chrono::DateTime<Utc> {
        chrono::DateTime::parse_from_rfc3339(s)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn wall(s: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M").unwrap()
    }

    #[test]
    fn names_that_cannot_be_zones_are_refused_before_any_read() {
        for name in [
            "",
            "/etc/passwd",
            "../etc/passwd",
            "Europe/../../etc/passwd",
            "Europe//Berlin",
            "Europe/Berlin/",
            ".hidden",
            "Europe/.Berlin",
            "Europe/Ber lin",
            "localtime",
            "posixrules",
            "Factory",
            "posix/Europe/Berlin",
            "right/Europe/Berlin",
        ] {
            assert!(!plausible_name(name), "{name:?}");
        }
        for name in [
            "UTC",
            "Europe/Berlin",
            "America/Argentina/Buenos_Aires",
            "America/Port-au-Prince",
            "Etc/GMT+5",
            "Etc/GMT-14",
            "EST5EDT",
        ] {
            assert!(plausible_name(name), "{name:?}");
        }
    }

    #[test]
    fn utc_needs_no_database() {
        let none = Path::new("/nonexistent/zoneinfo");
        assert_eq!(Zone::get("UTC"), Ok(Zone::UTC));
        assert_eq!(
            load_from(none, "Europe/Berlin").unwrap_err(),
            ZoneError::NoDatabase {
                dir: none.to_path_buf()
            }
        );
        let off = Zone::UTC.offset_from_utc_datetime(&wall("2026-07-01 12:00"));
        assert_eq!(off.fix().local_minus_utc(), 0);
    }

    #[test]
    fn a_database_without_the_name_says_unknown_not_missing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("UTC"), b"not even TZif").unwrap();
        std::fs::write(dir.path().join("Broken"), b"not even TZif").unwrap();
        assert_eq!(
            load_from(dir.path(), "Europe/Berlin").unwrap_err(),
            ZoneError::Unknown
        );
        assert_eq!(
            load_from(dir.path(), "Broken").unwrap_err(),
            ZoneError::Unknown
        );
    }

    #[test]
    fn the_error_for_a_missing_database_names_the_package() {
        let e = ZoneError::NoDatabase {
            dir: PathBuf::from("/usr/share/zoneinfo"),
        };
        let text = e.describe("Europe/Berlin", || unreachable!());
        assert!(text.contains("\"Europe/Berlin\""), "{text}");
        assert!(text.contains("/usr/share/zoneinfo"), "{text}");
        assert!(text.contains("tzdata"), "{text}");
        let unknown = ZoneError::Unknown.describe("Mars/Olympus", || "site's words".into());
        assert_eq!(unknown, "site's words");
    }

    // The cases below read the system database (tzdata, a dependency of the
    // package and installed on every machine the project builds on).

    #[test]
    fn zones_are_read_once_and_compare_by_name() {
        let a = Zone::get("Europe/Berlin").unwrap();
        let b: Zone = "Europe/Berlin".parse().unwrap();
        assert!(std::ptr::eq(a.0, b.0));
        assert_eq!(a, b);
        assert_ne!(a, Zone::UTC);
        assert_eq!(a.name(), "Europe/Berlin");
        assert_eq!(a.to_string(), "Europe/Berlin");
        assert_eq!("europe/berlin".parse::<Zone>(), Err(ZoneError::Unknown));
        assert_eq!("Mars/Olympus".parse::<Zone>(), Err(ZoneError::Unknown));
        assert_eq!("America".parse::<Zone>(), Err(ZoneError::Unknown));
    }

    #[test]
    fn offsets_gaps_and_folds_as_chrono_tz_gave_them() {
        let berlin = Zone::get("Europe/Berlin").unwrap();
        let off = |s| {
            berlin
                .offset_from_utc_datetime(&at(s).naive_utc())
                .fix()
                .local_minus_utc()
        };
        assert_eq!(off("2026-01-15T12:00:00Z"), 3600);
        assert_eq!(off("2026-07-15T12:00:00Z"), 7200);
        // 29 March 2026, 02:00 -> 03:00: 02:30 does not exist.
        assert!(matches!(
            berlin.from_local_datetime(&wall("2026-03-29 02:30")),
            LocalResult::None
        ));
        // 25 October 2026, 03:00 -> 02:00: 02:30 happens twice, CEST first.
        match berlin.from_local_datetime(&wall("2026-10-25 02:30")) {
            LocalResult::Ambiguous(first, second) => {
                assert_eq!(first.with_timezone(&Utc), at("2026-10-25T00:30:00Z"));
                assert_eq!(second.with_timezone(&Utc), at("2026-10-25T01:30:00Z"));
            }
            other => panic!("{other:?}"),
        }
        let t = berlin
            .from_local_datetime(&wall("2026-06-01 09:00"))
            .unwrap();
        assert_eq!(t.with_timezone(&Utc), at("2026-06-01T07:00:00Z"));
        assert_eq!(
            at("2026-06-01T07:00:00Z")
                .with_timezone(&berlin)
                .naive_local(),
            wall("2026-06-01 09:00")
        );
        // Seconds offsets (local mean time) and the ends of chrono's range.
        let lmt = berlin.offset_from_utc_datetime(&wall("1850-01-01 00:00"));
        assert_eq!(lmt.fix().local_minus_utc(), 3208);
        let _ = berlin.offset_from_utc_datetime(&NaiveDateTime::MAX);
        let _ = berlin.offset_from_local_datetime(&NaiveDateTime::MIN);
    }
}
