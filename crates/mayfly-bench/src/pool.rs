//! The warm-pool measures (issue 3): claim latency over the API, `mayfly
//! run` through a daemon with a warm pool against bwrap (interleaved, one
//! run), refill rate, and sustained create+exec+destroy throughput with K
//! concurrent clients.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use mayfly_client::{Client, ClientError};
use mayfly_types::{CreateRequest, ErrorCode, ExecRequest, PoolSpec, SandboxSource};

use crate::api::{call, Ledger};
use crate::daemon::Daemon;
use crate::peer_load::{bwrap_load, HostCpu, BWRAP_ARGS};
use crate::report::{Load, Report};
use crate::stats::Samples;

/// The pool the measures use (the daemon starts with none).
const POOL: &str = "bench";

async fn set_pool(c: &Client, target: u32, conc: u32) -> anyhow::Result<()> {
    let spec = PoolSpec {
        target: Some(target),
        max: Some(target),
        refill_concurrency: Some(conc),
        ..PoolSpec::default()
    };
    call("setting the bench pool", c.set_pool(POOL, &spec)).await?;
    Ok(())
}

/// Waits until the bench's pool holds at least `ready` and boots nothing.
async fn settle(c: &Client, ready: u32, limit: Duration) -> anyhow::Result<Duration> {
    settle_pool(c, POOL, ready, limit).await
}

/// Waits until pool `name` holds at least `ready` and boots nothing.
pub async fn settle_pool(
    c: &Client,
    name: &str,
    ready: u32,
    limit: Duration,
) -> anyhow::Result<Duration> {
    settle_pool_every(c, name, ready, Duration::from_millis(2), limit).await
}

/// [`settle_pool`], looking at the pool every `every`.
async fn settle_pool_every(
    c: &Client,
    name: &str,
    ready: u32,
    every: Duration,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    loop {
        let pools = call("listing pools", c.pools()).await?;
        let p = pools.iter().find(|p| p.name == name);
        if p.is_some_and(|p| p.ready >= ready && p.filling == 0) {
            return Ok(t.elapsed());
        }
        if t.elapsed() > limit {
            bail!("pool {name} did not reach {ready} ready within {limit:?}: {p:?}");
        }
        tokio::time::sleep(every).await;
    }
}

/// Claim latency: each claim with the pool full and quiet, as a request
/// meets a pool that keeps up.
pub async fn claims(
    d: &Daemon,
    n: usize,
    warmup: usize,
    ledger: &mut Ledger,
    report: &mut Report,
) -> anyhow::Result<()> {
    let c = &d.client;
    set_pool(c, 8, 1).await?;
    let (mut api, mut daemon, mut floor) = (Samples::new(), Samples::new(), Samples::new());
    for i in 0..warmup + n {
        settle(c, 8, Duration::from_secs(30)).await?;
        // The floor of any request on this host and connection: a health
        // check, the same client, just before the claim.
        let t = Instant::now();
        call("checking health", c.health()).await?;
        let health = t.elapsed();
        let t = Instant::now();
        let sb = call("claiming a sandbox", c.create(&CreateRequest::default())).await?;
        let took = t.elapsed();
        ledger.note(&sb);
        ensure!(
            sb.source == SandboxSource::Pool,
            "sandbox {} came from {:?} with the pool full",
            sb.id,
            sb.source
        );
        if i >= warmup {
            api.push(took);
            floor.push(health);
            if let Some(ms) = sb.create_ms {
                daemon.push_ms(ms);
            }
        }
        call("destroying", c.destroy(&sb.id)).await?;
    }
    report.add("claim", api);
    report.add("claim_daemon", daemon);
    report.add("claim_floor", floor);
    call("draining the pool", c.drain_pool(POOL)).await?;
    Ok(())
}

