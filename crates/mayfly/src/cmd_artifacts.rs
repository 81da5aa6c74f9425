//! `mayfly artifacts ls ID` and `mayfly artifacts get ID NAME [-o FILE]`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use mayfly_types::ArtifactStatus;

use crate::cli::Cli;
use crate::cmd_sandbox::{client, parse_id};
use crate::output;

#[derive(Debug, Subcommand)]
pub enum ArtifactsCmd {
    /// List a sandbox's collected artifacts.
    Ls { id: String },
    /// Write one artifact to a file (or to stdout).
    Get {
        id: String,
        name: String,
        /// Where to write it; stdout when absent.
        #[arg(long, short = 'o')]
        output: Option<PathBuf>,
    },
}

pub async fn artifacts(cli: &Cli, c: &ArtifactsCmd) -> anyhow::Result<i32> {
    match c {
        ArtifactsCmd::Ls { id } => {
            let list = client(cli)?
                .list_artifacts(&parse_id(id)?)
                .await
                .context("listing artifacts")?;
            if cli.json {
                output::json(&list)?;
                return Ok(0);
            }
            println!(
                "{:<24} {:<6} {:<9} {:>12} {:<64} PATH",
                "NAME", "KIND", "STATUS", "SIZE", "SHA256"
            );
            for a in &list.artifacts {
                let status = match a.status {
                    ArtifactStatus::Complete => "complete",
                    ArtifactStatus::Skipped => "skipped",
                };
                println!(
                    "{:<24} {:<6} {:<9} {:>12} {:<64} {}",
                    a.name, a.kind, status, a.size, a.sha256, a.path
                );
                if let Some(r) = &a.reason {
                    println!("  reason: {r}");
                }
            }
            if let Some(ws) = &list.workspace {
                println!(
                    "workspace: start {} head {} branch {}",
                    ws.start_commit,
                    ws.head,
                    ws.branch.as_deref().unwrap_or("-")
                );
            }
            Ok(0)
        }
        ArtifactsCmd::Get { id, name, output } => {
            let data = client(cli)?
                .get_artifact(&parse_id(id)?, name)
                .await
                .with_context(|| format!("downloading artifact `{name}`"))?;
            match output {
                Some(path) => std::fs::write(path, &data)
                    .with_context(|| format!("writing {}", path.display()))?,
                None => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&data)?;
                    out.flush()?;
                }
            }
            Ok(0)
        }
    }
}
