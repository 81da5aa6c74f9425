//! `mayfly park` (a keeper: one sandbox booted ahead for the next
//! daemonless run; see `mayfly_engine::park`) and `mayfly prune`.

use std::time::Duration;

use mayfly_engine::park::{self, Claim, Keeper, Next};
use mayfly_engine::{Caller, Engine, EngineConfig, SandboxApi, Zygote};
use mayfly_types::{CreateRequest, SandboxId};
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::{Cli, ParkArgs, SpecArgs};
use crate::{cmd_run, output};

/// How long `mayfly prune` waits for keepers to destroy their sandboxes.
const PRUNE_TIMEOUT: Duration = Duration::from_secs(30);

/// The keeper's life. Started detached by a run's reaper; exits at once if
/// its state directory already has as many keepers as wanted.
pub fn keeper(cli: &Cli, a: &ParkArgs) -> anyhow::Result<i32> {
    let mut cfg = cmd_run::engine_config(cli);
    let dir = park::park_dir(&cfg.state_dir);
    park::prepare_dir(&dir)?;
    let Some(slot) = park::take_slot(&dir, cli.park)? else {
        return Ok(0);
    };
    if a.after.is_some_and(|t| park::pruned_since(&dir, t)) {
        return Ok(0);
    }
    let spec = SpecArgs::parked_request();
    // Forked before the runtime has threads, as for a run.
    let zygote = mayfly_engine::start_one_shot_zygote(&mut cfg, Some(&spec))?;
    // One thread: a keeper does one thing at a time, and waking a worker
    // from the thread that polls would cost every claim a switch.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let idle = cli.park_idle;
    let code = rt.block_on(async move { keep(cfg, zygote, spec, slot, idle).await });
    rt.shutdown_background();
    code
}

async fn keep(
    cfg: EngineConfig,
    zygote: Zygote,
    spec: CreateRequest,
    slot: park::Slot,
    idle: Duration,
) -> anyhow::Result<i32> {
    let dir = park::park_dir(&cfg.state_dir);
    let engine = Engine::new(cfg, zygote)?;
    let sb = match engine.create(spec.clone(), &Caller::new("park")).await {
        Ok(sb) => sb,
        Err(e) => {
            engine.shutdown().await;
            return Err(e.into());
        }
    };
    // The reaper that will finish its destroy is forked now, off the
    // claiming run's path (a retiring keeper dismisses it).
    if let Err(e) = engine.prepare_reaper_now(&sb.id).await {
        tracing::warn!(error = %e, "preparing a reaper failed");
    }
    let keeper = match Keeper::bind(&dir, slot, sb.id.clone(), &spec) {
        Ok(k) => k,
        Err(e) => {
            engine.shutdown().await;
            return Err(e.into());
        }
    };
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let next = tokio::select! {
        n = keeper.next() => n,
        _ = tokio::time::sleep(idle) => Ok(Next::Retire { why: "parked_idle", _asker: None }),
        _ = term.recv() => Ok(Next::Retire { why: "parked_signal", _asker: None }),
        _ = int.recv() => Ok(Next::Retire { why: "parked_signal", _asker: None }),
    };
    match next {
        Ok(Next::Claim(claim)) => {
            serve(&engine, &sb.id, *claim).await;
            // Skip the store's close-time checkpoint, as a run does.
            std::mem::forget(engine);
            Ok(0)
        }
        Ok(Next::Retire { why, _asker }) => {
            tracing::debug!(why, "retiring");
            keeper.close();
            engine.shutdown_for(why).await;
            Ok(0)
        }
        Err(e) => {
            keeper.close();
            engine.shutdown().await;
            Err(e.into())
        }
    }
}

/// Runs a claimed command as a cold run would, writing its output to the
/// run's streams. Then kills the sandbox, closes the streams, tells the
/// run its exit code, and hands the rest of the destroy to the reaper
/// (which starts the next keeper).
async fn serve(engine: &Engine, id: &SandboxId, claim: Claim) {
    let Claim {
        mut exec,
        ttl_secs,
        stdin,
        json,
        pid,
        stdio,
        reply,
    } = claim;
    let caller = Caller::new(format!("cli:pid={pid}"));
    let mut out = std::fs::File::from(stdio.stdout);
    let mut err = std::fs::File::from(stdio.stderr);
    let mut recorded = None;
    let run = async {
        recorded = Some(engine.renew_ttl(id, ttl_secs)?);
        exec.stdin = stdin.map(Into::into);
        cmd_run::exec_to(engine, id, exec, json, &caller, &mut out, &mut err).await
    };
    let code = tokio::select! {
        r = run => r.unwrap_or_else(|e| {
            let _ = std::io::Write::write_all(&mut err, format!("mayfly: {e:#}\n").as_bytes());
            output::exit_code_for(&e)
        }),
        // The run died; its command dies too, as a cold run's would.
        _ = reply.hung_up() => 125,
    };
    // As with a cold run, nothing of the sandbox runs once the run returns.
    let stopped = engine.stop_detached(id, "user").await;
    drop((out, err));
    reply.finish(code);
    if let Some(h) = recorded {
        let _ = h.await;
    }
    if let Err(e) = stopped.and_then(|d| d.hand_over()) {
        tracing::warn!(error = %e, "destroying a claimed sandbox failed");
    }
}

/// `mayfly prune`: retires this state directory's keepers (each destroys
/// its parked sandbox) and removes the spare namespaces.
pub fn prune(cli: &Cli) -> anyhow::Result<i32> {
    let retired = park::retire_all(&park::park_dir(&cli.state_dir), PRUNE_TIMEOUT)?;
    let spares = mayfly_sys::spare_ns::count(&cli.spare_ns_dir);
    mayfly_sys::spare_ns::drain(&cli.spare_ns_dir);
    if cli.json {
        output::json(&serde_json::json!({
            "parked_sandboxes_removed": retired,
            "spare_namespace_sets_removed": spares,
        }))?;
    } else {
        println!("removed {retired} parked sandboxes and {spares} spare namespace sets");
    }
    Ok(0)
}
