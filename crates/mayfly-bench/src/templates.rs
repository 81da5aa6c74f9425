//! The template measures (issue 5), on a daemon of their own:
//!
//! - create→ready from a cached multi-layer OCI template against `host`,
//!   interleaved in one loop (the target: within 1.5×);
//! - `mayfly run --template <oci> -- /bin/true` through the daemon against
//!   `podman run --rm` of the same image, imported from the same OCI layout;
//! - rebuilds of unchanged templates (every step from the step cache);
//! - the Postgres and Redis templates: the first build, cold creates with
//!   the service ready, and warm claims from a pool of the template with the
//!   service ready. Every sandbox is asked to answer (`select 1`, `PING`)
//!   before it counts, outside the timed part.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use mayfly_client::Client;
use mayfly_types::{
    BuildRequest, CreateRequest, ExecRequest, PoolSpec, SandboxInfo, SandboxSource, TemplateRef,
};

use crate::api::{call, Ledger};
use crate::daemon::{Daemon, Scratch};
use crate::host::Host;
use crate::pool::settle_pool;
use crate::spawn::PODMAN_RUN;
use crate::stats::Samples;
use crate::templates_image as image;

/// How the template measures run.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Create pairs (OCI template, `host`).
    pub iterations: usize,
    pub warmup: usize,
    /// `mayfly run` / `podman run` pairs.
    pub podman_iterations: usize,
    /// Cold creates and warm claims of each service template.
    pub service_iterations: usize,
    /// Unchanged rebuilds of each template.
    pub rebuilds: usize,
}

/// Every figure the measures took, in milliseconds.
#[derive(Debug, Default)]
pub struct Outcome {
    pub image: image::Stats,
    pub oci_first_build: f64,
    pub create_oci: Samples,
    pub create_host: Samples,
    pub create_oci_daemon: Samples,
    pub create_host_daemon: Samples,
    /// Per-iteration create ratio, OCI / host.
    pub create_pairs: Vec<f64>,
    pub run_oci: Samples,
    pub run_podman: Samples,
    pub run_pairs: Vec<f64>,
    pub rebuild_oci: Samples,
    pub services: Vec<ServiceOutcome>,
    pub notes: Vec<String>,
}

/// The figures of one service template (Postgres, Redis).
#[derive(Debug, Default)]
pub struct ServiceOutcome {
    pub name: &'static str,
    pub first_build: f64,
    pub rebuild: Samples,
    pub cold: Samples,
    pub claim: Samples,
    pub claim_daemon: Samples,
}

const OCI_TEMPLATE: &str = "bench-oci";

/// Runs every template measure on a daemon of its own; the daemon is
/// stopped and checked for leftovers whatever happens.
pub async fn measure(mayfly: &Path, s: &Setup) -> anyhow::Result<Outcome> {
    let scratch = Scratch::new("templates")?;
    let mut o = Outcome::default();
    let layout = scratch.path.join("image");
    o.image = image::build_layout(&layout)?;
    let dir = scratch.path.join("daemon");
    std::fs::create_dir_all(&dir)?;
    let mut d = Daemon::start(mayfly, &dir, 4096, None).await?;
    let mut ledger = Ledger::default();
    let res = measures(&d, mayfly, &layout, s, &mut ledger, &mut o).await;
    let stopped = d.stop(Duration::from_secs(120)).await;
    if let Some(leaks) = ledger.leftovers(&Host::default(), &d.scratch_root, &scratch.path) {
        bail!("{leaks}");
    }
    res?;
    stopped?;
    Ok(o)
}

