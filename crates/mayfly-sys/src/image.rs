//! The running executable's own pages.
//!
//! A page of the page cache is charged to the memory cgroup of the process
//! that first reads it. Stubs and inits run Mayfly's own code inside a
//! sandbox's cgroup, so without care the first sandbox to fault in a part of
//! the binary owns those pages: its cgroup cannot be freed at removal (it
//! lingers as a dying cgroup) unless they are reclaimed, and reclaiming them
//! drops them from the cache, so the next sandbox reads them again.
//! [`readahead_own_image`] reads the binary's mapped segments into the cache
//! from the caller's cgroup, before any sandbox exists.

use std::os::fd::AsFd;

use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

/// One file-backed mapping of `/proc/self/maps`: file offset and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub offset: u64,
    pub len: u64,
}

/// The segments of `/proc/self/maps` text that map `exe`.
pub fn segments_of(maps: &str, exe: &str) -> Vec<Segment> {
    maps.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let range = f.next()?;
            let _perms = f.next()?;
            let offset = u64::from_str_radix(f.next()?, 16).ok()?;
            let _dev = f.next()?;
            let _inode = f.next()?;
            let path = f.collect::<Vec<_>>().join(" ");
            if path != exe {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            Some(Segment {
                offset,
                len: end.checked_sub(start)?,
            })
        })
        .collect()
}

/// Asks the kernel to read every mapped segment of this executable into the
/// page cache now, charged to the calling process's cgroup. Returns how many
/// bytes were requested. Pages already cached are left where they are.
pub fn readahead_own_image() -> std::io::Result<u64> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let file = std::fs::File::open("/proc/self/exe")?;
    let mut total = 0;
    for s in segments_of(&maps, &exe.to_string_lossy()) {
        posix_fadvise(
            file.as_fd(),
            s.offset as i64,
            s.len as i64,
            PosixFadviseAdvice::POSIX_FADV_WILLNEED,
        )
        .map_err(std::io::Error::from)?;
        total += s.len;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_the_mappings_of_the_executable_only() {
        let maps = "\
55d0a0000000-55d0a0200000 r--p 00000000 fd:00 123 /usr/bin/mayfly
55d0a0200000-55d0a0900000 r-xp 001f2000 fd:00 123 /usr/bin/mayfly
55d0a1000000-55d0a1021000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000100000 r-xp 00028000 fd:00 77 /usr/lib/x86_64-linux-gnu/libc.so.6
";
        assert_eq!(
            segments_of(maps, "/usr/bin/mayfly"),
            vec![
                Segment {
                    offset: 0,
                    len: 0x200000
                },
                Segment {
                    offset: 0x1f2000,
                    len: 0x700000
                },
            ]
        );
        assert!(segments_of(maps, "/usr/bin/other").is_empty());
    }

    #[test]
    fn a_path_with_spaces_matches_whole() {
        let maps = "1000-2000 r-xp 00000000 fd:00 1 /opt/my tools/mayfly\n";
        assert_eq!(segments_of(maps, "/opt/my tools/mayfly").len(), 1);
        assert!(segments_of(maps, "/opt/my").is_empty());
    }

    #[test]
    fn the_test_binary_reads_ahead_its_own_segments() {
        assert!(readahead_own_image().unwrap() > 0);
    }
}
