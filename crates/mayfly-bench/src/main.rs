//! `mayfly-bench`: Mayfly's speed and density, measured in one run side by
//! side with bubblewrap, runc and podman. See docs/BENCHMARKS.md.
//!
//! ```sh
//! bash bench/peers-setup.sh
//! mayfly-bench all --mayfly target/release/mayfly --out docs/BENCHMARKS.md
//! ```

mod api;
mod daemon;
mod density;
mod gateway;
mod gateway_peers;
mod gateway_report;
mod host;
mod net;
mod peer_load;
mod pool;
mod report;
mod section;
mod spawn;
mod stats;
mod templates;
mod templates_image;
mod templates_report;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use api::Ledger;
use daemon::{Daemon, Scratch};
use host::{command_line, Host};
use report::Report;

#[derive(Debug, Parser)]
#[command(
    name = "mayfly-bench",
    about = "Benchmarks Mayfly against bubblewrap, runc and podman."
)]
struct Cli {
    #[command(subcommand)]
    measure: Measure,
    #[command(flatten)]
    opts: Opts,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
enum Measure {
    /// Every measure below, in one run.
    All,
    /// Cold create→ready, destroy and full cleanup, through the API.
    Create,
    /// Exec round trip of `true` through the API, against a plain fork+exec.
    Exec,
    /// Daemonless `mayfly run -- /bin/true` against bwrap, runc, podman, unshare.
    Run,
    /// Memory per sandbox with many sandboxes alive at once.
    Density,
    /// Warm pools: claim latency, `mayfly run` through a warm daemon
    /// against bwrap, refill rate, and sustained throughput under load.
    Pool,
    /// The gateway: requests per second through a preview URL against a
    /// direct connection to the same server, and the latency it adds (wrk).
    Gateway,
    /// Egress: cold create with policy `allow` against `none`, pool claims
    /// with network against without, veth namespace setup cost, and TCP
    /// throughput through the egress proxy against direct. Not part of `all`.
    Net,
    /// Templates: create from a cached multi-layer OCI template against
    /// `host`, `mayfly run` of it against `podman run` of the same image,
    /// unchanged rebuilds, and the Postgres and Redis templates (cold
    /// creates and warm claims with the service ready). Not part of `all`.
    Templates,
}

#[derive(Debug, Args)]
struct Opts {
    /// The `mayfly` binary to measure.
    #[arg(long, global = true, default_value = "target/release/mayfly")]
    mayfly: PathBuf,
    /// Measured iterations of each latency loop.
    #[arg(long, global = true, default_value_t = 200)]
    iterations: usize,
    /// Iterations run first and thrown away.
    #[arg(long, global = true, default_value_t = 5)]
    warmup: usize,
    /// Extra create/destroy cycles, each after `--idle-ms` of idleness.
    #[arg(long, global = true, default_value_t = 30)]
    idle_iterations: usize,
    /// Idleness before each of the `--idle-iterations` cycles, in ms.
    #[arg(long, global = true, default_value_t = 250)]
    idle_ms: u64,
    /// Measured podman runs (it takes ~200 ms each); 0 leaves podman out.
    #[arg(long, global = true, default_value_t = 20)]
    podman_iterations: usize,
    /// Concurrent clients of the load measure.
    #[arg(long, global = true, default_value_t = 32)]
    clients: usize,
    /// Sandboxes created, used and destroyed by the load measure.
    #[arg(long, global = true, default_value_t = 10_000)]
    load_total: usize,
    /// Sandboxes the refill measure boots into an empty pool.
    #[arg(long, global = true, default_value_t = 200)]
    refill_target: u32,
    /// Passed to the daemon as `--scratch`: where sandboxes' writable layers
    /// live (e.g. a directory on /dev/shm). Default: its state directory.
    #[arg(long, global = true)]
    scratch: Option<PathBuf>,
    /// Boots at once in the refill measure (0: two per core).
    #[arg(long, global = true, default_value_t = 0)]
    refill_concurrency: u32,
    /// Rounds of the refill measure (each from an empty pool); the report
    /// gives the median.
    #[arg(long, global = true, default_value_t = 5)]
    refill_rounds: u32,
    /// Sandboxes alive at once for the density measure.
    #[arg(long, global = true, default_value_t = 1000)]
    sandboxes: usize,
    /// The runc bundle made by bench/peers-setup.sh.
    #[arg(
        long,
        global = true,
        default_value = "/var/lib/mayfly-bench/runc-bundle"
    )]
    bundle: PathBuf,
    /// The podman image made by bench/peers-setup.sh.
    #[arg(
        long,
        global = true,
        default_value = "localhost/mayfly-bench-busybox:latest"
    )]
    image: String,
    /// Also write the report here: markdown, or JSON if the name ends in `.json`.
    #[arg(long, global = true)]
    out: Option<PathBuf>,
    /// Also write the JSON report here.
    #[arg(long, global = true)]
    json: Option<PathBuf>,
    /// Seconds of each wrk run of the gateway measure.
    #[arg(long, global = true, default_value_t = 10)]
    gateway_seconds: u64,
    /// Connections of the gateway throughput runs.
    #[arg(long, global = true, default_value_t = 32)]
    gateway_connections: u32,
    /// Rounds (direct and through the gateway, alternating) of the gateway measure.
    #[arg(long, global = true, default_value_t = 3)]
    gateway_rounds: usize,
    /// `templates`: cold creates and warm claims of each service template.
    #[arg(long, global = true, default_value_t = 10)]
    service_iterations: usize,
    /// `templates`: unchanged rebuilds of each template.
    #[arg(long, global = true, default_value_t = 20)]
    rebuilds: usize,
    /// `gateway`, `net` and `templates`: put the measure's section into this markdown
    /// file (replacing its previous one), e.g. docs/BENCHMARKS.md.
    #[arg(long, global = true)]
    section: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mayfly-bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("mayfly-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the chosen measures, writes the report; `Ok(false)` if any measure
/// failed (the report says which).
async fn run(cli: Cli) -> anyhow::Result<bool> {
    let o = &cli.opts;
    // Measure a private copy: a `cargo build` during the run would
    // otherwise swap the binary under the daemon and mix two builds.
    let bin = Scratch::new("bin")?;
    // The CLI hands `serve` and daemonless runs to `mayflyd` beside it.
    let mayfly = bin.path.join("mayfly");
    for name in ["mayfly", "mayflyd"] {
        let from = o.mayfly.with_file_name(name);
        std::fs::copy(&from, bin.path.join(name))
            .with_context(|| format!("copying the {name} binary from {}", from.display()))?;
    }
    let command = std::env::args()
        .map(|a| shell_quote(&a))
        .collect::<Vec<_>>()
        .join(" ");
    if cli.measure == Measure::Gateway {
        return gateway_measure(o, &mayfly, &command).await;
    }
    if cli.measure == Measure::Net {
        return net_measures(o, &mayfly, &command).await;
    }
    if cli.measure == Measure::Templates {
        return templates_measure(o, &mayfly, &command).await;
    }
    let mut report = Report::new(host::machine(), versions(&mayfly), command);
    let mut ok = true;
    let m = cli.measure;
    // The API measures run first: the peer loop starts and removes hundreds
    // of runc and podman containers, whose dying memory cgroups slow every
    // cgroup operation on the host for minutes afterwards (measured: Mayfly's
    // create p50 about doubles right after the loop). The `run` comparison
    // interleaves Mayfly with the peers, so it is fair in any state.
    if m != Measure::Run {
        ok &= api_measures(m, o, &mayfly, &mut report).await?;
    }
    if matches!(m, Measure::All | Measure::Run) {
        let setup = spawn::PeerSetup {
            mayfly: mayfly.clone(),
            bundle: o.bundle.clone(),
            image: o.image.clone(),
            podman_iterations: o.podman_iterations,
        };
        eprintln!(
            "mayfly-bench: run -- /bin/true against the peers, {} iterations",
            o.iterations
        );
        if let Err(e) = spawn::measure(&setup, o.iterations, o.warmup, &mut report) {
            report.note(format!("The `mayfly run` comparison failed: {e:#}"));
            ok = false;
        }
    }
    let md = report.markdown();
    println!("{md}");
    let json = serde_json::to_string_pretty(&report.json())?;
    if let Some(out) = &o.out {
        let text = if out.extension().is_some_and(|e| e == "json") {
            &json
        } else {
            &md
        };
        std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
    }
    if let Some(out) = &o.json {
        std::fs::write(out, &json).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(ok)
}

/// The gateway measure, on a daemon of its own; prints its section and
/// puts it into `--section`.
async fn gateway_measure(o: &Opts, mayfly: &Path, command: &str) -> anyhow::Result<bool> {
    let setup = gateway::Setup {
        seconds: o.gateway_seconds,
        connections: o.gateway_connections,
        rounds: o.gateway_rounds.max(1),
    };
    let machine = host::machine();
    let outcome = gateway::measure(mayfly, &setup).await?;
    let md = gateway_report::markdown(&outcome, &setup, &machine, command);
    println!("{md}");
    if let Some(f) = &o.section {
        gateway_report::write_section(f, &md)?;
    }
    Ok(true)
}

/// The template measures, on a daemon of their own; prints their section
/// and puts it into `--section`.
async fn templates_measure(o: &Opts, mayfly: &Path, command: &str) -> anyhow::Result<bool> {
    let setup = templates::Setup {
        iterations: o.iterations,
        warmup: o.warmup,
        podman_iterations: o.podman_iterations,
        service_iterations: o.service_iterations.max(1),
        rebuilds: o.rebuilds.max(1),
    };
    let machine = host::machine();
    let v = versions(mayfly);
    let versions = format!(
        "mayfly {}, podman {}",
        v.get("mayfly").map_or("?", String::as_str),
        v.get("podman").map_or("?", String::as_str)
    );
    let outcome = templates::measure(mayfly, &setup).await?;
    let md = templates_report::markdown(&outcome, &setup, &machine, &versions, command);
    println!("{md}");
    if let Some(f) = &o.section {
        section::write(f, templates_report::BEGIN, templates_report::END, &md)?;
    }
    Ok(true)
}

/// The measures that need a daemon: one daemon for all of them, stopped at
/// the end, then a check that nothing the bench created is left.
async fn api_measures(
    m: Measure,
    o: &Opts,
    mayfly: &Path,
    report: &mut Report,
) -> anyhow::Result<bool> {
    let scratch = Scratch::new("daemon")?;
    let host = Host::default();
    let mut ledger = Ledger::default();
    let max = (o.sandboxes + 8).max(4096) as u32;
    let mut d = match Daemon::start(mayfly, &scratch.path, max, o.scratch.as_deref()).await {
        Ok(d) => d,
        Err(e) => {
            report.note(format!(
                "The daemon could not be started, so no API or density measure ran: {e:#}"
            ));
            return Ok(false);
        }
    };
    let mut ok = true;
    let (n, w) = (o.iterations, o.warmup);
    let idle = (o.idle_iterations, Duration::from_millis(o.idle_ms));
    if matches!(m, Measure::All | Measure::Create) {
        eprintln!("mayfly-bench: create/destroy through the API, {n} iterations");
        if let Err(e) = api::lifecycle(&d, &host, n, w, idle, &mut ledger, report).await {
            report.note(format!("The create/destroy measure failed: {e:#}"));
            ok = false;
        }
    }
    if matches!(m, Measure::All | Measure::Exec) {
        eprintln!("mayfly-bench: exec round trips, {n} iterations");
        if let Err(e) = api::exec(&d, n, w, &mut ledger, report).await {
            report.note(format!("The exec measure failed: {e:#}"));
            ok = false;
        }
    }
    if matches!(m, Measure::All | Measure::Pool) {
        eprintln!("mayfly-bench: warm claims, {n} iterations");
        if let Err(e) = pool::claims(&d, n, w, &mut ledger, report).await {
            report.note(format!("The warm-claim measure failed: {e:#}"));
            ok = false;
        }
        eprintln!("mayfly-bench: mayfly run through a warm daemon against bwrap, {n} iterations");
        if let Err(e) = pool::run_vs_bwrap(&d, mayfly, n, w, report).await {
            report.note(format!("The warm `mayfly run` measure failed: {e:#}"));
            ok = false;
        }
        eprintln!("mayfly-bench: refill of {} sandboxes", o.refill_target);
        if let Err(e) = pool::refill(
            &d,
            o.refill_target,
            o.refill_concurrency,
            o.refill_rounds,
            report,
        )
        .await
        {
            report.note(format!("The refill measure failed: {e:#}"));
            ok = false;
        }
        eprintln!(
            "mayfly-bench: load, {} clients, {} sandboxes",
            o.clients, o.load_total
        );
        if let Err(e) = pool::load(&d, o.clients, o.load_total, report).await {
            report.note(format!("The load measure failed: {e:#}"));
            ok = false;
        }
    }
    if matches!(m, Measure::All | Measure::Density) {
        eprintln!("mayfly-bench: {} sandboxes alive at once", o.sandboxes);
        if let Err(e) = density::measure(&d, &host, o.sandboxes, &mut ledger, report).await {
            report.note(format!("The density measure failed: {e:#}"));
            ok = false;
        }
    }
    if let Err(e) = d.stop(Duration::from_secs(120)).await {
        report.note(format!("Stopping the daemon: {e:#}"));
        ok = false;
    }
    ok &= leak_check(&host, &d, &ledger, &scratch.path, report);
    Ok(ok)
}

/// After the daemon stopped: no directory, cgroup, process or mount of any
/// sandbox this bench created may remain.
fn leak_check(
    host: &Host,
    d: &Daemon,
    ledger: &Ledger,
    scratch: &Path,
    report: &mut Report,
) -> bool {
    match ledger.leftovers(host, &d.scratch_root, scratch) {
        Some(note) => {
            report.note(note);
            false
        }
        None => true,
    }
}

fn versions(mayfly: &Path) -> std::collections::BTreeMap<&'static str, String> {
    let mut v = std::collections::BTreeMap::new();
    let git = command_line("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = !command_line("git", &["status", "--porcelain"]).is_empty();
    let mayfly_v = command_line(&mayfly.display().to_string(), &["--version"]);
    let tree = if git.is_empty() {
        String::new()
    } else {
        format!(
            " (commit {git}{})",
            if dirty { ", uncommitted changes" } else { "" }
        )
    };
    v.insert(
        "mayfly",
        format!("{}{tree}", mayfly_v.trim_start_matches("mayfly ")),
    );
    for (k, args) in [
        ("bwrap", &["--version"][..]),
        ("runc", &["--version"]),
        ("podman", &["--version"]),
    ] {
        let line = command_line(k, args);
        let ver = line
            .split_whitespace()
            .find(|w| w.starts_with(|c: char| c.is_ascii_digit()));
        v.insert(k, ver.unwrap_or("not installed").to_owned());
    }
    v
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// `net`: its own daemon (with a DNS table naming the bench's sink), its
/// own section of the report.
async fn net_measures(o: &Opts, mayfly: &Path, command: &str) -> anyhow::Result<bool> {
    let scratch = Scratch::new("net")?;
    let hosts = scratch.path.join("hosts");
    std::fs::write(&hosts, "10.78.0.2 sink.test\n")?;
    let hosts_arg = hosts.display().to_string();
    let _outside = net::Outside::start()?;
    let mut d = Daemon::start_with(
        mayfly,
        &scratch.path,
        4096,
        None,
        &["--gateway", "off", "--dns-hosts", &hosts_arg],
    )
    .await?;
    let mut r = net::NetReport::default();
    let mut ledger = Ledger::default();
    let (n, w) = (o.iterations, o.warmup);
    let mut ok = true;
    eprintln!("mayfly-bench: cold create, allow against none, {n} iterations");
    if let Err(e) = net::cold(&d, n, w, &mut ledger, &mut r).await {
        r.notes
            .push(format!("The cold create measure failed: {e:#}"));
        ok = false;
    }
    eprintln!("mayfly-bench: pool claims with and without network, {n} iterations");
    if let Err(e) = net::claims(&d, n, w, &mut ledger, &mut r).await {
        r.notes.push(format!("The claim measure failed: {e:#}"));
        ok = false;
    }
    eprintln!("mayfly-bench: throughput, direct and through the proxy");
    if let Err(e) = net::throughput(&d, &mut ledger, &mut r).await {
        r.notes
            .push(format!("The throughput measure failed: {e:#}"));
        ok = false;
    }
    if let Err(e) = d.stop(Duration::from_secs(60)).await {
        r.notes.push(format!("Stopping the daemon: {e:#}"));
        ok = false;
    }
    eprintln!(
        "mayfly-bench: veth namespace setup cost, {} iterations",
        n.min(50)
    );
    if let Err(e) = net::setup_costs(n.min(50), &mut r) {
        r.notes
            .push(format!("The setup-cost measure failed: {e:#}"));
        ok = false;
    }
    let machine = host::machine();
    let when = machine.get("date").cloned().unwrap_or_default();
    let desc = format!(
        "Linux {}, {} vCPUs",
        machine.get("kernel").cloned().unwrap_or_default(),
        machine.get("nproc").cloned().unwrap_or_default()
    );
    let commit = versions(mayfly).get("mayfly").cloned().unwrap_or_default();
    let md = net::markdown(&r, &when, &desc, command, &commit);
    println!("{md}");
    if let Some(f) = &o.section {
        net::write_section(f, &md)?;
    }
    Ok(ok)
}