async fn measures(
    d: &Daemon,
    mayfly: &Path,
    layout: &Path,
    s: &Setup,
    ledger: &mut Ledger,
    o: &mut Outcome,
) -> anyhow::Result<()> {
    let c = &d.client;
    let oci = image::oci_template(OCI_TEMPLATE, layout);
    eprintln!(
        "mayfly-bench: building the OCI template ({} layers)",
        o.image.layers
    );
    o.oci_first_build = build(c, &oci).await?;
    o.rebuild_oci = rebuilds(c, &oci, s.rebuilds).await?;
    eprintln!(
        "mayfly-bench: create from the OCI template against host, {} pairs",
        s.iterations
    );
    creates(c, s, ledger, o).await?;
    if s.podman_iterations > 0 {
        match image::podman_import(layout) {
            Ok(id) => {
                eprintln!(
                    "mayfly-bench: mayfly run against podman run, {} pairs",
                    s.podman_iterations
                );
                let r = runs(d, mayfly, &id, s, o).await;
                image::podman_remove(&id);
                r?;
            }
            Err(e) => o.notes.push(format!(
                "podman was left out: cannot import the image: {e:#}"
            )),
        }
    }
    for (name, spec, check) in [
        (
            "postgres",
            image::postgres_template(),
            image::POSTGRES_CHECK,
        ),
        ("redis", image::redis_template(), image::REDIS_CHECK),
    ] {
        eprintln!("mayfly-bench: the {name} template");
        let so = service(c, name, &spec, check, s, ledger).await?;
        o.services.push(so);
    }
    Ok(())
}

fn request(spec: &str, file: &str) -> BuildRequest {
    BuildRequest {
        spec: spec.to_owned(),
        file: Some(file.to_owned()),
        context: None,
        registry_auth: None,
        no_cache: false,
    }
}

