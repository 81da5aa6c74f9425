//! The daemon's budget for file contents it holds in memory: a file read
//! (`GET …/files`, up to 1 GiB) or a tar download (`GET …/archive`) is
//! built whole before it is answered. Code in a sandbox can make a 1 GiB
//! file cost nothing on disk (`truncate -s 1G`), so without a budget a few
//! concurrent reads would hold gigabytes of the host-root daemon's memory.
//! Every such buffer reserves its bytes here (a read: the file's size, then
//! what it grew by; a tar: as it grows, in 1 MiB steps),
//! and gives them back when its answer has been sent (the reservation is
//! the owner of the answer's [`Bytes`]); past the budget a request is
//! refused (503, retry later), never queued behind a slow reader. The
//! output a command collects is charged here too ([`Charge`]); past the
//! budget it is counted, not kept.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One permit is this many bytes.
const UNIT: u64 = 1 << 20;

/// Bytes the daemon holds for file answers by default: two of the largest
/// files at once.
pub const DEFAULT_FILE_BUFFER_BYTES: u64 = 2 * mayfly_types::MAX_FILE_BYTES;

/// The budget (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct FileBuffers {
    units: Arc<Semaphore>,
    total: u64,
}

impl FileBuffers {
    pub(crate) fn new(bytes: u64) -> Self {
        let units = bytes.div_ceil(UNIT).min(Semaphore::MAX_PERMITS as u64);
        FileBuffers {
            units: Arc::new(Semaphore::new(units as usize)),
            total: units * UNIT,
        }
    }

    /// An empty buffer charged to this budget.
    pub(crate) fn buffer(&self) -> Buffer {
        Buffer {
            data: Vec::new(),
            charge: self.charge(),
            refused: Arc::new(AtomicBool::new(false)),
        }
    }

    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// A charge for bytes kept elsewhere (a command's collected output).
    pub(crate) fn charge(&self) -> Charge {
        Charge {
            held: None,
            held_bytes: 0,
            budget: self.clone(),
        }
    }
}

/// Bytes a caller keeps in its own buffer, reserved from a [`FileBuffers`]
/// while the charge lives.
#[derive(Debug)]
pub(crate) struct Charge {
    held: Option<OwnedSemaphorePermit>,
    held_bytes: u64,
    budget: FileBuffers,
}

impl Charge {
    /// Reserves enough for `bytes` in all; false (reserving nothing more)
    /// past the budget.
    pub(crate) fn cover(&mut self, bytes: u64) -> bool {
        if bytes <= self.held_bytes {
            return true;
        }
        let units = (bytes - self.held_bytes).div_ceil(UNIT);
        let permit = u32::try_from(units)
            .ok()
            .and_then(|n| self.budget.units.clone().try_acquire_many_owned(n).ok());
        let Some(permit) = permit else {
            return false;
        };
        match &mut self.held {
            Some(held) => held.merge(permit),
            None => self.held = Some(permit),
        }
        self.held_bytes += units * UNIT;
        true
    }
}

/// A growing buffer whose bytes are reserved from a [`FileBuffers`].
#[derive(Debug)]
pub(crate) struct Buffer {
    data: Vec<u8>,
    charge: Charge,
    refused: Arc<AtomicBool>,
}

impl Buffer {
    /// Set once a write was refused for want of budget; a copy the caller
    /// keeps, as the buffer itself may be lost with the error.
    pub(crate) fn refused_flag(&self) -> Arc<AtomicBool> {
        self.refused.clone()
    }

    /// The contents, still holding their reservation until dropped.
    pub(crate) fn into_bytes(self) -> Bytes {
        let Buffer { data, charge, .. } = self;
        Bytes::from_owner(Held {
            data,
            _held: charge,
        })
    }

    /// Reads `r` to its end straight into the buffer (one copy, where
    /// `io::copy` through `Write` makes two), reserving `size` (what the
    /// file held when opened) first, then whatever it grew by.
    pub(crate) fn fill_from(&mut self, r: &mut dyn io::Read, size: u64) -> io::Result<u64> {
        use io::Read as _;
        self.reserve(usize::try_from(size).unwrap_or(usize::MAX))?;
        self.data.reserve(usize::try_from(size).unwrap_or(0));
        let mut total = <&mut dyn io::Read as io::Read>::take(&mut *r, size)
            .read_to_end(&mut self.data)? as u64;
        // Past its size the file grew: read on, a chunk at a time, each
        // reserved before it is kept.
        let mut chunk = [0u8; 8192];
        loop {
            let n = match r.read(&mut chunk) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(total);
            }
            io::Write::write_all(self, &chunk[..n])?;
            total += n as u64;
        }
    }

    fn reserve(&mut self, more: usize) -> io::Result<()> {
        if self.charge.cover((self.data.len() + more) as u64) {
            return Ok(());
        }
        self.refused.store(true, Ordering::Relaxed);
        Err(io::Error::other("over the daemon's file buffer budget"))
    }
}

impl io::Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.reserve(buf.len())?;
        self.data.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What a [`Bytes`] from [`Buffer::into_bytes`] owns.
struct Held {
    data: Vec<u8>,
    _held: Charge,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_buffer_holds_its_bytes_until_its_answer_is_dropped() {
        let budget = FileBuffers::new(3 * UNIT);
        let mut a = budget.buffer();
        a.write_all(&vec![1u8; 2 * UNIT as usize]).unwrap();
        // Only one unit is left: a second buffer of two is refused.
        let mut b = budget.buffer();
        let flag = b.refused_flag();
        assert!(b.write_all(&vec![2u8; 2 * UNIT as usize]).is_err());
        assert!(flag.load(Ordering::Relaxed));
        let bytes = a.into_bytes();
        assert_eq!(bytes.len(), 2 * UNIT as usize);
        assert!(bytes.iter().all(|&x| x == 1));
        assert_eq!(budget.units.available_permits(), 1, "held by the answer");
        drop(bytes);
        assert_eq!(budget.units.available_permits(), 3);
        let mut c = budget.buffer();
        c.write_all(&vec![3u8; 3 * UNIT as usize]).unwrap();
        assert!(!c.refused_flag().load(Ordering::Relaxed));
    }

    #[test]
    fn a_fill_reserves_the_files_size_and_what_it_grew_by() {
        let budget = FileBuffers::new(3 * UNIT);
        let mut a = budget.buffer();
        let data = vec![7u8; 2 * UNIT as usize];
        let n = a.fill_from(&mut &data[..], 2 * UNIT).unwrap();
        assert_eq!(n, 2 * UNIT);
        assert_eq!(budget.units.available_permits(), 1, "no unit for the end");
        // A file that grew past its size at the open is reserved as read.
        let mut b = budget.buffer();
        let grown = vec![1u8; UNIT as usize + 1];
        assert!(b.fill_from(&mut &grown[..], 10).is_err(), "past the budget");
        assert!(b.refused_flag().load(Ordering::Relaxed));
        drop(a);
        drop(b);
        let mut c = budget.buffer();
        assert_eq!(c.fill_from(&mut &grown[..], 10).unwrap(), UNIT + 1);
        assert_eq!(c.into_bytes().len(), UNIT as usize + 1);
    }

    #[test]
    fn small_writes_reserve_in_whole_units() {
        let budget = FileBuffers::new(UNIT);
        let mut a = budget.buffer();
        for _ in 0..1024 {
            a.write_all(&[0u8; 1024]).unwrap();
        }
        assert!(a.write_all(&[0u8]).is_err(), "one byte past the budget");
        assert_eq!(budget.total(), UNIT);
    }
}
