//! Command-line arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use mayfly_client::Client;
use mayfly_types::{CreateRequest, Limits, TemplateRef};

pub use crate::parse::{parse_history, parse_kv, parse_size, History};

mod serve;
pub use serve::{ServeArgs, ShutdownMode};

pub const DEFAULT_SOCKET: &str = "/run/mayfly/mayfly.sock";

/// Ephemeral, isolated sandboxes for agents and CI.
#[derive(Debug, Parser)]
#[command(name = "mayfly", version, about)]
pub struct Cli {
    /// The daemon's unix socket.
    #[arg(long, global = true, env = "MAYFLY_SOCKET", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Talk to a daemon over TCP instead (e.g. http://127.0.0.1:7777).
    #[arg(long, global = true, env = "MAYFLY_URL")]
    pub url: Option<String>,
    /// Bearer token for --url.
    #[arg(long, global = true, env = "MAYFLY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// An API key (`mfk_…`): act as its tenant, on the socket or --url.
    #[arg(long, global = true, env = "MAYFLY_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// State directory (store, sandbox layers) for the daemon and daemonless runs.
    #[arg(
        long,
        global = true,
        env = "MAYFLY_STATE_DIR",
        default_value = "/var/lib/mayfly"
    )]
    pub state_dir: PathBuf,
    /// Where daemonless runs keep pre-opened network, UTS and IPC
    /// namespaces (host-wide; each set is used once).
    #[arg(
        long,
        global = true,
        hide = true,
        env = "MAYFLY_SPARE_NS_DIR",
        default_value = mayfly_engine::DEFAULT_SPARE_NS_DIR
    )]
    pub spare_ns_dir: PathBuf,
    /// Sandboxes daemonless runs keep booted ahead for the next runs, per
    /// state directory (0: none; each is used once, then replaced).
    #[arg(long, global = true, env = "MAYFLY_PARK", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(0..=mayfly_engine::park::MAX_KEEPERS as i64))]
    pub park: u32,
    /// How long a parked sandbox waits for a run before it is destroyed.
    #[arg(long, global = true, env = "MAYFLY_PARK_IDLE", default_value = "10m",
          value_parser = humantime::parse_duration)]
    pub park_idle: std::time::Duration,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Serve(ServeArgs),
    /// Create a sandbox, run one command in it, destroy it.
    Run(RunArgs),
    /// Create a sandbox and print its id.
    Create(CreateArgs),
    /// Run a command in a sandbox.
    Exec(ExecArgs),
    /// List sandboxes.
    Ps(PsArgs),
    /// Destroy sandboxes.
    Rm(RmArgs),
    /// Show one sandbox.
    Inspect(IdArgs),
    /// Show a sandbox's egress policy, or replace it live with the flags.
    Egress(EgressCmdArgs),
    /// Show lifecycle events.
    Events(EventsArgs),
    /// Show a sandbox's exec audit trail.
    Audit(IdArgs),
    /// Show live sandboxes with what they use: CPU, memory, pids, disk.
    Top(TopArgs),
    /// Show spin-up percentiles, exec counts and iterations per
    /// five-minute window, by `task` label.
    Stats(StatsArgs),
    /// List or download a sandbox's collected artifacts (also after it is destroyed).
    #[command(subcommand)]
    Artifacts(crate::cmd_artifacts::ArtifactsCmd),
    /// Copy files between the host and a sandbox (`ID:PATH` names the sandbox side).
    Cp(CpArgs),
    /// Manage warm pools of booted sandboxes.
    #[command(subcommand)]
    Pool(crate::cmd_pool::PoolCommand),
    /// Build, list, inspect and remove named templates.
    #[command(subcommand)]
    Template(crate::cmd_template::TemplateCommand),
    /// Remove what daemonless runs keep ready: parked sandboxes and spare
    /// namespaces.
    Prune,
    /// Manage tenants and their quotas (admin).
    #[command(subcommand)]
    Tenant(crate::cmd_admin::TenantCmd),
    /// Manage API keys (admin).
    #[command(subcommand)]
    Key(crate::cmd_admin::KeyCmd),
    /// Show a sandbox's gateway token, exposed ports and overrides.
    Ports(IdArgs),
    /// Expose a sandbox port through the gateway and print its preview URL.
    Expose(crate::cmd_gateway::ExposeArgs),
    /// Take a port's exposure back (it needs the token again).
    Unexpose(crate::cmd_gateway::PortArgs),
    /// Forward a host TCP port to a port inside a sandbox.
    PortForward(crate::cmd_gateway::ForwardArgs),
    /// Manage the gateway's routes: services and their shared baselines.
    #[command(subcommand)]
    Route(crate::cmd_gateway::RouteCmd),
    /// Per-sandbox gateway settings.
    #[command(subcommand)]
    Sandbox(crate::cmd_gateway::SandboxCmd),
    /// Boot a sandbox and keep it parked for the next daemonless run
    /// (started by runs themselves).
    #[command(hide = true)]
    Park(ParkArgs),
}

