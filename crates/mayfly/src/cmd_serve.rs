//! `mayfly serve`: the daemon.

use std::sync::Arc;

use anyhow::Context;
use mayfly_engine::{Engine, EngineConfig, Zygote};
use mayfly_server::ServerOptions;

use crate::cli::{Cli, ServeArgs, ShutdownMode};

pub async fn serve(cli: &Cli, a: &ServeArgs, zygote: Zygote) -> anyhow::Result<i32> {
    let cfg = EngineConfig {
        state_dir: cli.state_dir.clone(),
        default_ttl: a.default_ttl,
        max_ttl: a.max_ttl,
        default_idle: a.idle_timeout,
        max_sandboxes: a.max_sandboxes,
        pools: a.pools.clone(),
        scratch_dir: a.scratch.clone(),
        ..EngineConfig::default()
    };
    let engine = Engine::new(cfg, zygote).context("starting the engine")?;
    engine.start_background();
    let token = match (&a.token_file, &cli.token) {
        (Some(f), _) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("reading the token file {}", f.display()))?
                .trim()
                .to_owned(),
        ),
        (None, t) => t.clone(),
    };
    if a.tcp.is_some() && token.as_deref().is_none_or(str::is_empty) {
        anyhow::bail!("--tcp needs a bearer token: pass --token-file or set MAYFLY_TOKEN");
    }
    let api: Arc<dyn mayfly_engine::SandboxApi> = Arc::new(engine.clone());
    let gateway = bind_gateway(a).await?;
    let opts = ServerOptions {
        tcp_token: token,
        gateway: gateway.as_ref().and_then(|l| {
            Some(mayfly_server::GatewayAddr {
                domain: a.gateway_domain.clone(),
                port: l.local_addr().ok()?.port(),
            })
        }),
        ..ServerOptions::default()
    };
    if let Some(l) = gateway {
        tracing::info!(addr = ?l.local_addr().ok(), domain = %a.gateway_domain, "gateway ready");
        mayfly_server::gateway::Gateway::new(api.clone(), &a.gateway_domain)
            .spawn(l, a.gateway_threads)
            .context("starting the gateway's threads")?;
    }
    let app = mayfly_server::app(api, opts);
    let mut listeners = vec![mayfly_server::bind_unix(&cli.socket).await?];
    if let Some(addr) = a.tcp {
        listeners.push(mayfly_server::bind_tcp(addr).await?);
    }
    tracing::info!(socket = %cli.socket.display(), "mayfly daemon ready");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing a SIGTERM handler")?;
    let (mode, grace, drainer) = (a.shutdown, a.shutdown_grace, engine.clone());
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        if mode == ShutdownMode::Drain {
            tracing::info!(grace = ?grace, "draining: new creates are refused; waiting for live sandboxes");
            let second = async {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            };
            let left = drainer.drain(grace, second).await;
            tracing::info!(left, "drain over");
        }
    };
    mayfly_server::serve(app, listeners, shutdown).await?;
    tracing::info!("shutting down: destroying live sandboxes");
    engine.shutdown().await;
    engine.wait_cleanup().await;
    Ok(0)
}

/// The gateway's listener: the address given, `off` for none, or the
/// default one, which may be taken (then the daemon runs without a gateway
/// and says so, so several daemons can share a host).
async fn bind_gateway(a: &ServeArgs) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    use mayfly_server::gateway::DEFAULT_GATEWAY_ADDR;
    match a.gateway.as_deref() {
        Some("off") => Ok(None),
        Some(addr) => {
            let addr: std::net::SocketAddr = addr
                .parse()
                .with_context(|| format!("--gateway {addr}: expected IP:PORT or `off`"))?;
            Ok(Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding the gateway on {addr}"))?,
            ))
        }
        None => match tokio::net::TcpListener::bind(DEFAULT_GATEWAY_ADDR).await {
            Ok(l) => Ok(Some(l)),
            Err(e) => {
                tracing::warn!(addr = DEFAULT_GATEWAY_ADDR, error = %e,
                    "the default gateway address is taken: running without a gateway (pass --gateway ADDR)");
                Ok(None)
            }
        },
    }
}
