//! Retention of collected artifacts: by age and by total size, oldest
//! sandboxes' artifacts removed first.

use std::time::Duration;

/// The daemon's retention policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// A sandbox's artifacts older than this are removed.
    pub max_age: Duration,
    /// The most bytes all sandboxes' artifacts may hold together.
    pub max_bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_bytes: 10 << 30,
        }
    }
}

/// One sandbox's stored artifacts, as retention sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSet {
    pub sandbox: String,
    /// Unix ms of the collection.
    pub collected_at: u64,
    pub bytes: u64,
}

/// The sandboxes whose artifacts to remove, oldest first: every set older
/// than `max_age` at `now_ms`, then the oldest of the rest until the
/// remaining total fits in `max_bytes`. Ties in age go by sandbox id, so the
/// plan is deterministic.
pub fn plan_retention(sets: &[StoredSet], policy: Retention, now_ms: u64) -> Vec<String> {
    let mut sorted: Vec<&StoredSet> = sets.iter().collect();
    sorted.sort_by(|a, b| (a.collected_at, &a.sandbox).cmp(&(b.collected_at, &b.sandbox)));
    let max_age_ms = u64::try_from(policy.max_age.as_millis()).unwrap_or(u64::MAX);
    let mut total: u64 = sorted.iter().map(|s| s.bytes).sum();
    let mut doomed = Vec::new();
    for s in sorted {
        let too_old = now_ms.saturating_sub(s.collected_at) > max_age_ms;
        if too_old || total > policy.max_bytes {
            total -= s.bytes;
            doomed.push(s.sandbox.clone());
        }
    }
    doomed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(id: &str, at: u64, bytes: u64) -> StoredSet {
        StoredSet {
            sandbox: id.into(),
            collected_at: at,
            bytes,
        }
    }

    const DAY: u64 = 24 * 3600 * 1000;

    fn policy(days: u64, max_bytes: u64) -> Retention {
        Retention {
            max_age: Duration::from_millis(days * DAY),
            max_bytes,
        }
    }

    #[test]
    fn nothing_goes_when_all_fit_and_are_young() {
        let sets = [set("a", 10 * DAY, 5), set("b", 11 * DAY, 5)];
        assert!(plan_retention(&sets, policy(7, 100), 12 * DAY).is_empty());
    }

    #[test]
    fn sets_older_than_max_age_go_whatever_their_size() {
        let sets = [
            set("old", DAY, 1),
            set("new", 9 * DAY, 1),
            set("mid", 2 * DAY, 1),
        ];
        assert_eq!(
            plan_retention(&sets, policy(7, 100), 10 * DAY),
            vec!["old", "mid"]
        );
    }

    #[test]
    fn oldest_go_first_until_the_total_fits() {
        let sets = [
            set("c", 3, 40),
            set("a", 1, 40),
            set("b", 2, 40),
            set("d", 4, 10),
        ];
        // 130 bytes; at most 60: a (90 left), b (50 left) go.
        assert_eq!(plan_retention(&sets, policy(7, 60), 5), vec!["a", "b"]);
    }

    #[test]
    fn one_set_over_the_cap_alone_goes_too() {
        let sets = [set("huge", 5, 1000)];
        assert_eq!(plan_retention(&sets, policy(7, 10), 6), vec!["huge"]);
    }

    #[test]
    fn ties_in_age_go_by_id() {
        let sets = [set("b", 1, 10), set("a", 1, 10)];
        assert_eq!(plan_retention(&sets, policy(7, 10), 2), vec!["a"]);
    }

    #[test]
    fn a_zero_age_removes_everything_older_than_now() {
        let sets = [set("a", 1, 1), set("b", 2, 1)];
        assert_eq!(plan_retention(&sets, policy(0, 100), 2), vec!["a"]);
    }
}