#[derive(Debug, Args)]
pub struct ParkArgs {
    /// When the run whose reaper started this keeper ended (unix ms); a
    /// `mayfly prune` since then means: do not park.
    #[arg(long, env = mayfly_engine::park::AFTER_ENV)]
    pub after: Option<u64>,
}

/// The limits a sandbox (or a pool's sandboxes) runs with.
#[derive(Debug, Args, Clone)]
pub struct LimitArgs {
    /// Memory limit (e.g. 512m, 2g).
    #[arg(long, value_parser = parse_size)]
    pub memory: Option<u64>,
    /// CPU quota in CPUs (e.g. 0.5, 2).
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Maximum number of processes and threads.
    #[arg(long)]
    pub pids: Option<u32>,
    /// What the sandbox's changes may hold on disk (e.g. 2g); past it the
    /// sandbox is destroyed.
    #[arg(long, value_parser = parse_size)]
    pub disk: Option<u64>,
}

impl LimitArgs {
    /// The limits asked for, with `/tmp` of `tmp_bytes`.
    pub fn limits(&self, tmp_bytes: Option<u64>) -> anyhow::Result<Limits> {
        let cpu_millis = match self.cpus {
            Some(c) if !(c.is_finite() && c > 0.0 && c <= 256.0) => {
                anyhow::bail!("--cpus must be a number between 0.01 and 256")
            }
            Some(c) => Some((c * 1000.0).round() as u32),
            None => None,
        };
        Ok(Limits {
            memory_bytes: self.memory,
            cpu_millis,
            pids: self.pids,
            tmp_bytes,
            nofile: None,
            disk_bytes: self.disk,
        })
    }
}

#[derive(Debug, Args, Clone)]
pub struct SpecArgs {
    /// `host`, `dir:/path/to/rootfs` or a built template's name.
    #[arg(long, short = 't', default_value = "host")]
    pub template: TemplateRef,
    /// Time to live (e.g. 30s, 10m).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttl: Option<std::time::Duration>,
    /// Destroy the sandbox after this long without a request or a running
    /// command (e.g. 5m; 0s: never).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub idle_timeout: Option<std::time::Duration>,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Size of /tmp (e.g. 64m).
    #[arg(long, value_parser = parse_size)]
    pub tmp: Option<u64>,
    /// Sandbox-wide environment (KEY=VALUE).
    #[arg(long = "env", short = 'e', value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// Labels (KEY=VALUE).
    #[arg(long = "label", short = 'l', value_parser = parse_kv)]
    pub labels: Vec<(String, String)>,
    #[command(flatten)]
    pub egress: EgressArgs,
    /// A path inside the sandbox collected before it is destroyed
    /// (a file, or a directory as a tar); repeatable.
    #[arg(long = "artifact")]
    pub artifacts: Vec<String>,
    /// Check this repository (absolute path or file://, http(s)://, git://
    /// URL) out into /workspace.
    #[arg(long = "git")]
    pub git: Option<String>,
    /// The branch, tag or commit to start from (the remote's HEAD when absent).
    #[arg(long = "git-ref", requires = "git")]
    pub git_ref: Option<String>,
    /// A task branch created at the starting commit.
    #[arg(long = "git-branch", requires = "git")]
    pub git_branch: Option<String>,
}

