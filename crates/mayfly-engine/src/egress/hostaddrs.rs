//! The host's own addresses, which no sandbox may reach: read at most once
//! a second, and failing closed.
//!
//! A list that cannot be read must never look like "the host has no
//! address": the policy would then let a sandbox reach the host's own
//! services on any of them. So a failed read keeps the last good list, and
//! before any read has succeeded there is no list at all, and the proxy
//! refuses every connection ([`HostAddrs::get`] is `None`).

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mayfly_sys::veth::VethError;

/// How long the host's address list is trusted before it is read again.
pub const HOST_ADDRS_TTL: Duration = Duration::from_secs(1);

/// Reads the host's addresses (`mayfly_sys::veth::host_addresses`, or a
/// test's stand-in).
pub type ReadAddrs = Box<dyn Fn() -> Result<Vec<IpAddr>, VethError> + Send + Sync>;

/// The cached list and where it came from.
pub struct HostAddrs {
    read: ReadAddrs,
    ttl: Duration,
    cache: Mutex<Cache>,
}

struct Cache {
    /// When the list was last read (or a read was last tried).
    tried: Option<Instant>,
    /// The last list read successfully.
    good: Option<Arc<Vec<IpAddr>>>,
}

impl HostAddrs {
    pub fn new(read: ReadAddrs, ttl: Duration) -> HostAddrs {
        HostAddrs {
            read,
            ttl,
            cache: Mutex::new(Cache {
                tried: None,
                good: None,
            }),
        }
    }

    /// The host's interfaces, read with `getifaddrs`.
    pub fn system() -> HostAddrs {
        HostAddrs::new(Box::new(mayfly_sys::veth::host_addresses), HOST_ADDRS_TTL)
    }

    /// The host's addresses: read again when the last read is older than
    /// the TTL; the last good list when that read fails; `None` when no
    /// read ever succeeded (then nothing may be admitted).
    pub fn get(&self) -> Option<Arc<Vec<IpAddr>>> {
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if c.tried.is_none_or(|at| at.elapsed() > self.ttl) {
            c.tried = Some(Instant::now());
            match (self.read)() {
                Ok(list) => c.good = Some(Arc::new(list)),
                Err(e) => tracing::warn!(
                    error = %e,
                    kept = c.good.is_some(),
                    "egress: reading the host's addresses failed; the last good list is kept \
                     (with none, every sandbox connection is refused)"
                ),
            }
        }
        c.good.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn failing() -> VethError {
        VethError::Thread("getifaddrs".into())
    }

    #[test]
    fn no_list_is_known_until_a_read_succeeds() {
        let addrs = HostAddrs::new(Box::new(|| Err(failing())), Duration::ZERO);
        assert_eq!(addrs.get(), None);
        assert_eq!(addrs.get(), None, "a failed read is never an empty list");
    }

    #[test]
    fn a_failed_read_keeps_the_last_good_list() {
        let fail = Arc::new(AtomicBool::new(false));
        let f = fail.clone();
        let one: IpAddr = "10.0.0.5".parse().unwrap();
        let addrs = HostAddrs::new(
            Box::new(move || {
                if f.load(Ordering::SeqCst) {
                    Err(failing())
                } else {
                    Ok(vec![one])
                }
            }),
            Duration::ZERO,
        );
        assert_eq!(addrs.get().as_deref(), Some(&vec![one]));
        fail.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(addrs.get().as_deref(), Some(&vec![one]));
    }
}
