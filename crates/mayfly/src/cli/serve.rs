//! `mayfly serve`'s flags: the daemon's listeners, defaults, limits, pools,
//! gateway and artifact retention.

use std::path::PathBuf;

use clap::Args;

use super::{parse_history, parse_kv, parse_size, History};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Also listen on TCP (requires a token).
    #[arg(long)]
    pub tcp: Option<std::net::SocketAddr>,
    /// File holding the bearer token for TCP.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Default TTL of a sandbox.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub default_ttl: std::time::Duration,
    /// Maximum TTL a create may ask for.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub max_ttl: std::time::Duration,
    /// On SIGTERM: `destroy` every sandbox at once, or `drain`: refuse new
    /// creates, keep serving the live sandboxes until they end or the grace
    /// period passes (a second signal cuts it short), then destroy the rest.
    #[arg(long, value_enum, default_value = "destroy")]
    pub shutdown: ShutdownMode,
    /// How long a draining shutdown waits for live sandboxes.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: std::time::Duration,
    /// Idle timeout of a sandbox whose create names none (0s: none).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub idle_timeout: std::time::Duration,
    /// Most sandboxes alive at once.
    #[arg(long, default_value_t = 4096)]
    pub max_sandboxes: u32,
    /// Most commands one sandbox may run through the API (exec and
    /// processes). Each is kept in the audit trail, so this bounds a live
    /// sandbox's audit; past it a command is refused (403), never run
    /// unaudited.
    #[arg(long, default_value_t = mayfly_engine::DEFAULT_MAX_COMMANDS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_commands_per_sandbox: u64,
    /// Bytes of file reads, tar downloads and collected command output the
    /// daemon holds in memory at once, over all sandboxes; past it a file
    /// request answers 503 (to retry) and a command's output is counted but
    /// no longer kept (truncated).
    #[arg(long, default_value_t = mayfly_engine::DEFAULT_FILE_BUFFER_BYTES,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub file_buffer_bytes: u64,
    /// A static DNS table for sandboxes' resolver, `/etc/hosts` format
    /// (`ADDRESS NAME…`), looked at before the host's resolver.
    #[arg(long)]
    pub dns_hosts: Option<PathBuf>,
    /// The egress policy (a JSON file) of creates from TEMPLATE that name
    /// none: `--template-egress host=/etc/mayfly/host-egress.json`.
    #[arg(long = "template-egress", value_parser = parse_kv)]
    pub template_egress: Vec<(String, String)>,
    /// Network namespaces kept prepared for creates with egress.
    #[arg(long, default_value_t = 4)]
    pub egress_pool: usize,
    /// A warm pool, `NAME=TARGET[,max=N][,concurrency=N][,template=T]`;
    /// repeat for more. `host=0` turns the default pool off.
    #[arg(long = "pool", value_parser = crate::cmd_pool::parse_pool_flag,
          default_value = "host=4")]
    pub pools: Vec<(String, mayfly_types::PoolSpec)>,
    /// Keep the sandboxes' writable layers, mount points and trash here
    /// instead of in the state directory. On a tmpfs (e.g. /dev/shm/mayfly)
    /// boots and destroys cost a third as much CPU on these hosts' ext4 (no
    /// journal), and what a sandbox writes is held in memory, charged to its
    /// memory limit.
    #[arg(long)]
    pub scratch: Option<PathBuf>,
    /// The gateway's listener (preview URLs, routes), or `off`. When the
    /// default address is taken the daemon runs without a gateway and says
    /// so; an address given here must bind.
    #[arg(long)]
    pub gateway: Option<String>,
    /// Preview URLs are `http://<port>-<id>.<domain>:<gateway port>`, and
    /// services `<service>.<domain>`.
    #[arg(long, default_value = mayfly_server::gateway::DEFAULT_GATEWAY_DOMAIN)]
    pub gateway_domain: String,
    /// Threads serving the gateway, each with its own event loop and
    /// upstream connection pool.
    #[arg(long, default_value_t = 1)]
    pub gateway_threads: usize,
    /// Client connections the host's gateway listener serves at once, and
    /// upstream connections they hold in all; past it new clients wait in
    /// the kernel's backlog. (A sandbox's own listener has 64 and 128.)
    #[arg(long, default_value_t = mayfly_server::conn::HOST_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub gateway_max_connections: u32,
    /// Collected artifacts older than this are removed (e.g. 7d, 12h).
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    pub artifact_max_age: std::time::Duration,
    /// The most bytes all collected artifacts may hold; the oldest
    /// sandboxes' go first (e.g. 10GiB, 500m).
    #[arg(long, default_value = "10GiB", value_parser = parse_size)]
    pub artifact_max_bytes: u64,
    /// The most bytes one artifact may store; a larger one is recorded as
    /// skipped.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    pub artifact_max_file_bytes: u64,
    /// The most bytes one sandbox's artifacts may store together.
    #[arg(long, default_value = "2GiB", value_parser = parse_size)]
    pub artifact_max_sandbox_bytes: u64,
    /// How long an ended sandbox's record, exec audit and events stay in the
    /// store (what `stats`, `audit` and `events` read), e.g. 30d, or
    /// `forever`. Pruned at start and every 10 minutes; live sandboxes are
    /// never pruned.
    #[arg(long, default_value = "30d", value_parser = parse_history)]
    pub history: History,
    /// A URL prefix, ending in `/`, that a tenant's workspace repository
    /// may start with (repeatable; e.g. https://git.example.com/team/).
    /// Without any, a tenant may name any http(s):// or git:// URL, which
    /// the daemon fetches from the host's network. Admins are not limited.
    #[arg(long = "tenant-repo", value_name = "PREFIX", value_parser = parse_repo_prefix)]
    pub tenant_repos: Vec<String>,
}

/// What the daemon does with live sandboxes when asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ShutdownMode {
    Destroy,
    Drain,
}

/// A `--tenant-repo` prefix: an http(s):// or git:// URL with a host,
/// ending in `/` (so `https://git.example.com/` cannot be matched by
/// `https://git.example.com.evil.test/`).
fn parse_repo_prefix(s: &str) -> Result<String, String> {
    let rest = ["https://", "http://", "git://"]
        .iter()
        .find_map(|scheme| s.strip_prefix(scheme))
        .ok_or("it must start with https://, http:// or git://")?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() || !rest.contains('/') || !s.ends_with('/') {
        return Err(
            "it must name a host and end with `/` (e.g. https://git.example.com/team/)".into(),
        );
    }
    if !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("it must be printable ASCII without spaces".into());
    }
    Ok(s.to_owned())
}
