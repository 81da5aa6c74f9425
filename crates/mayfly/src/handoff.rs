//! The CLI's hand-off to `mayflyd`: `execve` in place (same pid, same
//! arguments, same streams), so a supervisor, a shell's `$!` or a test that
//! signals `mayfly serve` reaches the daemon itself.

use std::io::{Seek, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context;

/// The daemon binary's name; it is looked for next to this one.
pub const DAEMON_BIN: &str = "mayflyd";

/// Replaces this process with `mayflyd` (at `path`) and this command line. `stdin`:
/// what this process already read of its stdin (an interactive run that a
/// parked sandbox did not take), given to `mayflyd` as its stdin instead.
/// Returns only on failure.
pub fn exec(path: &Path, stdin: Option<&[u8]>) -> anyhow::Result<i32> {
    let mut cmd = Command::new(path);
    cmd.args(std::env::args_os().skip(1));
    if let Some(bytes) = stdin {
        let mut f = tempfile::tempfile().context("keeping the command's stdin for mayflyd")?;
        f.write_all(bytes)
            .and_then(|()| f.rewind())
            .context("keeping the command's stdin for mayflyd")?;
        cmd.stdin(Stdio::from(f));
    }
    let err = cmd.exec();
    Err(err).with_context(|| format!("starting {}", path.display()))
}

/// `mayflyd`, next to this binary.
pub fn daemon_path() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let path = exe.with_file_name(DAEMON_BIN);
    anyhow::ensure!(
        path.is_file(),
        "this command needs {DAEMON_BIN}, which is not next to {} (both are built by \
         `cargo build --release -p mayfly`; install them side by side)",
        exe.display()
    );
    Ok(path)
}
