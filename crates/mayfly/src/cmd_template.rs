//! `mayfly template build|ls|inspect|rm`.

use std::collections::HashMap;
use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use mayfly_client::BuildEvent;
use mayfly_types::{BuildProgress, BuildRequest, RegistryAuth, TemplateInfo};

use crate::cli::Cli;
use crate::output;

#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// Build (or rebuild) a template from its YAML file; unchanged steps
    /// come from the cache.
    Build(BuildArgs),
    /// List the built templates.
    Ls,
    /// Show a built template: layers, config, size, spec.
    Inspect { name: String },
    /// Remove a template (and the layers nothing else uses).
    Rm { name: String },
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The template file (YAML).
    pub file: PathBuf,
    /// Rebuild every step, ignoring the cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Registry user for the base image.
    #[arg(long, requires = "registry_password_stdin")]
    pub registry_user: Option<String>,
    /// Read the registry password (or token) from stdin.
    #[arg(long, requires = "registry_user")]
    pub registry_password_stdin: bool,
}

pub async fn template(cli: &Cli, cmd: &TemplateCommand) -> anyhow::Result<i32> {
    let c = crate::cmd_sandbox::client(cli)?;
    match cmd {
        TemplateCommand::Build(a) => return build(cli, &c, a).await,
        TemplateCommand::Ls => {
            let list = c.templates().await?;
            if cli.json {
                output::json(&list)?;
            } else {
                println!(
                    "{:<24} {:<40} {:>7} {:>10}  DIGEST",
                    "NAME", "BASE", "LAYERS", "SIZE"
                );
                for t in &list {
                    println!(
                        "{:<24} {:<40} {:>7} {:>10}  {}",
                        t.name,
                        t.base,
                        t.layers.len(),
                        human(t.size_bytes),
                        &t.digest.get(..19).unwrap_or(&t.digest)
                    );
                }
            }
        }
        TemplateCommand::Inspect { name } => output::json(&c.template(name).await?)?,
        TemplateCommand::Rm { name } => {
            let t = c.remove_template(name).await?;
            if cli.json {
                output::json(&t)?;
            } else {
                println!("{}", t.name);
            }
        }
    }
    Ok(0)
}

async fn build(cli: &Cli, c: &mayfly_client::Client, a: &BuildArgs) -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let abs = std::path::absolute(&a.file)?;
    let context = abs.parent().map(|p| p.to_string_lossy().into_owned());
    let registry_auth = match &a.registry_user {
        Some(user) => {
            let mut password = String::new();
            std::io::stdin().read_to_string(&mut password)?;
            Some(RegistryAuth {
                username: user.clone(),
                password: password.trim_end_matches(['\r', '\n']).to_owned(),
            })
        }
        None => None,
    };
    let req = BuildRequest {
        spec: text,
        file: Some(a.file.display().to_string()),
        context,
        registry_auth,
        no_cache: a.no_cache,
    };
    let mut stream = c.build_template_stream(&req).await?;
    let mut view = View::new(std::io::stderr().is_terminal() && !cli.json);
    while let Some(ev) = stream.next_event().await? {
        match ev {
            BuildEvent::Progress(p) => view.show(&p),
            BuildEvent::Built(info) => {
                view.finish();
                if cli.json {
                    output::json(&info)?;
                } else {
                    summary(&info);
                }
            }
        }
    }
    Ok(0)
}

fn summary(t: &TemplateInfo) {
    println!(
        "built {} ({} layers, {}, {} of {} steps cached) in {:.0} ms\n{}",
        t.name,
        t.layers.len(),
        human(t.size_bytes),
        t.cached_steps,
        t.steps,
        t.build_ms,
        t.digest
    );
}

fn human(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Progress: bars on a terminal, plain lines otherwise.
struct View {
    bars: Option<MultiProgress>,
    pulls: HashMap<String, ProgressBar>,
    step: Option<ProgressBar>,
}

impl View {
    fn new(tty: bool) -> View {
        View {
            bars: tty.then(MultiProgress::new),
            pulls: HashMap::new(),
            step: None,
        }
    }

    fn show(&mut self, p: &BuildProgress) {
        let Some(bars) = &self.bars else {
            plain(p);
            return;
        };
        match p {
            BuildProgress::Pull {
                digest,
                done,
                total,
            } => {
                let bar = self.pulls.entry(digest.clone()).or_insert_with(|| {
                    let b = bars.add(ProgressBar::new(total.unwrap_or(0)));
                    b.set_style(
                        ProgressStyle::with_template(
                            "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> "),
                    );
                    b.set_prefix(short(digest).to_owned());
                    b
                });
                bar.set_position(*done);
            }
            BuildProgress::Layer { digest, cached } => {
                if let Some(b) = self.pulls.get(digest) {
                    b.finish();
                } else {
                    let _ = bars.println(format!(
                        "layer {} {}",
                        short(digest),
                        if *cached { "cached" } else { "unpacked" }
                    ));
                }
            }
            BuildProgress::Step { index, count, text } => {
                let b = bars.add(ProgressBar::new_spinner());
                b.set_style(
                    ProgressStyle::with_template("{spinner} [{prefix}] {msg} {elapsed}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                b.set_prefix(format!("{}/{}", index + 1, count));
                b.set_message(text.clone());
                b.enable_steady_tick(Duration::from_millis(100));
                self.step = Some(b);
            }
            BuildProgress::StepDone { cached, ms, .. } => {
                if let Some(b) = self.step.take() {
                    let msg = b.message();
                    b.finish_with_message(format!(
                        "{msg} {}",
                        if *cached {
                            "(cached)".to_owned()
                        } else {
                            format!("({ms:.0} ms)")
                        }
                    ));
                }
            }
            BuildProgress::Output { line } => {
                let _ = bars.println(format!("  | {line}"));
            }
        }
    }

    fn finish(&mut self) {
        if let Some(b) = self.step.take() {
            b.finish();
        }
    }
}

fn plain(p: &BuildProgress) {
    match p {
        BuildProgress::Pull {
            digest,
            done,
            total,
        } => {
            // A line per layer start and end, not per chunk.
            if *done == 0 || Some(*done) == *total {
                eprintln!(
                    "pull {} {}/{}",
                    short(digest),
                    done,
                    total.map(|t| t.to_string()).unwrap_or_else(|| "?".into())
                );
            }
        }
        BuildProgress::Layer { digest, cached } => eprintln!(
            "layer {} {}",
            short(digest),
            if *cached { "cached" } else { "unpacked" }
        ),
        BuildProgress::Step { index, count, text } => {
            eprintln!("step {}/{}: {text}", index + 1, count)
        }
        BuildProgress::StepDone { index, cached, ms } => eprintln!(
            "step {} {}",
            index + 1,
            if *cached {
                "cached".to_owned()
            } else {
                format!("done in {ms:.0} ms")
            }
        ),
        BuildProgress::Output { line } => eprintln!("  | {line}"),
    }
}

fn short(digest: &str) -> &str {
    digest.get(..19).unwrap_or(digest)
}
