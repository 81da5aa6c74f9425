//! `mayfly run`: create, run one command, destroy. Through the daemon when
//! one answers; otherwise with the same engine in this process.

use std::io::Read;
use std::os::fd::AsFd;

use mayfly_engine::park::{self, ClaimRequest, ParkPlan};

use mayfly_engine::{Caller, Engine, EngineConfig, SandboxApi, Zygote};
use mayfly_types::{ExecEvent, ExecRequest, RunRequest};

use crate::cli::{Cli, CommandArgs, RunArgs};
use crate::output;

pub fn exec_request(cmd: &CommandArgs, env: &[(String, String)]) -> anyhow::Result<ExecRequest> {
    let mut req = exec_request_without_stdin(cmd, env);
    if cmd.interactive {
        req.stdin = Some(stdin_bytes()?.to_vec().into());
    }
    Ok(req)
}

/// This process's stdin, read to its end once (a run that a parked
/// sandbox does not take goes cold with what it read).
pub fn stdin_bytes() -> std::io::Result<&'static [u8]> {
    static STDIN: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    if let Some(b) = STDIN.get() {
        return Ok(b);
    }
    let mut buf = Vec::new();
    std::io::stdin().read_to_end(&mut buf)?;
    Ok(STDIN.get_or_init(|| buf))
}

/// The request, with `--interactive`'s stdin still unread.
pub fn exec_request_without_stdin(cmd: &CommandArgs, env: &[(String, String)]) -> ExecRequest {
    ExecRequest {
        argv: cmd.argv.clone(),
        env: env.iter().cloned().collect(),
        cwd: cmd.cwd.clone(),
        uid: cmd.user,
        gid: None,
        stdin: None,
        timeout_ms: cmd.timeout.map(|t| t.as_millis().max(1) as u64),
        output_limit: None,
        ..ExecRequest::default()
    }
}

/// The engine settings of a daemonless run (and of a keeper, which is
/// one ahead of time).
pub fn engine_config(cli: &Cli) -> EngineConfig {
    let state_dir = std::path::absolute(&cli.state_dir).unwrap_or_else(|_| cli.state_dir.clone());
    let spare_ns_dir =
        std::path::absolute(&cli.spare_ns_dir).unwrap_or_else(|_| cli.spare_ns_dir.clone());
    let park = (cli.park > 0).then(|| ParkPlan {
        dir: park::park_dir(&state_dir),
        target: cli.park,
        argv: vec![
            "--state-dir".into(),
            state_dir.clone().into(),
            "--spare-ns-dir".into(),
            spare_ns_dir.clone().into(),
            "--park".into(),
            cli.park.to_string().into(),
            "--park-idle".into(),
            humantime::format_duration(cli.park_idle).to_string().into(),
            "park".into(),
        ],
    });
    EngineConfig {
        state_dir,
        stub_pool: 0,
        spare_ns_dir: Some(spare_ns_dir),
        park,
        ..EngineConfig::default()
    }
}

/// Hands a daemonless run to a parked sandbox, if one takes it; None when
/// none did (nothing ran) and the run goes cold. The command's output goes
/// straight to this process's streams, written by the sandbox's keeper.
/// `engine`: the binary that would run it cold (only a keeper of that
/// build takes it).
pub fn try_parked(cli: &Cli, a: &RunArgs, engine: park::ExeId) -> anyhow::Result<Option<i32>> {
    let Ok(create) = a.spec.request() else {
        return Ok(None);
    };
    let exec = exec_request_without_stdin(&a.cmd, &[]);
    let stdin = if a.cmd.interactive {
        Some(stdin_bytes()?)
    } else {
        None
    };
    let (stdout, stderr) = (std::io::stdout(), std::io::stderr());
    let req = ClaimRequest {
        create: &create,
        exec: &exec,
        stdin,
        json: cli.json,
        stdio: [stdout.as_fd(), stderr.as_fd()],
        engine,
    };
    let dir = park::park_dir(&cli.state_dir);
    let Some(claimed) = park::try_claim(&dir, &req)? else {
        return Ok(None);
    };
    tracing::debug!(id = %claimed.id, "served by a parked sandbox");
    Ok(Some(claimed.wait()?))
}

