//! The API measures, against a daemon this bench started: create→ready,
//! destroy (the call, then full cleanup) and the exec round trip.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use mayfly_client::Client;
use mayfly_types::{CreateRequest, ExecRequest, SandboxInfo, SandboxState};

use crate::daemon::Daemon;
use crate::host::{sandbox_traces, Host};
use crate::report::Report;
use crate::stats::Samples;

/// How long a destroyed sandbox may take to vanish before it counts as a leak.
pub const CLEANUP_LIMIT: Duration = Duration::from_secs(10);

/// The longest a single API call may take before the bench gives up on it.
pub const CALL_LIMIT: Duration = Duration::from_secs(30);

/// Awaits an API call, failing after [`CALL_LIMIT`] instead of hanging.
pub async fn call<T, E>(
    what: impl std::fmt::Display,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> anyhow::Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    match tokio::time::timeout(CALL_LIMIT, fut).await {
        Ok(r) => r.with_context(|| what.to_string()),
        Err(_) => bail!("{what}: the daemon did not answer within {CALL_LIMIT:?}"),
    }
}

/// Sandboxes this bench created, so the final leak check knows what to look for.
#[derive(Debug, Default)]
pub struct Ledger {
    pub ids: Vec<String>,
    /// Each sandbox's init pid with its start time, so that a later
    /// process that reuses the pid is not taken for it.
    pub init_pids: Vec<(u32, Option<u64>)>,
}

impl Ledger {
    pub fn note(&mut self, sb: &SandboxInfo) {
        self.ids.push(sb.id.to_string());
        let host = Host::default();
        self.init_pids
            .extend(sb.init_pid.map(|p| (p, host.start_time(p))));
    }

    /// After the daemon stopped: what is left of the sandboxes noted here
    /// (their directories under `scratch_root`, cgroups, init processes)
    /// and any mount under `scratch`, said in one sentence; `None` if clean.
    pub fn leftovers(&self, host: &Host, scratch_root: &Path, scratch: &Path) -> Option<String> {
        let paths: Vec<PathBuf> = self
            .ids
            .iter()
            .flat_map(|id| sandbox_traces(host, scratch_root, id))
            .filter(|p| p.exists())
            .collect();
        let procs: Vec<u32> = self
            .init_pids
            .iter()
            .filter(|(p, start)| host.still_running(*p, *start))
            .map(|(p, _)| *p)
            .collect();
        let mounts = host.mounts_mentioning(&scratch.display().to_string());
        if paths.is_empty() && procs.is_empty() && mounts.is_empty() {
            return None;
        }
        Some(format!(
            "Leaks after the daemon stopped ({} sandboxes created): {} paths (e.g. {:?}), {} init pids \
             still alive (e.g. {:?}), {} mounts (e.g. {:?}).",
            self.ids.len(),
            paths.len(),
            paths.first(),
            procs.len(),
            procs.first(),
            mounts.len(),
            mounts.first()
        ))
    }
}

/// Creates a sandbox from the `host` template with the daemon's defaults.
pub async fn create(
    client: &Client,
    ledger: &mut Ledger,
) -> anyhow::Result<(SandboxInfo, Duration)> {
    let req = CreateRequest::default();
    let t = Instant::now();
    let sb = call("creating a sandbox", client.create(&req)).await?;
    let took = t.elapsed();
    ledger.note(&sb);
    ensure!(
        sb.state == SandboxState::Ready,
        "sandbox {} came back {:?}, not ready",
        sb.id,
        sb.state
    );
    Ok((sb, took))
}

/// One sandbox's life: how long its create, destroy and full cleanup took.
struct Cycle {
    create: Duration,
    create_daemon_ms: Option<f64>,
    destroy: Duration,
    cleanup: Duration,
}

/// Creates a sandbox, destroys it, waits until it is fully gone.
async fn cycle(d: &Daemon, host: &Host, ledger: &mut Ledger, first: bool) -> anyhow::Result<Cycle> {
    let (sb, create_took) = create(&d.client, ledger).await?;
    let traces = sandbox_traces(host, &d.scratch_root, sb.id.as_str());
    if first {
        // If none of the paths we wait on exists, "cleanup" would be
        // measured as instant: check that they name real things.
        let present = traces.iter().filter(|p| p.exists()).count();
        ensure!(
            present >= 2,
            "sandbox {} has only {present} of the directories this bench waits on ({traces:?}): \
             the cleanup measure would be meaningless",
            sb.id
        );
    }
    let t = Instant::now();
    call(format!("destroying {}", sb.id), d.client.destroy(&sb.id)).await?;
    let destroy = t.elapsed();
    let Some(cleanup) = wait_gone(host, &traces, sb.init_pid, t, CLEANUP_LIMIT) else {
        let left: Vec<_> = traces.iter().filter(|p| p.exists()).collect();
        bail!(
            "sandbox {} left {left:?} behind {CLEANUP_LIMIT:?} after destroy",
            sb.id
        );
    };
    Ok(Cycle {
        create: create_took,
        create_daemon_ms: sb.create_ms,
        destroy,
        cleanup,
    })
}