impl SpecArgs {
    /// The spec a plain `mayfly run` asks for, which parked sandboxes are
    /// made with (its TTL is applied when a run claims one).
    pub fn parked_request() -> CreateRequest {
        CreateRequest {
            template: Some(TemplateRef::Host),
            ..CreateRequest::default()
        }
    }

    pub fn request(&self) -> anyhow::Result<CreateRequest> {
        Ok(CreateRequest {
            template: Some(self.template.clone()),
            ttl_secs: self.ttl.map(|d| d.as_secs().max(1)),
            idle_timeout_secs: self.idle_timeout.map(|d| d.as_secs()),
            limits: self.limits.limits(self.tmp)?,
            env: self.env.iter().cloned().collect(),
            labels: self.labels.iter().cloned().collect(),
            egress: self.egress.policy()?,
            artifacts: self.artifacts.clone(),
            workspace: self.git.as_ref().map(|repo| mayfly_types::GitWorkspace {
                repo: repo.clone(),
                git_ref: self.git_ref.clone(),
                branch: self.git_branch.clone(),
            }),
            ..CreateRequest::default()
        })
    }
}

/// What a sandbox may reach outside itself.
#[derive(Debug, Args, Clone, Default)]
pub struct EgressArgs {
    /// Egress mode: none (loopback only), allow (the --allow list) or open.
    #[arg(long, value_parser = ["none", "allow", "open"])]
    pub egress: Option<String>,
    /// An allowed destination: CIDR[:PORT[-PORT]] or [*.]NAME[:PORT[-PORT]].
    #[arg(long = "allow")]
    pub allow: Vec<String>,
    /// A denied destination, in the same forms as --allow.
    #[arg(long = "deny")]
    pub deny: Vec<String>,
    /// Concurrent outbound connections (default 256).
    #[arg(long)]
    pub max_connections: Option<u32>,
    /// Bandwidth cap, bytes per second each way (e.g. 10m).
    #[arg(long, value_parser = parse_size)]
    pub bandwidth: Option<u64>,
}

impl EgressArgs {
    /// The egress policy the flags ask for; none when no flag names one.
    pub fn policy(&self) -> anyhow::Result<Option<mayfly_types::EgressPolicy>> {
        let parse = |list: &[String]| -> anyhow::Result<Vec<mayfly_types::EgressEntry>> {
            list.iter()
                .map(|s| s.parse().map_err(anyhow::Error::from))
                .collect()
        };
        let mode = match self.egress.as_deref() {
            None if self.allow.is_empty() && self.deny.is_empty() => return Ok(None),
            None | Some("allow") => mayfly_types::EgressMode::Allow,
            Some("open") => mayfly_types::EgressMode::Open,
            Some(_) => mayfly_types::EgressMode::None,
        };
        Ok(Some(mayfly_types::EgressPolicy {
            mode,
            allow: parse(&self.allow)?,
            deny: parse(&self.deny)?,
            max_connections: self.max_connections,
            bandwidth_bytes_per_sec: self.bandwidth,
        }))
    }
}

#[derive(Debug, Args)]
pub struct EgressCmdArgs {
    pub id: String,
    #[command(flatten)]
    pub egress: EgressArgs,
}