/// Refill rate: from an empty pool to `target` booted sandboxes with
/// `concurrency` boots at once (0: two per core), `rounds` times (the
/// host's noise is larger than one round); sandboxes per second per core.
///
/// The measure must not compete with what it measures: it waits for the
/// daemon to fall quiet first (the previous measure's drained sandboxes are
/// destroyed in the background) and then for the host's CPUs to be idle
/// (the kernel finishes tearing namespaces and cgroups down in its own
/// workers, after the daemon's last event), polls the pool only every
/// [`REFILL_POLL`], and takes the end from the daemon's own `ready` events,
/// not from when a poll happened to see the pool full. The host's busy CPU
/// time across each round is kept too: CPU per boot is the steadier figure
/// on a noisy host.
pub async fn refill(
    d: &Daemon,
    target: u32,
    concurrency: u32,
    rounds: u32,
    report: &mut Report,
) -> anyhow::Result<()> {
    let c = &d.client;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    // A boot spends part of its time waiting on the kernel (RCU grace
    // periods of cgroup and namespace setup), so two per core keep the
    // cores busier than one.
    let conc = if concurrency == 0 {
        2 * cores
    } else {
        concurrency
    };
    let (mut took, mut cpu, mut busy_starts) = (Vec::new(), Vec::new(), 0);
    for _ in 0..rounds.max(1) {
        settle(c, 0, Duration::from_secs(30)).await?;
        let since = quiet(c, Duration::from_millis(300), Duration::from_secs(60)).await?;
        if !idle_host(cores, Duration::from_secs(10)).await? {
            busy_starts += 1;
        }
        let cpu0 = HostCpu::now()?;
        let start = std::time::SystemTime::now();
        set_pool(c, target, conc).await?;
        settle_pool_every(c, POOL, target, REFILL_POLL, Duration::from_secs(120)).await?;
        cpu.push(HostCpu::now()?.since(cpu0));
        let last = last_ready(c, since, target).await?;
        took.push(
            last.duration_since(start)
                .context("the last boot's ready event is older than the refill's start")?,
        );
        call("draining the pool", c.drain_pool(POOL)).await?;
    }
    if busy_starts > 0 {
        report.note(format!(
            "{busy_starts} of the refill's rounds started with the host still busy \
             (over 10% of its CPU time for 10 s): something else was running."
        ));
    }
    report.refill = Some(crate::report::Refill {
        sandboxes: target,
        cores,
        concurrency: conc,
        rounds: took,
        cpu,
    });
    Ok(())
}