/// Builds a template; milliseconds.
async fn build(c: &Client, spec: &str) -> anyhow::Result<f64> {
    let t = Instant::now();
    call(
        "building a template",
        c.build_template(&request(spec, "bench.yaml")),
    )
    .await?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

async fn rebuilds(c: &Client, spec: &str, n: usize) -> anyhow::Result<Samples> {
    let mut v = Samples::new();
    for _ in 0..n {
        v.push_ms(build(c, spec).await?);
    }
    Ok(v)
}

fn named(name: &str) -> CreateRequest {
    CreateRequest {
        template: Some(TemplateRef::Named(name.into())),
        ..CreateRequest::default()
    }
}

/// Creates (timed) and checks the sandbox answers; (info, API ms).
async fn create(
    c: &Client,
    req: &CreateRequest,
    ledger: &mut Ledger,
) -> anyhow::Result<(SandboxInfo, f64)> {
    let t = Instant::now();
    let sb = call("creating a sandbox", c.create(req)).await?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    ledger.note(&sb);
    Ok((sb, ms))
}

/// Runs `argv` in the sandbox; fails unless it exits 0.
async fn check(c: &Client, sb: &SandboxInfo, argv: &[&str]) -> anyhow::Result<()> {
    let req = ExecRequest {
        argv: argv.iter().map(|a| (*a).to_owned()).collect(),
        timeout_ms: Some(30_000),
        ..ExecRequest::default()
    };
    let r = call("checking the sandbox", c.exec(&sb.id, &req)).await?;
    ensure!(
        r.status.exit_code == Some(0),
        "{argv:?} in {} ({:?}) exited {:?}: {}{}",
        sb.id,
        sb.source,
        r.status,
        String::from_utf8_lossy(&r.stdout.0),
        String::from_utf8_lossy(&r.stderr.0)
    );
    Ok(())
}

/// Cold creates, OCI template and `host` alternating which goes first.
async fn creates(
    c: &Client,
    s: &Setup,
    ledger: &mut Ledger,
    o: &mut Outcome,
) -> anyhow::Result<()> {
    let (oci, host) = (named(OCI_TEMPLATE), CreateRequest::default());
    for i in 0..s.warmup + s.iterations {
        let mut took = [0.0; 2];
        let mut daemon = [0.0; 2];
        for k in [i % 2, (i + 1) % 2] {
            let req = if k == 0 { &oci } else { &host };
            let (sb, ms) = create(c, req, ledger).await?;
            ensure!(
                sb.source == SandboxSource::Cold,
                "{} was not a cold create",
                sb.id
            );
            if k == 0 {
                // Proof it is the image's root: its own busybox and the
                // file the template's step wrote.
                check(c, &sb, &["/bin/busybox", "cat", "/etc/built"]).await?;
            }
            took[k] = ms;
            daemon[k] = sb.create_ms.unwrap_or(f64::NAN);
            call("destroying", c.destroy(&sb.id)).await?;
        }
        if i >= s.warmup {
            o.create_oci.push_ms(took[0]);
            o.create_host.push_ms(took[1]);
            o.create_oci_daemon.push_ms(daemon[0]);
            o.create_host_daemon.push_ms(daemon[1]);
            o.create_pairs.push(took[0] / took[1]);
        }
    }
    Ok(())
}

/// Times one command to its exit; fails unless it succeeds.
fn timed(cmd: &mut Command) -> anyhow::Result<f64> {
    let t = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(ms)
}

/// `mayfly run --template bench-oci -- /bin/true` through the daemon (a
/// cold create: the template has no pool) against `podman run --rm` of
/// the same image, alternating.
async fn runs(
    d: &Daemon,
    mayfly: &Path,
    podman_image: &str,
    s: &Setup,
    o: &mut Outcome,
) -> anyhow::Result<()> {
    let socket: PathBuf = d.socket.clone();
    for i in 0..s.warmup.min(2) + s.podman_iterations {
        let m = timed(Command::new(mayfly).arg("--socket").arg(&socket).args([
            "run",
            "--template",
            OCI_TEMPLATE,
            "--",
            "/bin/true",
        ]))?;
        let p = timed(
            Command::new("podman")
                .args(PODMAN_RUN)
                .args([podman_image, "/bin/true"]),
        )?;
        if i >= s.warmup.min(2) {
            o.run_oci.push_ms(m);
            o.run_podman.push_ms(p);
            o.run_pairs.push(m / p);
        }
    }
    Ok(())
}

/// One service template: first build, rebuilds, cold creates, warm claims.
async fn service(
    c: &Client,
    name: &'static str,
    spec: &str,
    probe: &[&str],
    s: &Setup,
    ledger: &mut Ledger,
) -> anyhow::Result<ServiceOutcome> {
    let tpl = format!("bench-{name}");
    let mut so = ServiceOutcome {
        name,
        first_build: build(c, spec).await?,
        rebuild: rebuilds(c, spec, s.rebuilds).await?,
        ..ServiceOutcome::default()
    };
    let req = named(&tpl);
    for _ in 0..s.service_iterations {
        let (sb, ms) = create(c, &req, ledger).await?;
        ensure!(
            sb.source == SandboxSource::Cold,
            "{} was not a cold create",
            sb.id
        );
        check(c, &sb, probe).await?;
        so.cold.push_ms(ms);
        call("destroying", c.destroy(&sb.id)).await?;
    }
    let pool = PoolSpec {
        template: Some(tpl.clone()),
        target: Some(2),
        max: Some(2),
        refill_concurrency: Some(1),
        ..PoolSpec::default()
    };
    call("setting the pool", c.set_pool(&tpl, &pool)).await?;
    for _ in 0..s.service_iterations {
        settle_pool(c, &tpl, 2, Duration::from_secs(120)).await?;
        let (sb, ms) = create(c, &req, ledger).await?;
        if sb.source != SandboxSource::Pool {
            bail!(
                "{} came from {:?} with the {tpl} pool full",
                sb.id,
                sb.source
            );
        }
        check(c, &sb, probe).await?;
        so.claim.push_ms(ms);
        so.claim_daemon.push_ms(sb.create_ms.unwrap_or(f64::NAN));
        call("destroying", c.destroy(&sb.id)).await?;
    }
    call("draining the pool", c.drain_pool(&tpl)).await?;
    Ok(so)
}
