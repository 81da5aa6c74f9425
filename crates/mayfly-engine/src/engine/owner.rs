//! Who owns a sandbox, a stub or a cleanup: a process, named by its pid and
//! its start time, so a recycled pid is never mistaken for a live owner.
//!
//! Several Mayfly instances share a state directory (a daemon and any number
//! of daemonless `mayfly run`s, and the reapers those leave behind). Each
//! one's start-up recovery removes only what a *dead* owner left.

/// A process that owns Mayfly objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner {
    pub pid: u32,
    pub start: u64,
}

impl Owner {
    /// This process.
    pub fn current() -> Owner {
        let pid = std::process::id();
        Owner {
            pid,
            start: mayfly_sys::process::start_time(pid).unwrap_or(0),
        }
    }

    /// Another live process; None once it has exited.
    pub fn of(pid: u32) -> Option<Owner> {
        mayfly_sys::process::start_time(pid).map(|start| Owner { pid, start })
    }

    /// Whether the process still runs (a zombie does not count).
    pub fn is_alive(&self) -> bool {
        mayfly_sys::process::start_time(self.pid) == Some(self.start)
    }

    /// The text of a stub marker naming this owner.
    pub fn marker(&self) -> String {
        format!("{} {}\n", self.pid, self.start)
    }

    /// The owner a stub marker names; None for anything malformed (a marker
    /// cut short by a crash), which recovery treats as a dead owner's.
    pub fn parse_marker(text: &str) -> Option<Owner> {
        let mut parts = text.split_ascii_whitespace();
        let pid = parts.next()?.parse().ok()?;
        let start = parts.next()?.parse().ok()?;
        parts.next().is_none().then_some(Owner { pid, start })
    }
}

/// Writes a stub marker whole: under a temporary name (`.<id>`), then
/// renamed, so a recovery running meanwhile never reads it empty and takes
/// it for a dead owner's.
pub(crate) fn write_marker(marker: &std::path::Path, text: &str) -> std::io::Result<()> {
    let name = marker.file_name().unwrap_or_default().to_string_lossy();
    let temp = marker.with_file_name(format!(".{name}"));
    std::fs::write(&temp, text).and_then(|()| std::fs::rename(&temp, marker))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_round_trip_and_reject_garbage() {
        let o = Owner {
            pid: 42,
            start: 123_456,
        };
        assert_eq!(Owner::parse_marker(&o.marker()), Some(o));
        for bad in ["", "42", "42 x", "x 1", "1 2 3", "-1 5"] {
            assert_eq!(Owner::parse_marker(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn this_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = Owner::current();
        assert!(me.is_alive());
        let impostor = Owner {
            start: me.start + 1,
            ..me
        };
        assert!(!impostor.is_alive());
    }
}