/// Cold create, destroy, and full cleanup, one sandbox at a time. Each
/// create starts only after the previous sandbox is fully gone, so it never
/// competes with background cleanup.
///
/// Then `idle.0` more cycles, each after `idle.1` of idleness: a sandbox
/// asked for now and then, rather than in a tight loop, may meet colder
/// caches and kernel state (RCU-synchronised cgroup and mount paths).
pub async fn lifecycle(
    d: &Daemon,
    host: &Host,
    iterations: usize,
    warmup: usize,
    idle: (usize, Duration),
    ledger: &mut Ledger,
    report: &mut Report,
) -> anyhow::Result<()> {
    let mut s: [Samples; 6] = Default::default();
    let mut daemon_ms = Some(Samples::new());
    for i in 0..warmup + iterations {
        let c = cycle(d, host, ledger, i == 0).await?;
        if i >= warmup {
            s[0].push(c.create);
            s[1].push(c.destroy);
            s[2].push(c.cleanup);
            match (&mut daemon_ms, c.create_daemon_ms) {
                (Some(v), Some(ms)) => v.push_ms(ms),
                _ => daemon_ms = None,
            }
        }
    }
    for _ in 0..idle.0 {
        tokio::time::sleep(idle.1).await;
        let c = cycle(d, host, ledger, false).await?;
        s[3].push(c.create);
        s[4].push(c.destroy);
        s[5].push(c.cleanup);
    }
    match daemon_ms {
        Some(v) => report.add("create_daemon", v),
        None => report.note(
            "The daemon did not report `create_ms` for every sandbox; its own figure is left out.",
        ),
    }
    let [create, destroy, cleanup, create_idle, destroy_idle, cleanup_idle] = s;
    report.add("create", create);
    report.add("destroy", destroy);
    report.add("cleanup", cleanup);
    report.add("create_idle", create_idle);
    report.add("destroy_idle", destroy_idle);
    report.add("cleanup_idle", cleanup_idle);
    Ok(())
}

/// Polls until every trace is gone and init has exited; the time since
/// `since`, or `None` once `limit` has passed.
///
/// Polls with a blocking 100 µs sleep: tokio's timer has 1 ms granularity,
/// too coarse for what is measured.
pub fn wait_gone(
    host: &Host,
    traces: &[PathBuf],
    init: Option<u32>,
    since: Instant,
    limit: Duration,
) -> Option<Duration> {
    loop {
        let gone = traces.iter().all(|p| !p.exists()) && init.is_none_or(|pid| !host.running(pid));
        if gone {
            return Some(since.elapsed());
        }
        if since.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// `true` over the API in one sandbox, interleaved with a plain fork+exec
/// of `/bin/true` by this process, so both see the same machine noise.
pub async fn exec(
    d: &Daemon,
    iterations: usize,
    warmup: usize,
    ledger: &mut Ledger,
    report: &mut Report,
) -> anyhow::Result<()> {
    let (sb, _) = create(&d.client, ledger).await?;
    let req = ExecRequest {
        argv: vec!["true".into()],
        ..Default::default()
    };
    let result = async {
        let (mut api, mut daemon, mut fork) = (Samples::new(), Samples::new(), Samples::new());
        for i in 0..warmup + iterations {
            let t = Instant::now();
            let r = call("exec of `true`", d.client.exec(&sb.id, &req)).await?;
            let took = t.elapsed();
            ensure!(
                r.status.exit_code == Some(0),
                "`true` in {} ended with {:?}",
                sb.id,
                r.status
            );
            let t = Instant::now();
            let st = Command::new("/bin/true")
                .stdin(Stdio::null())
                .status()
                .context("running /bin/true")?;
            let forked = t.elapsed();
            ensure!(st.success(), "/bin/true failed on the host: {st}");
            if i >= warmup {
                api.push(took);
                daemon.push_ms(r.duration_us as f64 / 1e3);
                fork.push(forked);
            }
        }
        report.add("exec", api);
        report.add("exec_daemon", daemon);
        report.add("fork_exec", fork);
        Ok(())
    }
    .await;
    call(format!("destroying {}", sb.id), d.client.destroy(&sb.id)).await?;
    result
}