#[derive(Debug, Args, Clone)]
pub struct CommandArgs {
    /// Working directory inside the sandbox.
    #[arg(long, short = 'w')]
    pub cwd: Option<String>,
    /// Uid inside the sandbox.
    #[arg(long, short = 'u')]
    pub user: Option<u32>,
    /// Kill the command (and everything it started) after this long.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// Pass this process's stdin to the command.
    #[arg(long, short = 'i')]
    pub interactive: bool,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub argv: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    #[command(flatten)]
    pub cmd: CommandArgs,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    pub id: String,
    /// Per-command environment (KEY=VALUE).
    #[arg(long = "env", short = 'e', value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// A task run: the sandbox's before_run hooks run first (a failing one
    /// stops the run) and its after_run hooks after.
    #[arg(long)]
    pub run: bool,
    #[command(flatten)]
    pub cmd: CommandArgs,
}

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Include destroyed and failed sandboxes (the most recent `--limit`).
    #[arg(long, short = 'a')]
    pub all: bool,
    /// With `-a`: how many of the most recently created to list (the
    /// daemon's default is 1000, its maximum 10000).
    #[arg(long, requires = "all")]
    pub limit: Option<u32>,
    /// Print only the ids, one per line (`mayfly rm $(mayfly ps -q)`);
    /// `--json` still prints the whole list.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    #[arg(required = true)]
    pub ids: Vec<String>,
}

#[derive(Debug, Args)]
pub struct IdArgs {
    pub id: String,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only events after this sequence number (0 when absent; with
    /// --follow, only new events when absent).
    #[arg(long)]
    pub since: Option<i64>,
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Keep printing events as they happen (until interrupted).
    #[arg(long, short = 'f')]
    pub follow: bool,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Refresh until interrupted.
    #[arg(long, short = 'w')]
    pub watch: bool,
    /// Time between refreshes with --watch.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub interval: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// How far back from now (e.g. 30m, 1h, 7d).
    #[arg(long, default_value = "1h")]
    pub window: String,
    /// Only sandboxes created with this `task` label (`-l task=NAME`).
    #[arg(long)]
    pub task: Option<String>,
}

#[derive(Debug, Args)]
pub struct CpArgs {
    pub src: String,
    pub dst: String,
}

impl Cli {
    /// A client for the configured daemon.
    pub fn client(&self) -> anyhow::Result<Client> {
        let client = match &self.url {
            Some(url) => Client::tcp(url, self.token.as_deref())?,
            None => Client::unix_connected(&self.socket, probe_slot().take()),
        };
        match &self.api_key {
            Some(key) => Ok(client.with_api_key(key)?),
            None => Ok(client),
        }
    }

    /// Whether a daemon answers on the configured socket (or a URL is set).
    /// The connection that shows it is kept for the client's first request.
    pub fn daemon_reachable(&self) -> bool {
        if self.url.is_some() {
            return true;
        }
        match std::os::unix::net::UnixStream::connect(&self.socket) {
            Ok(conn) => {
                *probe_slot() = Some(conn);
                true
            }
            Err(_) => false,
        }
    }
}

/// The connection [`Cli::daemon_reachable`] made, until [`Cli::client`]
/// takes it: one connection per command instead of two, so the daemon
/// does not accept and tear down an empty one next to the real request.
fn probe_slot() -> std::sync::MutexGuard<'static, Option<std::os::unix::net::UnixStream>> {
    static SLOT: std::sync::Mutex<Option<std::os::unix::net::UnixStream>> =
        std::sync::Mutex::new(None);
    SLOT.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_run_asks_for_the_parked_spec() {
        let cli = Cli::parse_from(["mayfly", "run", "--", "true"]);
        let Command::Run(a) = cli.command else {
            panic!("not a run")
        };
        assert_eq!(a.spec.request().unwrap(), SpecArgs::parked_request());
        let cli = Cli::parse_from(["mayfly", "run", "--ttl", "30s", "--", "true"]);
        let Command::Run(a) = cli.command else {
            panic!("not a run")
        };
        let asked = a.spec.request().unwrap();
        assert_eq!(asked.ttl_secs, Some(30));
        assert_eq!(
            CreateRequest {
                ttl_secs: None,
                ..asked
            },
            SpecArgs::parked_request()
        );
    }
}
