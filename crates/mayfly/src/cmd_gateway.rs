//! The gateway's commands: `mayfly ports|expose|unexpose|port-forward`,
//! `mayfly route add|ls|rm` and `mayfly sandbox override`.

use std::net::SocketAddr;

use anyhow::Context;
use clap::{Args, Subcommand};
use mayfly_types::{check_service_name, BaselineUrl, SandboxId};

use crate::cli::Cli;
use crate::output;

#[derive(Debug, Args)]
pub struct ExposeArgs {
    pub id: SandboxId,
    /// The port inside the sandbox (1-65535).
    pub port: u16,
    /// Reachable through the gateway without the sandbox's token.
    #[arg(long)]
    pub public: bool,
}

#[derive(Debug, Args)]
pub struct PortArgs {
    pub id: SandboxId,
    /// The port inside the sandbox (1-65535).
    pub port: u16,
}

#[derive(Debug, Args)]
pub struct ForwardArgs {
    pub id: SandboxId,
    /// The port inside the sandbox (1-65535).
    pub port: u16,
    /// Where to listen on the host.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
}

#[derive(Debug, Subcommand)]
pub enum RouteCmd {
    /// Create or replace a route: a service and its shared baseline (admin).
    Add {
        name: String,
        /// `http://HOST[:PORT][/PREFIX]`
        #[arg(value_name = "URL")]
        baseline: String,
    },
    /// List the routes.
    Ls,
    /// Remove a route (admin).
    Rm { name: String },
}

#[derive(Debug, Subcommand)]
pub enum SandboxCmd {
    /// Route a service to a port of this sandbox for requests that carry
    /// its routing key (`--rm` to route them to the baseline again).
    Override {
        id: SandboxId,
        service: String,
        /// The port inside the sandbox that serves the service.
        #[arg(required_unless_present = "rm")]
        port: Option<u16>,
        #[arg(long)]
        rm: bool,
    },
}

fn port_ok(port: u16) -> anyhow::Result<()> {
    anyhow::ensure!(port > 0, "port 0 is out of range: expected 1 to 65535");
    Ok(())
}

/// `mayfly ports ID`: the token, exposed ports and overrides.
pub async fn ports(cli: &Cli, id: &SandboxId) -> anyhow::Result<i32> {
    let p = crate::cmd_sandbox::client(cli)?.ports(id).await?;
    if cli.json {
        output::json(&p)?;
        return Ok(0);
    }
    println!("token   {}", p.token);
    for port in &p.ports {
        let access = if port.public { "public" } else { "token" };
        println!(
            "port    {:<5}  {access:<6}  {}",
            port.port,
            port.url.as_deref().unwrap_or("-")
        );
    }
    for o in &p.overrides {
        println!("service {:<20} -> port {}", o.service, o.port);
    }
    Ok(0)
}

pub async fn expose(cli: &Cli, a: &ExposeArgs) -> anyhow::Result<i32> {
    port_ok(a.port)?;
    let p = crate::cmd_sandbox::client(cli)?
        .expose(&a.id, a.port, a.public)
        .await?;
    if cli.json {
        output::json(&p)?;
    } else {
        println!(
            "{}",
            p.url.unwrap_or_else(|| format!("port {} exposed", p.port))
        );
    }
    Ok(0)
}

pub async fn unexpose(cli: &Cli, a: &PortArgs) -> anyhow::Result<i32> {
    port_ok(a.port)?;
    crate::cmd_sandbox::client(cli)?
        .unexpose(&a.id, a.port)
        .await?;
    Ok(0)
}

/// `mayfly port-forward ID PORT --listen ADDR`: every connection to ADDR
/// becomes a TCP connection to PORT inside the sandbox, through the API.
pub async fn port_forward(cli: &Cli, a: &ForwardArgs) -> anyhow::Result<i32> {
    port_ok(a.port)?;
    let c = crate::cmd_sandbox::client(cli)?;
    // Fail now, not at the first connection, if the sandbox is not there.
    c.ports(&a.id).await?;
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("listening on {}", a.listen))?;
    let local = listener.local_addr()?;
    println!("forwarding {local} -> {}:{}", a.id, a.port);
    use std::io::Write as _;
    std::io::stdout().flush()?;
    loop {
        tokio::select! {
            acc = listener.accept() => {
                let (mut s, _) = acc.context("accepting a connection")?;
                let (c, id, port) = (c.clone(), a.id.clone(), a.port);
                tokio::spawn(async move {
                    match c.connect_port(&id, port).await {
                        Ok(mut up) => {
                            let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
                        }
                        Err(e) => eprintln!("mayfly: port-forward: {e}"),
                    }
                });
            }
            _ = tokio::signal::ctrl_c() => return Ok(0),
        }
    }
}

pub async fn route(cli: &Cli, cmd: &RouteCmd) -> anyhow::Result<i32> {
    let c = crate::cmd_sandbox::client(cli)?;
    match cmd {
        RouteCmd::Add { name, baseline } => {
            check_service_name(name)?;
            BaselineUrl::parse(baseline)?;
            let r = c.put_route(name, baseline).await?;
            if cli.json {
                output::json(&r)?;
            }
        }
        RouteCmd::Ls => {
            let routes = c.routes().await?;
            if cli.json {
                output::json(&routes)?;
            } else {
                for r in routes {
                    println!("{:<24} {}", r.name, r.url);
                }
            }
        }
        RouteCmd::Rm { name } => {
            check_service_name(name)?;
            c.delete_route(name).await?;
        }
    }
    Ok(0)
}

pub async fn sandbox(cli: &Cli, cmd: &SandboxCmd) -> anyhow::Result<i32> {
    let c = crate::cmd_sandbox::client(cli)?;
    match cmd {
        SandboxCmd::Override {
            id,
            service,
            port,
            rm,
        } => {
            check_service_name(service)?;
            match (rm, port) {
                (true, _) => c.remove_override(id, service).await?,
                (false, Some(p)) => {
                    port_ok(*p)?;
                    let o = c.set_override(id, service, *p).await?;
                    if cli.json {
                        output::json(&o)?;
                    }
                }
                (false, None) => anyhow::bail!("give the port that serves {service}, or --rm"),
            }
        }
    }
    Ok(0)
}
