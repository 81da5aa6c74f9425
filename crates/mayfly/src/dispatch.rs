//! From parsed arguments to a command: the CLI's path (no engine) and
//! `mayflyd`'s (engine in reach).

use crate::cli::{Cli, Command};
use crate::{
    cmd_admin, cmd_artifacts, cmd_cp, cmd_gateway, cmd_park, cmd_pool, cmd_run, cmd_sandbox,
    cmd_serve, cmd_stats, cmd_template, cmd_top, handoff,
};

/// The CLI: client commands on this thread; what needs the engine is
/// handed to `mayflyd`.
pub fn client(cli: Cli) -> anyhow::Result<i32> {
    match &cli.command {
        Command::Serve(_) | Command::Park(_) | Command::Prune => {
            return handoff::exec(&handoff::daemon_path()?, None)
        }
        Command::Run(a) if !cli.daemon_reachable() => {
            let engine = handoff::daemon_path()?;
            if cli.park > 0 {
                let id = mayfly_engine::park::ExeId::of(&engine)?;
                if let Some(code) = cmd_run::try_parked(&cli, a, id)? {
                    return Ok(code);
                }
            }
            // What a parked sandbox's attempt read of stdin goes along.
            let stdin = match a.cmd.interactive {
                true => Some(cmd_run::stdin_bytes()?),
                false => None,
            };
            return handoff::exec(&engine, stdin);
        }
        _ => {}
    }
    init_tracing(false);
    run_client(&cli)
}

/// `mayflyd`: the daemon, a daemonless run's engine, or any client command.
pub fn daemon(cli: Cli) -> anyhow::Result<i32> {
    // The zygote must be forked while this process has exactly one thread,
    // so it is started here, before the async runtime exists.
    let needs_engine = match &cli.command {
        Command::Serve(_) => true,
        Command::Run(_) => !cli.daemon_reachable(),
        _ => false,
    };
    if needs_engine {
        // A daemon holds a few descriptors per sandbox; the default soft
        // limit (often 1024) would cap it at a few hundred sandboxes.
        mayfly_sys::process::raise_nofile_limit()?;
    }
    match &cli.command {
        Command::Park(ref a) => return cmd_park::keeper(&cli, a),
        Command::Prune => return cmd_park::prune(&cli),
        Command::Run(a) if needs_engine && cli.park > 0 => {
            let id = mayfly_engine::park::ExeId::current()?;
            if let Some(code) = cmd_run::try_parked(&cli, a, id)? {
                return Ok(code);
            }
        }
        _ => {}
    }
    let daemon = matches!(cli.command, Command::Serve(_));
    // A daemonless run's zygote starts making the run's sandbox stub right
    // away (see `mayfly_engine::start_one_shot_zygote`).
    let (zygote, one_shot) = match &cli.command {
        Command::Serve(_) => (Some(mayfly_engine::Zygote::start()?), None),
        Command::Run(a) if needs_engine => {
            let mut cfg = cmd_run::engine_config(&cli);
            let req = a.spec.request().ok();
            let zygote = mayfly_engine::start_one_shot_zygote(&mut cfg, req.as_ref())?;
            (None, Some((zygote, cfg)))
        }
        _ => (None, None),
    };
    init_tracing(daemon);
    if !daemon && one_shot.is_none() {
        return run_client(&cli);
    }
    // A one-shot engine needs one worker (its stub is made on the worker
    // while `block_on` opens the store on this thread).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(if daemon { 2 } else { 1 })
        .enable_all()
        .build()?;
    let code = rt.block_on(async move {
        match cli.command {
            Command::Serve(ref a) => cmd_serve::serve(&cli, a, zygote.expect("zygote")).await,
            Command::Run(ref a) => {
                let (zygote, cfg) = one_shot.expect("a daemonless run's engine");
                cmd_run::run_local(&cli, a, zygote, cfg).await
            }
            _ => unreachable!("only serve and a daemonless run start an engine"),
        }
    });
    // The process exits right after: idle blocking-pool threads are not
    // waited for.
    rt.shutdown_background();
    code
}

/// Runs a client command on this thread alone: a worker would be one more
/// thread to start, wake for every response and tear down at exit, which on
/// a busy host costs more than the requests themselves.
fn run_client(cli: &Cli) -> anyhow::Result<i32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let code = rt.block_on(client_command(cli));
    rt.shutdown_background();
    code
}

/// Every command that talks to a daemon (a `run` here is one through it).
async fn client_command(cli: &Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Run(ref a) => cmd_run::run_remote(cli, a).await,
        Command::Create(ref a) => cmd_sandbox::create(cli, a).await,
        Command::Exec(ref a) => cmd_sandbox::exec(cli, a).await,
        Command::Ps(ref a) => cmd_sandbox::ps(cli, a).await,
        Command::Rm(ref a) => cmd_sandbox::rm(cli, a).await,
        Command::Inspect(ref a) => cmd_sandbox::inspect(cli, a).await,
        Command::Egress(ref a) => cmd_sandbox::egress(cli, a).await,
        Command::Events(ref a) => cmd_sandbox::events(cli, a).await,
        Command::Audit(ref a) => cmd_sandbox::audit(cli, a).await,
        Command::Top(ref a) => cmd_top::top(cli, a).await,
        Command::Stats(ref a) => cmd_stats::stats(cli, a).await,
        Command::Cp(ref a) => cmd_cp::cp(cli, a).await,
        Command::Artifacts(ref c) => cmd_artifacts::artifacts(cli, c).await,
        Command::Pool(ref c) => cmd_pool::pool(cli, c).await,
        Command::Template(ref c) => cmd_template::template(cli, c).await,
        Command::Tenant(ref c) => cmd_admin::tenant(cli, c).await,
        Command::Key(ref c) => cmd_admin::key(cli, c).await,
        Command::Ports(ref a) => cmd_gateway::ports(cli, &a.id.parse()?).await,
        Command::Expose(ref a) => cmd_gateway::expose(cli, a).await,
        Command::Unexpose(ref a) => cmd_gateway::unexpose(cli, a).await,
        Command::PortForward(ref a) => cmd_gateway::port_forward(cli, a).await,
        Command::Route(ref c) => cmd_gateway::route(cli, c).await,
        Command::Sandbox(ref c) => cmd_gateway::sandbox(cli, c).await,
        Command::Serve(_) | Command::Park(_) | Command::Prune => {
            unreachable!("engine commands are dispatched before the client runtime")
        }
    }
}

fn init_tracing(daemon: bool) {
    let default = if daemon { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("MAYFLY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