/// Waits until the host's CPUs are idle (under a tenth of their time busy
/// over 200 ms), at most `limit`; whether they were.
async fn idle_host(cores: u32, limit: Duration) -> anyhow::Result<bool> {
    const WINDOW: Duration = Duration::from_millis(200);
    let t = Instant::now();
    while t.elapsed() < limit {
        let before = HostCpu::now()?;
        tokio::time::sleep(WINDOW).await;
        if HostCpu::now()?.since(before) < WINDOW * cores / 10 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// How often the refill measure looks at the pool. Each look is a request
/// the daemon serves on the cores the boots need; the end time comes from
/// the events, so a coarse poll costs no precision.
const REFILL_POLL: Duration = Duration::from_millis(50);

/// Waits until the daemon records no lifecycle event for `still`; returns
/// the sequence number of its last event.
async fn quiet(c: &Client, still: Duration, limit: Duration) -> anyhow::Result<i64> {
    let t = Instant::now();
    let mut seq = latest_seq(c, 0).await?;
    loop {
        tokio::time::sleep(still).await;
        let now = latest_seq(c, seq).await?;
        if now == seq {
            return Ok(seq);
        }
        if t.elapsed() > limit {
            bail!("the daemon did not fall quiet within {limit:?}");
        }
        seq = now;
    }
}

/// The sequence number of the daemon's latest event after `since`
/// (`since` itself if there is none).
async fn latest_seq(c: &Client, mut since: i64) -> anyhow::Result<i64> {
    loop {
        let page = call("reading events", c.events(since, 1000)).await?;
        match page.last() {
            Some(e) => since = e.seq,
            None => return Ok(since),
        }
    }
}

/// When the `n`th sandbox of the bench's pool after event `since` was
/// ready, by the daemon's clock (the same host's as the bench's). Events
/// carry whole milliseconds; this is the end of that millisecond, so the
/// refill is never measured shorter than it took.
async fn last_ready(c: &Client, mut since: i64, n: u32) -> anyhow::Result<std::time::SystemTime> {
    let mut seen = 0;
    loop {
        let page = call("reading events", c.events(since, 1000)).await?;
        let Some(tail) = page.last() else {
            bail!("only {seen} of the refill's {n} ready events were recorded");
        };
        since = tail.seq;
        for e in &page {
            if e.kind == "ready" && e.detail.get("pool").and_then(|p| p.as_str()) == Some(POOL) {
                seen += 1;
                if seen == n {
                    return Ok(std::time::UNIX_EPOCH + Duration::from_millis(e.at + 1));
                }
            }
        }
    }
}

/// `mayfly run -- /bin/true` through the daemon (its pool warm) and
/// `bwrap … /bin/true`, alternating, each run after the pool is full again.
pub async fn run_vs_bwrap(
    d: &Daemon,
    mayfly: &Path,
    n: usize,
    warmup: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let c = &d.client;
    set_pool(c, 4, 1).await?;
    let socket = d.socket.clone();
    let (mut m, mut b) = (Samples::new(), Samples::new());
    for i in 0..warmup + n {
        settle(c, 4, Duration::from_secs(30)).await?;
        let t = Instant::now();
        let st = Command::new(mayfly)
            .arg("--socket")
            .arg(&socket)
            .args(["run", "--", "/bin/true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .context("running mayfly run")?;
        let tm = t.elapsed();
        ensure!(st.success(), "mayfly run through the daemon failed: {st}");
        let t = Instant::now();
        let st = Command::new("bwrap")
            .args(BWRAP_ARGS.split(' '))
            .stdin(Stdio::null())
            .status()
            .context("running bwrap (run bench/peers-setup.sh)")?;
        let tb = t.elapsed();
        ensure!(st.success(), "bwrap failed: {st}");
        if i >= warmup {
            m.push(tm);
            b.push(tb);
        }
    }
    report.add("run_daemon", m);
    report.add("run_daemon_bwrap", b);
    call("draining the pool", c.drain_pool(POOL)).await?;
    Ok(())
}

/// Sustained throughput: `clients` concurrent clients each create, exec
/// `true` and destroy until `total` sandboxes have gone through, with a
/// warm pool refilling behind them. 429s are counted apart (intended).
pub async fn load(
    d: &Daemon,
    clients: usize,
    total: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let c = &d.client;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    set_pool(c, 64, cores).await?;
    settle(c, 64, Duration::from_secs(60)).await?;
    let left = Arc::new(std::sync::atomic::AtomicUsize::new(total));
    let cpu0 = HostCpu::now()?;
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (c, left) = (c.clone(), left.clone());
        tasks.push(tokio::spawn(async move { client_loop(c, left).await }));
    }
    let mut out = Load {
        clients,
        total,
        ..Load::default()
    };
    let mut cycle = Samples::new();
    for task in tasks {
        let r = task.await.context("a load client panicked")?;
        out.errors += r.errors;
        out.throttled += r.throttled;
        out.from_pool += r.from_pool;
        out.first_error = out.first_error.or(r.first_error);
        for s in r.cycle {
            cycle.push(s);
        }
    }
    out.wall = t.elapsed();
    out.cpu = HostCpu::now()?.since(cpu0);
    report.add("load_cycle", cycle);
    call("draining the pool", c.drain_pool(POOL)).await?;
    // The peer, in the same run, once the pool is drained and its destroys
    // have had time to finish: bwrap, the same number of runs, as many at
    // once as there were clients.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let peer = tokio::task::spawn_blocking(move || bwrap_load(total, clients))
        .await
        .context("the bwrap load panicked")?;
    out.peer = Some(peer.map_err(|e| format!("{e:#}")));
    report.load = Some(out);
    Ok(())
}

#[derive(Default)]
struct ClientResult {
    cycle: Vec<Duration>,
    errors: usize,
    throttled: usize,
    from_pool: usize,
    first_error: Option<String>,
}

async fn client_loop(c: Client, left: Arc<std::sync::atomic::AtomicUsize>) -> ClientResult {
    use std::sync::atomic::Ordering;
    let mut r = ClientResult::default();
    let exec = ExecRequest {
        argv: vec!["true".into()],
        ..ExecRequest::default()
    };
    while left
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        let t = Instant::now();
        let res: Result<bool, ClientError> = async {
            let sb = c.create(&CreateRequest::default()).await?;
            let e = c.exec(&sb.id, &exec).await;
            c.destroy(&sb.id).await?;
            let e = e?;
            if e.status.exit_code != Some(0) {
                return Err(ClientError::Protocol {
                    request: "exec true".into(),
                    reason: format!("exited {:?}", e.status),
                });
            }
            Ok(sb.source == SandboxSource::Pool)
        }
        .await;
        match res {
            Ok(pool) => {
                r.cycle.push(t.elapsed());
                r.from_pool += usize::from(pool);
            }
            Err(ClientError::Api { error, .. }) if error.code == ErrorCode::ResourceExhausted => {
                r.throttled += 1;
            }
            Err(e) => {
                r.errors += 1;
                r.first_error.get_or_insert(e.to_string());
            }
        }
    }
    r
}
