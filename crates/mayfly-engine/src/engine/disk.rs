//! Disk limits: what a sandbox's writable layers (`<dir>/upper*`) may hold.
//!
//! The layers live on the state (or scratch) filesystem, with no quota the
//! kernel could enforce per sandbox on an ordinary ext4 host, so the
//! engine enforces `limits.disk_bytes` itself, the way kubelet enforces
//! ephemeral storage: by measuring. Measuring every sandbox every second
//! would cost a tree walk each, so each sandbox keeps an upper *bound* of
//! what it holds: its last measure plus everything the filesystem grew by
//! since (from `statvfs`, one syscall a second for the whole host). Only a
//! sandbox whose bound passes its limit is walked; past the limit (or past
//! [`MAX_ENTRIES`] files, so that inodes are bounded too) it is destroyed
//! with reason `disk`, after an event `disk_limit` says what was found.
//! Every minute every sandbox is measured anyway. A sandbox can overshoot
//! by what it writes in about a second.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mayfly_sys::du::WalkLimits;

use super::sandbox::Sandbox;
use super::Engine;

/// How often the bounds are brought up to date.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The most files a sandbox's writable layers may hold.
pub const MAX_ENTRIES: u64 = 1_000_000;

/// The walk that measures one sandbox: past [`MAX_ENTRIES`] it stops, and
/// that alone is over the limit. One slow to finish is a lower bound.
fn walk_limits() -> WalkLimits {
    WalkLimits {
        max_entries: MAX_ENTRIES + 1,
        max_depth: 4096,
        max_time: Duration::from_secs(10),
    }
}

/// Every this many ticks, every sandbox is measured whatever its bound
/// says: a bound misses what one sandbox wrote while another deleted as
/// much in the same tick, when what was deleted was never counted (it was
/// there before this daemon started).
const MEASURE_ALL_EVERY: u64 = 60;

/// The watcher's memory between ticks.
#[derive(Debug, Default)]
pub(crate) struct DiskWatch {
    /// The filesystem's used bytes at the last tick.
    used: Option<u64>,
    ticks: u64,
}

impl Engine {
    /// One tick: adds what the filesystem grew by to every sandbox's
    /// bound, then measures those whose bound passed their limit.
    pub(crate) async fn check_disk(&self, watch: &mut DiskWatch) {
        let root = self.inner.cfg.sandboxes_dir();
        let used = match mayfly_sys::du::filesystem_used(&root) {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "statvfs of the sandboxes' filesystem failed");
                return;
            }
        };
        // The first tick knows no growth: every bound starts at 0 and each
        // sandbox is measured once its bound passes its limit.
        let grew = watch.used.map_or(0, |before| used.saturating_sub(before));
        watch.used = Some(used);
        watch.ticks += 1;
        let all = watch.ticks.is_multiple_of(MEASURE_ALL_EVERY);
        for sb in self.live() {
            if sb.is_destroying() || sb.is_stopping() {
                continue;
            }
            let bound = sb.disk_bound.fetch_add(grew, Ordering::Relaxed) + grew;
            if all || bound > sb.disk_limit.load(Ordering::Relaxed) {
                self.measure_disk(sb).await;
            }
        }
    }

    /// Walks `sb`'s writable layers: destroys it if they hold more than
    /// its limit (or more than [`MAX_ENTRIES`] files), else makes the
    /// measure its new bound.
    async fn measure_disk(&self, sb: Arc<Sandbox>) {
        let dir = sb.dir.clone();
        let usage =
            tokio::task::spawn_blocking(move || super::usage::uppers_usage(&dir, &walk_limits()))
                .await;
        let Ok(usage) = usage else { return };
        let limit = sb.disk_limit.load(Ordering::Relaxed);
        let too_many = usage.entries > MAX_ENTRIES;
        if usage.bytes > limit || too_many {
            let detail = serde_json::json!({
                "bytes": usage.bytes,
                "entries": usage.entries,
                "limit_bytes": limit,
                "limit_entries": MAX_ENTRIES,
            });
            if let Err(e) = self
                .inner
                .store
                .add_event(Some(&sb.id), "disk_limit", &detail)
            {
                tracing::warn!(id = %sb.id, error = %e, "recording a disk limit failed");
            }
            tracing::info!(id = %sb.id, bytes = usage.bytes, entries = usage.entries, limit, "past its disk limit");
            self.destroy_in_background(sb, "disk");
        } else if !usage.truncated {
            sb.disk_bound.store(usage.bytes, Ordering::Relaxed);
        }
    }
}
