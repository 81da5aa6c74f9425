//! Reading a file whose holes cost nothing to read.
//!
//! A sandbox can make a file of any apparent size for free (`truncate -s
//! 1G`). Read through `read(2)`, each hole still costs the daemon: on ext4
//! the kernel allocates and zeroes page-cache pages for it (about 0.9 s of
//! kernel time and 1 GiB of the host's page cache for a 1 GiB hole,
//! measured). [`SparseReader`] asks the filesystem where the data is
//! (`SEEK_DATA`/`SEEK_HOLE`) and reads only that; a hole's zeros are
//! written into the caller's buffer without a syscall.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use nix::errno::Errno;
use nix::unistd::{lseek, Whence};

/// A [`Read`] of a regular file that skips its holes. Reads are positional
/// (`pread`), so the file's own offset is never relied on; a file that
/// shrinks meanwhile ends early, and one that grows is read on.
#[derive(Debug)]
pub struct SparseReader {
    file: File,
    pos: u64,
    /// Where the extent `pos` is in ends (exclusive).
    end: u64,
    /// Whether that extent is data (else a hole).
    data: bool,
    /// The filesystem cannot say where its holes are: plain reads.
    plain: bool,
}

impl SparseReader {
    /// Reads `file` from its start.
    pub fn new(file: File) -> Self {
        SparseReader {
            file,
            pos: 0,
            end: 0,
            data: true,
            plain: false,
        }
    }

    /// Finds the extent `pos` is in.
    fn locate(&mut self) -> io::Result<()> {
        let fd = self.file.as_fd();
        let Ok(at) = i64::try_from(self.pos) else {
            self.plain = true;
            return Ok(());
        };
        match lseek(fd, at, Whence::SeekData) {
            Ok(d) if d > at => {
                (self.data, self.end) = (false, d as u64);
            }
            Ok(_) => match lseek(fd, at, Whence::SeekHole) {
                Ok(h) if h > at => (self.data, self.end) = (true, h as u64),
                // Raced with a truncate: read and see.
                Ok(_) => (self.data, self.end) = (true, self.pos + 1),
                Err(_) => self.plain = true,
            },
            // No data at or past `pos`: a hole to the end of the file, or
            // the end itself (where a read returns 0).
            Err(Errno::ENXIO) => {
                let size = self.file.metadata()?.len();
                if self.pos < size {
                    (self.data, self.end) = (false, size);
                } else {
                    (self.data, self.end) = (true, u64::MAX);
                }
            }
            // `EINVAL` and the like: the filesystem has no such calls.
            Err(_) => self.plain = true,
        }
        Ok(())
    }
}

impl Read for SparseReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if !self.plain && self.pos >= self.end {
            self.locate()?;
        }
        let n = if self.plain {
            self.file.read_at(buf, self.pos)?
        } else {
            let left = self.end - self.pos;
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            if self.data {
                self.file.read_at(&mut buf[..want], self.pos)?
            } else {
                buf[..want].fill(0);
                want
            }
        };
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, SeekFrom, Write};

    use super::*;

    fn read_all(file: File) -> Vec<u8> {
        let mut out = Vec::new();
        SparseReader::new(file).read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn holes_and_data_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = File::create(&path).unwrap();
        // Data, a 3 MiB hole, data, then a hole to the end.
        f.write_all(&[1u8; 5000]).unwrap();
        f.seek(SeekFrom::Start(5000 + (3 << 20))).unwrap();
        f.write_all(&[2u8; 7000]).unwrap();
        f.set_len(16 << 20).unwrap();
        drop(f);
        let got = read_all(File::open(&path).unwrap());
        assert_eq!(got, std::fs::read(&path).unwrap());
        assert_eq!(got.len(), 16 << 20);
        assert_eq!(got[5001 + (3 << 20)], 2);
        // Empty and all-hole files.
        std::fs::write(&path, b"").unwrap();
        assert!(read_all(File::open(&path).unwrap()).is_empty());
        File::create(&path).unwrap().set_len(1 << 20).unwrap();
        assert_eq!(read_all(File::open(&path).unwrap()), vec![0u8; 1 << 20]);
    }

    /// Bytes this thread's read calls returned (`rchar`).
    fn thread_rchar() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
        io.lines()
            .find_map(|l| l.strip_prefix("rchar: "))
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn a_huge_hole_costs_no_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = File::create(&path).unwrap();
        f.set_len(1 << 40).unwrap();
        f.write_at(b"end", (1 << 40) - 3).unwrap();
        // 4 GiB of the 1 TiB hole: no byte of it comes from a read call
        // (the count moves only by the reads of `/proc/thread-self/io`).
        let mut r = SparseReader::new(File::open(&path).unwrap());
        let mut buf = vec![7u8; 1 << 20];
        let before = thread_rchar();
        for _ in 0..(4 << 10) {
            assert_eq!(r.read(&mut buf).unwrap(), buf.len());
        }
        let read = thread_rchar() - before;
        assert!(read < 4096, "{read} bytes read");
        assert!(buf.iter().all(|&b| b == 0));
        // The data at the end is found, and only it is read.
        r.pos = (1 << 40) - 10;
        r.end = 0;
        let mut tail = Vec::new();
        r.read_to_end(&mut tail).unwrap();
        assert_eq!(tail, b"\0\0\0\0\0\0\0end");
        let read = thread_rchar() - before;
        assert!(read < 4096, "{read} bytes read");
    }
}
