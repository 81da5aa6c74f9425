//! The API measures, against a daemon this bench started: create→ready,
//! destroy (the call, then full cleanup) and the exec round trip.

use std::path::PathBuf;
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

/// Sandboxes this bench created, so the final leak check knows what to look for.
#[derive(Debug, Default)]
pub struct Ledger {
    pub ids: Vec<String>,
    pub init_pids: Vec<u32>,
}

impl Ledger {
    pub fn note(&mut self, sb: &SandboxInfo) {
        self.ids.push(sb.id.to_string());
        self.init_pids.extend(sb.init_pid);
    }
}

/// Creates a sandbox from the `host` template with the daemon's defaults.
pub async fn create(
    client: &Client,
    ledger: &mut Ledger,
) -> anyhow::Result<(SandboxInfo, Duration)> {
    let req = CreateRequest::default();
    let t = Instant::now();
    let sb = client.create(&req).await.context("creating a sandbox")?;
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

/// Cold create, destroy, and full cleanup, one sandbox at a time. Each
/// create starts only after the previous sandbox is fully gone, so it never
/// competes with background cleanup.
pub async fn lifecycle(
    d: &Daemon,
    host: &Host,
    iterations: usize,
    warmup: usize,
    ledger: &mut Ledger,
    report: &mut Report,
) -> anyhow::Result<()> {
    let (mut create_s, mut create_d, mut destroy_s, mut cleanup_s) = (
        Samples::new(),
        Samples::new(),
        Samples::new(),
        Samples::new(),
    );
    for i in 0..warmup + iterations {
        let (sb, took) = create(&d.client, ledger).await?;
        let traces = sandbox_traces(host, &d.state_dir, sb.id.as_str());
        if i == 0 {
            // If none of the paths we wait on exists, "cleanup" would be
            // measured as instant: check that they name real things.
            let present = traces.iter().filter(|p| p.exists()).count();
            ensure!(
                present >= 2,
                "sandbox {} has only {present} of the directories this bench waits on ({:?}): \
                 the cleanup measure would be meaningless",
                sb.id,
                traces
            );
        }
        let t = Instant::now();
        d.client
            .destroy(&sb.id)
            .await
            .with_context(|| format!("destroying {}", sb.id))?;
        let destroy = t.elapsed();
        let Some(full) = wait_gone(host, &traces, sb.init_pid, t, CLEANUP_LIMIT) else {
            let left: Vec<_> = traces.iter().filter(|p| p.exists()).collect();
            bail!(
                "sandbox {} left {left:?} behind {CLEANUP_LIMIT:?} after destroy",
                sb.id
            );
        };
        if i >= warmup {
            create_s.push(took);
            create_d.push_ms(sb.create_ms.unwrap_or(f64::NAN));
            destroy_s.push(destroy);
            cleanup_s.push(full);
        }
    }
    if create_d.values().iter().all(|v| v.is_finite()) {
        report.add("create_daemon", create_d);
    } else {
        report.note(
            "The daemon did not report `create_ms` for every sandbox; its own figure is left out.",
        );
    }
    report.add("create", create_s);
    report.add("destroy", destroy_s);
    report.add("cleanup", cleanup_s);
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
        let gone = traces.iter().all(|p| !p.exists()) && init.is_none_or(|pid| !host.alive(pid));
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
            let r = d
                .client
                .exec(&sb.id, &req)
                .await
                .context("exec of `true`")?;
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
    d.client
        .destroy(&sb.id)
        .await
        .with_context(|| format!("destroying {}", sb.id))?;
    result
}
