//! What an earlier run left: this daemon's links, the links of daemons
//! that are dead, and the tables of daemons gone for good.
//!
//! This daemon's own table is *not* removed here: the ruleset that follows
//! replaces it in one transaction (add, delete, add), so a link that is
//! still up, of a sandbox that outlived the old daemon for a moment, is
//! never left unfiltered in between.

use std::path::Path;

use super::plan::{self, Names};
use super::EgressError;

/// The kernel objects reconciliation reads and removes.
pub(crate) trait NetHost {
    /// Links whose names start with `prefix`.
    fn links(&self, prefix: &str) -> Result<Vec<String>, EgressError>;
    fn delete_link(&self, name: &str) -> Result<(), EgressError>;
    /// `inet` tables whose names start with `prefix`.
    fn tables(&self, prefix: &str) -> Result<Vec<String>, EgressError>;
    fn delete_table(&self, name: &str) -> Result<(), EgressError>;
}

/// The host's links (rtnetlink) and tables (`nft`).
pub(crate) struct System;

impl NetHost for System {
    fn links(&self, prefix: &str) -> Result<Vec<String>, EgressError> {
        Ok(mayfly_sys::veth::list_links(prefix)?)
    }
    fn delete_link(&self, name: &str) -> Result<(), EgressError> {
        Ok(mayfly_sys::veth::delete_link(name)?)
    }
    fn tables(&self, prefix: &str) -> Result<Vec<String>, EgressError> {
        Ok(mayfly_sys::nft::inet_tables(prefix)?)
    }
    fn delete_table(&self, name: &str) -> Result<(), EgressError> {
        Ok(mayfly_sys::nft::delete_inet_table(name)?)
    }
}

/// Removes the links an earlier run of this daemon left, and those of any
/// daemon whose slot lease nobody holds any more; then the tables of
/// daemons gone for good.
pub(crate) fn reconcile(
    host: &dyn NetHost,
    names: &Names,
    lease_dir: &Path,
) -> Result<(), EgressError> {
    for link in host.links("mf-")? {
        let Some(slot) = link.rsplit('-').next().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let ours = names.slot_of(&link).is_some();
        // A link of another live daemon has its slot leased; leave it.
        let lease = super::netpool::try_lease(lease_dir, slot).ok().flatten();
        if ours || lease.is_some() {
            tracing::info!(%link, "removing a network link left by a dead daemon");
            host.delete_link(&link)?;
        }
    }
    sweep_foreign_tables(host, names, lease_dir)
}

/// Takes this daemon's table lease (`<lease dir>/table-<tag>`, `flock`ed
/// for the daemon's life). Another daemon's sweep holds it for a moment
/// while it looks, so a busy lease is retried for two seconds before the
/// answer is that a daemon of this tag is running.
pub(crate) fn lease_table(names: &Names, lease_dir: &Path) -> Result<std::fs::File, EgressError> {
    let path = lease_dir.join(names.table_lease());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        if let Some(f) = lock(&path)? {
            return Ok(f);
        }
        if std::time::Instant::now() >= deadline {
            return Err(EgressError::Unavailable(format!(
                "{} is held by another daemon: one with this state directory (or one whose \
                 state directory has the same tag, {}) is running",
                path.display(),
                names.tag
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn lock(path: &Path) -> Result<Option<std::fs::File>, EgressError> {
    mayfly_sys::process::try_lock_file(path).map_err(|e| EgressError::Io {
        op: "locking a table lease",
        source: std::io::Error::other(e.to_string()),
    })
}

/// Removes the tables of daemons that are gone for good (killed, and their
/// state directory deleted or never served again), which nobody else would
/// ever remove: a table whose lease file exists, nobody holds, and none of
/// whose links is left. A table without a lease file has an owner this
/// daemon cannot judge, and is left alone.
fn sweep_foreign_tables(
    host: &dyn NetHost,
    names: &Names,
    lease_dir: &Path,
) -> Result<(), EgressError> {
    let tables = host.tables("mayfly-")?;
    let links = host.links("mf-")?;
    for other in plan::foreign_tables(names, &tables, &links) {
        let path = lease_dir.join(other.table_lease());
        if !path.exists() {
            continue;
        }
        // Held while the table goes, so its daemon cannot start meanwhile.
        let Some(_gone) = lock(&path)? else {
            continue;
        };
        tracing::info!(table = %other.table(), "removing the table of a daemon that is gone");
        host.delete_table(&other.table())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A host of fixed links and tables that records what is removed.
    struct Fake {
        links: RefCell<Vec<String>>,
        tables: RefCell<Vec<String>>,
        removed: RefCell<Vec<String>>,
    }

    impl NetHost for Fake {
        fn links(&self, prefix: &str) -> Result<Vec<String>, EgressError> {
            let all = self.links.borrow();
            Ok(all
                .iter()
                .filter(|l| l.starts_with(prefix))
                .cloned()
                .collect())
        }
        fn delete_link(&self, name: &str) -> Result<(), EgressError> {
            self.links.borrow_mut().retain(|l| l != name);
            self.removed.borrow_mut().push(format!("link {name}"));
            Ok(())
        }
        fn tables(&self, prefix: &str) -> Result<Vec<String>, EgressError> {
            let all = self.tables.borrow();
            Ok(all
                .iter()
                .filter(|t| t.starts_with(prefix))
                .cloned()
                .collect())
        }
        fn delete_table(&self, name: &str) -> Result<(), EgressError> {
            self.tables.borrow_mut().retain(|t| t != name);
            self.removed.borrow_mut().push(format!("table {name}"));
            Ok(())
        }
    }

    fn strings(v: &[&str]) -> RefCell<Vec<String>> {
        RefCell::new(v.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn a_restart_removes_leftovers_but_never_leaves_its_links_unfiltered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ours = Names { tag: "ab12".into() };
        // A live daemon holds slot 7's lease; a dead one held slot 9's and
        // its tag's table lease is free, with no link left once slot 9's goes.
        let _live = super::super::netpool::try_lease(dir.path(), 7)
            .expect("lease")
            .expect("free");
        std::fs::write(dir.path().join("table-dead"), "").expect("lease file");
        let host = Fake {
            links: strings(&["mf-ab12-3", "mf-c0de-7", "mf-dead-9", "eth0"]),
            tables: strings(&["mayfly-ab12", "mayfly-c0de", "mayfly-dead"]),
            removed: RefCell::new(Vec::new()),
        };
        reconcile(&host, &ours, dir.path()).expect("reconcile");
        assert_eq!(
            *host.removed.borrow(),
            ["link mf-ab12-3", "link mf-dead-9", "table mayfly-dead"],
            "this daemon's own table is replaced by the ruleset, never removed first"
        );
    }
}
