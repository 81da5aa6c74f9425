//! `mayfly cp`: copy files and directories between the host and a sandbox.
//! `ID:PATH` names the sandbox side; directories travel as tar archives.

use std::path::Path;

use anyhow::Context;
use mayfly_types::{FileKind, SandboxId};

use crate::cli::{Cli, CpArgs};
use crate::output;

/// Splits `mf-xxxxxxxxxxxx:/path` into the id and the path.
fn remote(s: &str) -> Option<(SandboxId, String)> {
    let (id, path) = s.split_once(':')?;
    let id = id.parse().ok()?;
    Some((id, path.to_owned()))
}

pub async fn cp(cli: &Cli, a: &CpArgs) -> anyhow::Result<i32> {
    let c = cli.client()?;
    let summary = match (remote(&a.src), remote(&a.dst)) {
        (None, Some((id, dst))) => {
            let src = Path::new(&a.src);
            let meta = std::fs::symlink_metadata(src)
                .with_context(|| format!("reading {}", src.display()))?;
            if meta.is_dir() {
                // Pack the directory as DST itself (like `cp -r src dst` into a new name).
                let mut b = tar::Builder::new(Vec::new());
                b.follow_symlinks(false);
                b.append_dir_all(".", src)
                    .with_context(|| format!("packing {}", src.display()))?;
                let tarball = b.into_inner()?;
                let _ = c
                    .mkdir(
                        &id,
                        &mayfly_types::MkdirRequest {
                            path: dst.clone(),
                            parents: true,
                            mode: None,
                        },
                    )
                    .await;
                let s = c.upload_tar(&id, &dst, tarball).await?;
                serde_json::to_value(s)?
            } else {
                let data =
                    std::fs::read(src).with_context(|| format!("reading {}", src.display()))?;
                let dst = file_target(&c, &id, &dst, src).await?;
                let st = c.write_file(&id, &dst, data, None).await?;
                serde_json::to_value(st)?
            }
        }
        (Some((id, src)), None) => {
            let dst = Path::new(&a.dst);
            let st = c.stat(&id, &src).await?;
            if st.kind == FileKind::Dir {
                let tarball = c.download_tar(&id, &src).await?;
                unpack_dir(&tarball, dst)?;
                serde_json::json!({"dir": dst})
            } else {
                let data = c.read_file(&id, &src).await?;
                let target = if dst.is_dir() {
                    dst.join(Path::new(&src).file_name().unwrap_or_default())
                } else {
                    dst.to_path_buf()
                };
                std::fs::write(&target, &data)
                    .with_context(|| format!("writing {}", target.display()))?;
                serde_json::json!({"file": target, "bytes": data.len()})
            }
        }
        _ => anyhow::bail!("exactly one of SRC and DST must name a sandbox, as ID:PATH"),
    };
    if cli.json {
        output::json(&summary)?;
    }
    Ok(0)
}

/// Where a host file lands in the sandbox, as `docker cp` places it: into
/// `dst/<name>` when `dst` is an existing directory; at `dst` otherwise,
/// unless `dst` ends in `/` and no such directory exists.
async fn file_target(
    c: &mayfly_client::Client,
    id: &SandboxId,
    dst: &str,
    src: &Path,
) -> anyhow::Result<String> {
    let name = src
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no usable file name", src.display()))?;
    match c.stat(id, dst).await {
        Ok(st) if st.kind == FileKind::Dir => Ok(format!("{}/{name}", dst.trim_end_matches('/'))),
        Err(e) if dst.ends_with('/') && e.code() == Some(mayfly_types::ErrorCode::NotFound) => {
            anyhow::bail!("{id}:{dst}: no such directory")
        }
        _ => Ok(dst.to_owned()),
    }
}

/// Unpacks a downloaded directory like `docker cp`: into `dst/<name>` when
/// `dst` is an existing directory, else as `dst` itself. The archive's
/// entries all start with the directory's name.
fn unpack_dir(tarball: &[u8], dst: &Path) -> anyhow::Result<()> {
    let (parent, rename_to) = if dst.is_dir() {
        (dst.to_path_buf(), None)
    } else {
        let parent = match dst.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => Path::new(".").to_path_buf(),
        };
        (parent, Some(dst.to_path_buf()))
    };
    let staging = tempfile::Builder::new()
        .prefix(".mayfly-cp-")
        .tempdir_in(&parent)
        .with_context(|| format!("creating a staging directory in {}", parent.display()))?;
    let mut ar = tar::Archive::new(std::io::Cursor::new(tarball));
    ar.set_preserve_permissions(false);
    ar.set_unpack_xattrs(false);
    // tar's unpack refuses entries that would land outside the staging dir.
    ar.unpack(staging.path())
        .with_context(|| format!("unpacking into {}", staging.path().display()))?;
    let mut top = std::fs::read_dir(staging.path())?;
    let first = top
        .next()
        .transpose()?
        .ok_or_else(|| anyhow::anyhow!("the sandbox sent an empty archive"))?;
    if top.next().is_some() {
        anyhow::bail!("the sandbox's archive has more than one top-level entry");
    }
    let target = rename_to.unwrap_or_else(|| dst.join(first.file_name()));
    std::fs::rename(first.path(), &target)
        .with_context(|| format!("moving the copy to {}", target.display()))?;
    Ok(())
}
