//! What a checkout would hold, measured on the tree before a byte of it is
//! written: a small repository can expand to far more than it stores (one
//! blob named a million times, highly compressible blobs), and a checkout
//! is written on the host by the daemon. A tree past the caps a workspace
//! is uploaded under (the file API's archive caps) is refused up front.

use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt as _, BufReader};

use super::git::{git, WorkspaceError, GIT_TIMEOUT};

/// Sums the sizes of the files of `commit`'s tree in `mirror` (`git
/// ls-tree -r -l`, read as it streams), stopping at the first cap passed.
pub(super) async fn check(
    mirror: &Path,
    commit: &str,
    max_bytes: u64,
    max_entries: u64,
) -> Result<(), WorkspaceError> {
    let mut c = git();
    c.arg("-C")
        .arg(mirror)
        .args([
            "ls-tree",
            "-r",
            "-l",
            "-z",
            "--full-tree",
            "--end-of-options",
        ])
        .arg(commit)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = c.spawn().map_err(|source| WorkspaceError::Host {
        path: "git".into(),
        source,
    })?;
    let out = child.stdout.take().expect("stdout is piped");
    let walk = async {
        let mut records = BufReader::new(out).split(0);
        let (mut entries, mut bytes) = (0u64, 0u64);
        while let Some(rec) =
            records
                .next_segment()
                .await
                .map_err(|source| WorkspaceError::Host {
                    path: "git ls-tree".into(),
                    source,
                })?
        {
            entries += 1;
            bytes = bytes.saturating_add(size_of_record(&rec));
            if entries > max_entries {
                return Err(WorkspaceError::TooLarge {
                    what: format!("more than {max_entries} files"),
                });
            }
            if bytes > max_bytes {
                return Err(WorkspaceError::TooLarge {
                    what: format!("more than {max_bytes} bytes of files"),
                });
            }
        }
        Ok(())
    };
    let walked =
        tokio::time::timeout(GIT_TIMEOUT, walk)
            .await
            .map_err(|_| WorkspaceError::Timeout {
                op: "ls-tree",
                secs: GIT_TIMEOUT.as_secs(),
            })?;
    // Past a cap the child is killed (on drop); else it has ended.
    if walked.is_ok() {
        let status = child.wait().await.map_err(|source| WorkspaceError::Host {
            path: "git ls-tree".into(),
            source,
        })?;
        if !status.success() {
            return Err(WorkspaceError::Git {
                op: "ls-tree",
                detail: format!("exited with {status}"),
            });
        }
    }
    walked
}

/// The size field of one `ls-tree -l` record (`<mode> <type> <object>
/// <size>\t<path>`); `-` (a submodule) and anything unreadable count 0.
fn size_of_record(rec: &[u8]) -> u64 {
    let head = rec.split(|&b| b == b'\t').next().unwrap_or_default();
    std::str::from_utf8(head)
        .ok()
        .and_then(|h| h.split_ascii_whitespace().nth(3))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::size_of_record;

    #[test]
    fn sizes_are_read_from_ls_tree_records() {
        assert_eq!(size_of_record(b"100644 blob 3b18e5 12\tREADME"), 12);
        assert_eq!(size_of_record(b"100644 blob 3b18e5     7\ta\tb"), 7);
        assert_eq!(size_of_record(b"160000 commit 3b18e5       -\tsub"), 0);
        assert_eq!(size_of_record(b"garbage"), 0);
    }
}
