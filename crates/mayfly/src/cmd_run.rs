//! `mayfly run`: create, run one command, destroy. Through the daemon when
//! one answers; otherwise with the same engine in this process.

use std::io::Read;

use mayfly_engine::{Caller, Engine, EngineConfig, SandboxApi, Zygote};
use mayfly_types::{ExecEvent, ExecRequest};

use crate::cli::{Cli, CommandArgs, RunArgs};
use crate::output;

pub fn exec_request(cmd: &CommandArgs, env: &[(String, String)]) -> anyhow::Result<ExecRequest> {
    let stdin = if cmd.interactive {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf)?;
        Some(buf.into())
    } else {
        None
    };
    Ok(ExecRequest {
        argv: cmd.argv.clone(),
        env: env.iter().cloned().collect(),
        cwd: cmd.cwd.clone(),
        uid: cmd.user,
        gid: None,
        stdin,
        timeout_ms: cmd.timeout.map(|t| t.as_millis().max(1) as u64),
        output_limit: None,
    })
}

/// The engine settings of a daemonless run.
pub fn engine_config(cli: &Cli) -> EngineConfig {
    EngineConfig {
        state_dir: cli.state_dir.clone(),
        stub_pool: 0,
        spare_ns_dir: Some(cli.spare_ns_dir.clone()),
        ..EngineConfig::default()
    }
}

pub async fn run(
    cli: &Cli,
    a: &RunArgs,
    one_shot: Option<(Zygote, EngineConfig)>,
) -> anyhow::Result<i32> {
    let requests = a
        .spec
        .request()
        .and_then(|create| Ok((create, exec_request(&a.cmd, &[])?)));
    match one_shot {
        None => {
            let (create, exec) = requests?;
            run_remote(cli, create, exec).await
        }
        Some((zygote, cfg)) => run_local(cli, zygote, cfg, requests).await,
    }
}

async fn run_remote(
    cli: &Cli,
    create: mayfly_types::CreateRequest,
    exec: ExecRequest,
) -> anyhow::Result<i32> {
    let client = cli.client()?;
    let sb = client.create(&create).await?;
    let result = async {
        if cli.json {
            let r = client.exec(&sb.id, &exec).await?;
            return output::finish(&r, true);
        }
        let mut stream = client.exec_stream(&sb.id, &exec).await?;
        while let Some(ev) = stream.next_event().await? {
            if let ExecEvent::Exit(r) = &ev {
                return output::finish(r, false);
            }
            output::write_event(&ev)?;
        }
        anyhow::bail!("the daemon ended the stream without an exit status")
    }
    .await;
    client.destroy(&sb.id).await?;
    result
}

async fn run_local(
    cli: &Cli,
    zygote: Zygote,
    cfg: EngineConfig,
    requests: anyhow::Result<(mayfly_types::CreateRequest, ExecRequest)>,
) -> anyhow::Result<i32> {
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
    // Forked while the command runs; without one, the destroy below is
    // done in this process instead.
    if let Err(e) = engine.prepare_reaper(&sb.id) {
        tracing::warn!(error = %e, "preparing a reaper failed");
    }
    let result = async {
        if cli.json {
            let r = engine.exec(&sb.id, exec, &caller).await?;
            return output::finish(&r, true);
        }
        let mut rx = engine.exec_stream(&sb.id, exec, &caller).await?;
        while let Some(ev) = rx.recv().await {
            if let ExecEvent::Exit(r) = &ev {
                return output::finish(r, false);
            }
            output::write_event(&ev)?;
        }
        anyhow::bail!("the sandbox ended before the command reported an exit status")
    }
    .await;
    tracing::debug!(ms = t.elapsed().as_secs_f64() * 1e3, "command done");
    // Every process of the sandbox is sent SIGKILL before this returns; a
    // detached reaper removes its directories and cgroups and records it
    // destroyed (`mayfly ps` shows it `stopping` until then).
    tracing::debug!(id = %sb.id, caller = %caller.0, "destroy");
    engine.destroy_detached(&sb.id, "user").await?;
    tracing::debug!(ms = t.elapsed().as_secs_f64() * 1e3, "handed to a reaper");
    // The process exits next. Closing the store here would checkpoint its
    // WAL while the caller waits; the reaper's connection closes last and
    // checkpoints instead (SQLite's WAL needs no close to be durable).
    std::mem::forget(engine);
    result
}
