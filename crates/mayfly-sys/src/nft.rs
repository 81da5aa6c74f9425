//! The `nft` command: applies nftables JSON documents as one transaction.
//!
//! `nft -j -f -` reads a whole document and commits it atomically (all of
//! it or none). The ruleset itself is planned elsewhere, as data.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// An `nft` invocation that failed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("the `nft` command was not found on PATH; egress policies need it (Debian/Ubuntu: `apt-get install nftables`)")]
    Missing,
    #[error("running `nft {args}`")]
    Spawn {
        args: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`nft {args}` failed: {stderr}")]
    Failed { args: String, stderr: String },
}

/// Where `nft` is, or why egress cannot work without it.
pub fn find() -> Result<PathBuf, NftError> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join("nft"))
        .find(|p| p.is_file())
        .ok_or(NftError::Missing)
}

fn run(args: &[&str], input: Option<&str>) -> Result<String, NftError> {
    let nft = find()?;
    let shown = args.join(" ");
    let spawn = |source| NftError::Spawn {
        args: shown.clone(),
        source,
    };
    let mut child = Command::new(nft)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(text.as_bytes()).map_err(spawn)?;
    }
    let out = child.wait_with_output().map_err(spawn)?;
    if !out.status.success() {
        return Err(NftError::Failed {
            args: shown,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Applies a JSON document (`{"nftables": [...]}`) in one transaction.
pub fn apply_json(document: &str) -> Result<(), NftError> {
    run(&["-j", "-f", "-"], Some(document)).map(drop)
}

/// The names of the `inet` tables that start with `prefix`.
pub fn inet_tables(prefix: &str) -> Result<Vec<String>, NftError> {
    let out = run(&["-j", "list", "tables", "inet"], None)?;
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    let names = doc["nftables"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i["table"]["name"].as_str())
                .filter(|n| n.starts_with(prefix))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    Ok(names)
}

/// Deletes the `inet` table `name`; a missing one is not an error.
pub fn delete_inet_table(name: &str) -> Result<(), NftError> {
    match run(&["delete", "table", "inet", name], None) {
        Err(NftError::Failed { stderr, .. }) if stderr.contains("No such file") => Ok(()),
        r => r.map(drop),
    }
}
