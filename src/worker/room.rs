//! Room on the worker's host: whether it has the free disk and memory to
//! pull an order (`--min-free-disk`, `--min-free-memory`).

use std::time::Duration;

/// Below these it pulls no order (0: not checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minimums {
    /// The directory whose file system's free space is checked.
    pub work_dir: std::path::PathBuf,
    pub disk_bytes: u64,
    pub memory_bytes: u64,
}

/// `MemAvailable` of `/proc/meminfo`'s text, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line["MemAvailable:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some(n.saturating_mul(1024)),
        None => Some(n),
        Some(_) => None,
    }
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes / (1 << 20))
}

/// Why the worker may pull nothing now (`None`: it may): free disk on the
/// work directory (`Err`: it could not be read, which also stops pulling)
/// and memory available (`None`: unknown, not held against it) against the
/// minimums. What is short (`"disk"`, `"memory"`), and the words to say.
pub fn short_of_room(
    min: &Minimums,
    disk_free: std::io::Result<u64>,
    memory_available: Option<u64>,
) -> Option<(&'static str, String)> {
    if min.disk_bytes > 0 {
        match disk_free {
            Err(e) => {
                return Some((
                    "disk",
                    format!(
                        "cannot read the free space of {}: {e}",
                        min.work_dir.display()
                    ),
                ));
            }
            Ok(free) if free < min.disk_bytes => {
                return Some((
                    "disk",
                    format!(
                        "{} free on {}, below --min-free-disk {}",
                        mib(free),
                        min.work_dir.display(),
                        mib(min.disk_bytes)
                    ),
                ));
            }
            Ok(_) => {}
        }
    }
    if min.memory_bytes > 0
        && let Some(available) = memory_available
        && available < min.memory_bytes
    {
        return Some((
            "memory",
            format!(
                "{} of memory available, below --min-free-memory {}",
                mib(available),
                mib(min.memory_bytes)
            ),
        ));
    }
    None
}

/// Reads the disk and memory and says why not to pull, if so.
pub(super) fn room_now(min: &Minimums) -> Option<(&'static str, String)> {
    if min.disk_bytes == 0 && min.memory_bytes == 0 {
        return None;
    }
    let disk = if min.disk_bytes > 0 {
        crate::daemon::health::probe(&min.work_dir).map(|p| p.free)
    } else {
        Ok(u64::MAX)
    };
    let memory = if min.memory_bytes > 0 {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| mem_available(&t))
    } else {
        None
    };
    short_of_room(min, disk, memory)
}

/// How long the worker waits before it looks at the disk and memory again.
pub(super) const ROOM_RECHECK: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_from_meminfo() {
        let table: &[(&str, Option<u64>)] = &[
            (
                "MemTotal:       16303572 kB\nMemFree:  1 kB\nMemAvailable:    8000000 kB\n",
                Some(8_000_000 * 1024),
            ),
            ("MemTotal: 1 kB\n", None),
            ("MemAvailable: lots kB\n", None),
            ("MemAvailable: 12 MB\n", None),
            ("MemAvailable: 4096\n", Some(4096)),
        ];
        for (text, want) in table {
            assert_eq!(mem_available(text), *want, "{text:?}");
        }
    }

    #[test]
    fn it_pulls_only_with_room_on_disk_and_in_memory() {
        const MIB: u64 = 1 << 20;
        let min = |disk: u64, memory: u64| Minimums {
            work_dir: "/srv/work".into(),
            disk_bytes: disk,
            memory_bytes: memory,
        };
        // (minimums, disk free, memory available, why not)
        type Row = (
            Minimums,
            std::io::Result<u64>,
            Option<u64>,
            Option<&'static str>,
        );
        let table: Vec<Row> = vec![
            (
                min(1024 * MIB, 512 * MIB),
                Ok(2048 * MIB),
                Some(1024 * MIB),
                None,
            ),
            (
                min(1024 * MIB, 512 * MIB),
                Ok(100 * MIB),
                Some(1024 * MIB),
                Some("100 MiB free on /srv/work, below --min-free-disk 1024 MiB"),
            ),
            (
                min(1024 * MIB, 512 * MIB),
                Ok(2048 * MIB),
                Some(200 * MIB),
                Some("200 MiB of memory available, below --min-free-memory 512 MiB"),
            ),
            // Exactly at the minimum is enough.
            (
                min(1024 * MIB, 512 * MIB),
                Ok(1024 * MIB),
                Some(512 * MIB),
                None,
            ),
            // Disk is said first when both are short.
            (
                min(1024 * MIB, 512 * MIB),
                Ok(0),
                Some(0),
                Some("0 MiB free on /srv/work, below --min-free-disk 1024 MiB"),
            ),
            (
                min(1024 * MIB, 0),
                Err(std::io::Error::other("ENOENT")),
                None,
                Some("cannot read the free space of /srv/work: ENOENT"),
            ),
            // 0 disables; unknown memory is not held against it.
            (min(0, 0), Ok(0), Some(0), None),
            (
                min(0, 512 * MIB),
                Err(std::io::Error::other("ENOENT")),
                None,
                None,
            ),
        ];
        for (i, (min, disk, memory, want)) in table.into_iter().enumerate() {
            assert_eq!(
                short_of_room(&min, disk, memory)
                    .as_ref()
                    .map(|(_, why)| why.as_str()),
                want,
                "row {i}"
            );
        }
    }
}
