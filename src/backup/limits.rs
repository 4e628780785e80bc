//! How much a restore may unpack: the configured cap (`[health]
//! restore_limit`), and the free space of the file system it unpacks into
//! less the disk monitor's margin (`[health] disk_pause`: below it the
//! daemon would pause every session at once). Pure.

use std::io::{self, Read};
use std::path::Path;

use crate::error::{Error, Result};

/// Bytes available to unprivileged users on the file system of `path`
/// (`f_bavail * f_frsize`, as the disk monitor counts them).
pub fn free_bytes(path: &Path) -> Result<u64> {
    let st = nix::sys::statvfs::statvfs(path)
        .map_err(|e| Error::io("measuring the free space of", path, e.into()))?;
    // The field types differ between platforms (u32 / u64).
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    let (avail, frsize) = (st.blocks_available() as u64, st.fragment_size() as u64);
    Ok(avail.saturating_mul(frsize))
}

/// What one archive entry costs on disk: a block for it, and its size
/// rounded up to whole blocks (many empty files fill a disk too).
pub fn charge(size: u64) -> u64 {
    const BLOCK: u64 = 4096;
    BLOCK.saturating_add(size.div_ceil(BLOCK).saturating_mul(BLOCK))
}

/// The most a restore may unpack, and what sets it (for the message).
#[derive(Debug, PartialEq, Eq)]
pub struct Limit {
    pub bytes: u64,
    pub why: String,
}

/// The smaller of `cap` and `free - margin`.
pub fn limit(cap: u64, free: u64, margin: u64) -> Limit {
    let room = free.saturating_sub(margin);
    if room < cap {
        Limit {
            bytes: room,
            why: format!(
                "the free space ({free} bytes) less the disk monitor's margin ([health] disk_pause, {margin} bytes): free some space"
            ),
        }
    } else {
        Limit {
            bytes: cap,
            why: format!(
                "[health] restore_limit ({cap} bytes): raise it in the config if this archive is yours"
            ),
        }
    }
}

/// A reader that fails once more than `left` bytes have come through: the
/// whole decompressed stream is bounded, whatever its headers say (a
/// member the archive reader would buffer, such as a long name, included).
pub struct Bounded<R> {
    pub inner: R,
    pub left: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Err(io::Error::other(
                "the archive unpacks to more than the restore limit",
            ));
        }
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_the_cap_or_the_room_above_the_margin() {
        let table: &[(u64, u64, u64, u64, &str)] = &[
            (100, 1000, 500, 100, "restore_limit"),
            (1000, 1000, 500, 500, "free space"),
            (1000, 400, 500, 0, "free space"),
            (0, 1000, 0, 0, "restore_limit"),
        ];
        for &(cap, free, margin, bytes, why) in table {
            let l = limit(cap, free, margin);
            assert_eq!(l.bytes, bytes, "{cap} {free} {margin}");
            assert!(l.why.contains(why), "{}", l.why);
        }
    }

    #[test]
    fn an_entry_costs_a_block_and_its_blocks() {
        assert_eq!(charge(0), 4096);
        assert_eq!(charge(1), 8192);
        assert_eq!(charge(4096), 8192);
        assert_eq!(charge(u64::MAX), u64::MAX);
    }

    #[test]
    fn a_bounded_reader_stops_at_its_bound() {
        let data = [7u8; 100];
        let mut r = Bounded {
            inner: &data[..],
            left: 60,
        };
        let mut out = Vec::new();
        let e = r.read_to_end(&mut out).unwrap_err();
        assert_eq!(out.len(), 60);
        assert!(e.to_string().contains("restore limit"));
    }
}
