//! Store history for the pruning tests: ageing a record by hand.

use std::path::Path;
use std::process::Command;

pub const DAY_MS: u64 = 86_400_000;

/// Moves an ended sandbox's end `days` into the past in the store of
/// `state_dir` (no daemon may be running on it), with Debian's python3 and
/// its sqlite3 module.
pub fn age_end(state_dir: &Path, id: &str, days: u64) {
    let db = state_dir.join("mayfly.db");
    let script = format!(
        "import sqlite3, sys\n\
         c = sqlite3.connect(sys.argv[1])\n\
         n = c.execute('UPDATE sandboxes SET ended_at = ended_at - {} WHERE id = ?', (sys.argv[2],)).rowcount\n\
         c.commit()\n\
         assert n == 1, n\n",
        days * DAY_MS
    );
    let out = Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .arg(&db)
        .arg(id)
        .output()
        .expect("running python3 (apt-get install python3)");
    assert!(
        out.status.success(),
        "ageing {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
