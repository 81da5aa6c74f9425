//! `mayfly serve`: the daemon.

use std::sync::Arc;

use anyhow::Context;
use mayfly_engine::{Engine, EngineConfig, Zygote};
use mayfly_server::ServerOptions;

use crate::cli::{Cli, ServeArgs, ShutdownMode};

pub async fn serve(cli: &Cli, a: &ServeArgs, zygote: Zygote) -> anyhow::Result<i32> {
    // First: a SIGTERM from the moment anyone can see the daemon (its
    // socket) must be a clean shutdown, never the default action's death.
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    let cfg = EngineConfig {
        state_dir: cli.state_dir.clone(),
        default_ttl: a.default_ttl,
        max_ttl: a.max_ttl,
        default_idle: a.idle_timeout,
        max_sandboxes: a.max_sandboxes,
        pools: a.pools.clone(),
        scratch_dir: a.scratch.clone(),
        template_egress: template_egress(&a.template_egress)?,
        artifact_retention: mayfly_engine::artifacts::Retention {
            max_age: a.artifact_max_age,
            max_bytes: a.artifact_max_bytes,
        },
        artifact_caps: mayfly_engine::artifacts::Caps {
            per_artifact: a.artifact_max_file_bytes,
            per_sandbox: a.artifact_max_sandbox_bytes,
        },
        history: a.history.0,
        tenant_repos: a.tenant_repos.clone(),
        max_commands: a.max_commands_per_sandbox,
        file_buffer_bytes: a.file_buffer_bytes,
        ..EngineConfig::default()
    };
    let engine = Engine::new(cfg, zygote).context("starting the engine")?;
    engine
        .enable_egress(mayfly_engine::egress::EgressConfig {
            names: mayfly_engine::egress::plan::Names::for_state_dir(&cli.state_dir),
            lease_dir: "/run/mayfly/net-slots".into(),
            pool_target: a.egress_pool,
            static_hosts: match &a.dns_hosts {
                Some(f) => read_hosts(f)?,
                None => Default::default(),
            },
        })
        .await;
    // After egress: a configured pool with network needs it.
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
        let max = a.gateway_max_connections as usize;
        let limits = mayfly_server::conn::Limits {
            connections: max,
            upstreams: max,
        };
        let timeouts = mayfly_server::conn::Timeouts::default();
        mayfly_server::gateway::Gateway::with_options(
            api.clone(),
            &a.gateway_domain,
            timeouts,
            limits,
        )
        .spawn(l, a.gateway_threads)
        .context("starting the gateway's threads")?;
    }
    let app = mayfly_server::app(api, opts);
    let mut listeners = vec![mayfly_server::bind_unix(&cli.socket).await?];
    if let Some(addr) = a.tcp {
        listeners.push(mayfly_server::bind_tcp(addr).await?);
    }
    tracing::info!(socket = %cli.socket.display(), "mayfly daemon ready");
    let (mode, grace, stopper) = (a.shutdown, a.shutdown_grace, engine.clone());
    let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        if mode == ShutdownMode::Drain {
            tracing::info!(grace = ?grace, "draining: new creates are refused; waiting for live sandboxes");
            let second = async {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            };
            let left = stopper.drain(grace, second).await;
            tracing::info!(left, "drain over");
        }
        // The sandboxes go before the listeners stop: a request still in
        // flight (an exec of `sleep`, a stream, a wait) ends with its
        // sandbox, instead of holding the shutdown until its TTL.
        tracing::info!("shutting down: destroying live sandboxes");
        stopper.shutdown().await;
        let _ = stopped_tx.send(());
    };
    let served = mayfly_server::serve(app, listeners, shutdown);
    // Requests that outlive every sandbox (a client slow to read its
    // answer) get a few seconds; the daemon does not wait on them longer.
    let linger = async {
        if stopped_rx.await.is_ok() {
            tokio::time::sleep(SHUTDOWN_LINGER).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        r = served => r?,
        () = linger => tracing::warn!(after = ?SHUTDOWN_LINGER, "requests still open at shutdown were cut"),
    }
    engine.wait_cleanup().await;
    Ok(0)
}

/// How long requests still open after every sandbox has gone may take.
const SHUTDOWN_LINGER: std::time::Duration = std::time::Duration::from_secs(5);

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

/// `--template-egress TEMPLATE=FILE`: each file holds one JSON policy.
fn template_egress(
    flags: &[(String, String)],
) -> anyhow::Result<Vec<(mayfly_types::TemplateRef, mayfly_types::EgressPolicy)>> {
    flags
        .iter()
        .map(|(t, f)| {
            let template = t
                .parse()
                .with_context(|| format!("--template-egress {t}"))?;
            let text = std::fs::read_to_string(f).with_context(|| format!("reading {f}"))?;
            let policy: mayfly_types::EgressPolicy =
                serde_json::from_str(&text).with_context(|| format!("the egress policy in {f}"))?;
            policy
                .validate()
                .with_context(|| format!("the egress policy in {f}"))?;
            Ok((template, policy))
        })
        .collect()
}

/// An `/etc/hosts`-format file: `ADDRESS NAME…` lines, `#` comments;
/// IPv4 addresses only (sandboxes have no IPv6).
fn read_hosts(
    path: &std::path::Path,
) -> anyhow::Result<std::collections::HashMap<String, Vec<std::net::Ipv4Addr>>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the DNS hosts file {}", path.display()))?;
    let mut table: std::collections::HashMap<String, Vec<std::net::Ipv4Addr>> = Default::default();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        let Some(addr) = words.next() else { continue };
        let Ok(addr) = addr.parse::<std::net::Ipv4Addr>() else {
            continue;
        };
        for name in words {
            table
                .entry(name.trim_end_matches('.').to_ascii_lowercase())
                .or_default()
                .push(addr);
        }
    }
    Ok(table)
}