/// A run through the daemon: one request, and the daemon destroys the
/// sandbox when the command ends.
pub async fn run_remote(cli: &Cli, a: &RunArgs) -> anyhow::Result<i32> {
    let create = a.spec.request()?;
    let exec = exec_request(&a.cmd, &[])?;
    let client = cli.client()?;
    if cli.json {
        // The buffered result keeps the output in the JSON document.
        let sb = client.create(&create).await?;
        let result = client.exec(&sb.id, &exec).await;
        client.destroy(&sb.id).await?;
        return output::finish(&result?, true);
    }
    let req = RunRequest {
        sandbox: create,
        exec,
    };
    let (id, mut stream) = client.run(&req).await?;
    tracing::debug!(%id, "running");
    while let Some(ev) = stream.next_event().await? {
        if let ExecEvent::Exit(r) = &ev {
            return output::finish(r, false);
        }
        output::write_event(&ev)?;
    }
    anyhow::bail!("the daemon ended the stream of sandbox {id} without an exit status")
}

/// A daemonless run with this process's engine.
pub async fn run_local(
    cli: &Cli,
    a: &RunArgs,
    zygote: Zygote,
    cfg: EngineConfig,
) -> anyhow::Result<i32> {
    let requests = a
        .spec
        .request()
        .and_then(|create| Ok((create, exec_request(&a.cmd, &[])?)));
    let t = std::time::Instant::now();
    let engine = Engine::new(cfg, zygote)?;
    tracing::debug!(ms = t.elapsed().as_secs_f64() * 1e3, "engine ready");
    let (create, exec) = match requests {
        Ok(r) => r,
        Err(e) => {
            // The sandbox's stub is already being made: discard it.
            engine.shutdown().await;
            return Err(e);
        }
    };
    let caller = Caller::new(format!("cli:pid={}", std::process::id()));
    let sb = match engine.create(create, &caller).await {
        Ok(sb) => sb,
        Err(e) => {
            // Nothing of the sandbox is left (create cleans up after
            // itself); the stub made ahead for it is discarded here.
            engine.shutdown().await;
            return Err(e.into());
        }
    };
    tracing::debug!(ms = t.elapsed().as_secs_f64() * 1e3, "sandbox ready");
    // Forked before the command starts: a run killed at any moment after
    // it has a reaper to clean up (one forked while the command ran left a
    // window, at its first milliseconds, where a `kill -9` left the sandbox
    // to the next run's recovery). Without one, the destroy below is done
    // in this process instead.
    if let Err(e) = engine.prepare_reaper_now(&sb.id).await {
        tracing::warn!(error = %e, "preparing a reaper failed");
    }
    let result = exec_to(
        &engine,
        &sb.id,
        exec,
        cli.json,
        &caller,
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    )
    .await;
    tracing::debug!(ms = t.elapsed().as_secs_f64() * 1e3, "command done");
    // Killed by SIGKILL: say so if it was the OOM killer (the record and
    // its `oom_kill` events say it too).
    if matches!(result, Ok(137)) && engine.oom_killed(&sb.id) {
        eprintln!("mayfly: the OOM killer killed in the sandbox (it reached its memory limit)");
    }
    // Every process of the sandbox is sent SIGKILL before this returns; a
    // detached reaper removes its directories and cgroups and records it
    // destroyed (`mayfly ps` shows it `stopping` until then).
    tracing::debug!(id = %sb.id, caller = %caller.name, "destroy");
    engine.destroy_detached(&sb.id, "user").await?;
    tracing::debug!(ms = t.elapsed().as_secs_f64() * 1e3, "handed to a reaper");
    // The process exits next. Closing the store here would checkpoint its
    // WAL while the caller waits; the reaper's connection closes last and
    // checkpoints instead (SQLite's WAL needs no close to be durable).
    std::mem::forget(engine);
    result
}

/// Runs a run's command in its sandbox, writing its output (raw, or the
/// result as JSON) to `out` and `err`, and returns the exit code. The
/// sandbox's TTL bounds it: past its deadline the caller's destroy kills
/// the command (a one-shot engine has no TTL reaper; this is it).
pub async fn exec_to(
    engine: &Engine,
    id: &mayfly_types::SandboxId,
    exec: ExecRequest,
    json: bool,
    caller: &Caller,
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
) -> anyhow::Result<i32> {
    let left = engine.ttl_left(id)?;
    let run = async {
        if json {
            let r = engine.exec(id, exec, caller).await?;
            return output::finish_to(&r, true, out, err);
        }
        let mut rx = engine.exec_stream(id, exec, caller).await?;
        while let Some(ev) = rx.recv().await {
            if let ExecEvent::Exit(r) = &ev {
                return output::finish_to(r, false, out, err);
            }
            output::write_event_to(&ev, out, err)?;
        }
        anyhow::bail!("the sandbox ended before the command reported an exit status")
    };
    match tokio::time::timeout(left, run).await {
        Ok(r) => r,
        Err(_) => {
            writeln!(
                err,
                "mayfly: the sandbox reached the end of its TTL; it and the command were killed"
            )?;
            Ok(137)
        }
    }
}
