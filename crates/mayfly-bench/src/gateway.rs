//! The gateway measures (issue 4): HTTP requests per second through the
//! preview path against a direct connection to the same server, and the
//! latency the gateway adds, both with `wrk`, in one run.
//!
//! The server is nginx (`return 200`, one worker) inside a sandbox. *Direct*
//! is wrk entering the sandbox's network namespace (`nsenter --net`) and
//! connecting to `127.0.0.1:8080` there: the same server, the same
//! loopback, no gateway. *Gateway* is wrk on the host connecting to the
//! daemon's gateway with `Host: 8080-<id>.localhost` (the port is public, so
//! no token). The two alternate, round by round, so host noise hits both.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use mayfly_types::{CreateRequest, SandboxId, StartProcessRequest};

use crate::api::call;
use crate::daemon::{Daemon, Scratch};
use crate::gateway_peers::{self, Peer};
use crate::stats::median;

const NGINX: &str = "/usr/sbin/nginx";
const PORT: u16 = 8080;
const NGINX_CONF: &str = r#"daemon off;
master_process off;
worker_processes 1;
user root;
pid /workspace/nginx.pid;
error_log stderr warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path /workspace/ngx-body;
  proxy_temp_path /workspace/ngx-proxy;
  fastcgi_temp_path /workspace/ngx-fcgi;
  uwsgi_temp_path /workspace/ngx-uwsgi;
  scgi_temp_path /workspace/ngx-scgi;
  keepalive_requests 100000000;
  server {
    listen 127.0.0.1:8080;
    location / { default_type text/plain; return 200 "hello from nginx\n"; }
  }
}
"#;

/// How the gateway measure runs.
#[derive(Debug, Clone)]
pub struct Setup {
    pub seconds: u64,
    pub connections: u32,
    pub rounds: usize,
}

/// One wrk run's figures.
#[derive(Debug, Clone, Copy)]
struct Wrk {
    rps: f64,
    p50_us: f64,
    /// CPU time wrk itself used (user + system), µs.
    cpu_us: f64,
}

/// What the measure found: per round, direct and through the gateway.
#[derive(Debug, Default)]
pub struct Outcome {
    pub(crate) throughput: Vec<(f64, f64)>,
    pub(crate) latency_us: Vec<(f64, f64)>,
    /// CPU time per request through the gateway, µs: (daemon, nginx, wrk).
    pub(crate) cpu_us: Vec<(f64, f64, f64)>,
    /// CPU time per request direct, µs: (nginx, wrk).
    pub(crate) direct_cpu_us: Vec<(f64, f64)>,
    /// Per round, per peer (in [`Peer::ALL`]'s order): requests per second
    /// and the proxy's CPU time per request, µs.
    pub(crate) peers: Vec<Vec<(f64, f64)>>,
}

/// CPU time (user + system) a process has used, µs.
fn cpu_us(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the `)` that ends the command name: utime is the
    // 12th, stime the 13th, in USER_HZ (100 on every Linux this runs on).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    (field(11) + field(12)) * 10_000
}

/// The host pid of the process whose command line names `conf` (its
/// configuration file in the sandbox).
pub fn pid_of(conf: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd);
        cmd.split('\0').any(|a| a == conf).then_some(pid)
    })
}

/// The host pid of the nginx serving from the sandbox.
fn nginx_pid() -> Option<u32> {
    pid_of("/workspace/nginx.conf")
}

impl Outcome {
    /// Median over rounds of gateway/direct requests per second.
    pub fn ratio(&self) -> f64 {
        median(self.throughput.iter().map(|(d, g)| g / d).collect())
    }

    /// Median over rounds of (gateway p50 − direct p50), µs.
    pub fn added_us(&self) -> f64 {
        median(self.latency_us.iter().map(|(d, g)| g - d).collect())
    }

    /// Median CPU per request through the gateway, µs: (daemon, nginx,
    /// wrk).
    pub fn cpu_per_request(&self) -> (f64, f64, f64) {
        (
            median(self.cpu_us.iter().map(|c| c.0).collect()),
            median(self.cpu_us.iter().map(|c| c.1).collect()),
            median(self.cpu_us.iter().map(|c| c.2).collect()),
        )
    }

    /// Per peer: the median over rounds of its requests per second over
    /// direct's, and of its CPU per request, µs.
    pub fn peers(&self) -> Vec<(Peer, f64, f64)> {
        Peer::ALL
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let ratios = self.throughput.iter().zip(&self.peers);
                let ratio = median(ratios.map(|((d, _), r)| r[i].0 / d).collect());
                let cpu = median(self.peers.iter().map(|r| r[i].1).collect());
                (*p, ratio, cpu)
            })
            .collect()
    }

    /// Median over rounds of the gateway's requests per second over the
    /// fastest peer's.
    pub fn gateway_over_best_peer(&self) -> f64 {
        median(
            self.throughput
                .iter()
                .zip(&self.peers)
                .map(|((_, g), r)| g / r.iter().map(|p| p.0).fold(0.0, f64::max))
                .collect(),
        )
    }

    /// Median CPU per request direct, µs: (nginx, wrk).
    pub fn direct_cpu_per_request(&self) -> (f64, f64) {
        (
            median(self.direct_cpu_us.iter().map(|c| c.0).collect()),
            median(self.direct_cpu_us.iter().map(|c| c.1).collect()),
        )
    }
}

/// Parses wrk's `Requests/sec:` and `50%` lines.
fn parse_wrk(out: &str) -> anyhow::Result<Wrk> {
    let rps = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .with_context(|| format!("no Requests/sec in wrk's output:\n{out}"))?;
    let p50_us = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("50%"))
        .map(|v| duration_us(v.trim()))
        .transpose()?
        .unwrap_or(f64::NAN);
    // The shell's `times` after wrk: its own line, then its children's.
    let cpu_us = out
        .lines()
        .rev()
        .find(|l| l.trim().starts_with(|c: char| c.is_ascii_digit()) && l.contains("m"))
        .map(|l| {
            l.split_whitespace()
                .map(|t| minutes_seconds_us(t).unwrap_or(0.0))
                .sum()
        })
        .unwrap_or(f64::NAN);
    Ok(Wrk {
        rps,
        p50_us,
        cpu_us,
    })
}

/// `0m1.230s` (the shell's `times`) → µs.
fn minutes_seconds_us(t: &str) -> Option<f64> {
    let (m, s) = t.strip_suffix('s')?.split_once('m')?;
    Some((m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?) * 1e6)
}

/// `123.00us`, `1.20ms`, `2.00s` → µs.
fn duration_us(v: &str) -> anyhow::Result<f64> {
    for (unit, f) in [("us", 1.0), ("ms", 1e3), ("s", 1e6)] {
        if let Some(n) = v.strip_suffix(unit) {
            return Ok(n.parse::<f64>().context("wrk latency")? * f);
        }
    }
    bail!("unknown wrk latency `{v}`")
}

/// Runs wrk (after `prefix`) under a shell whose `times` then reports the
/// CPU wrk used.
fn wrk(prefix: &[&str], args: &[String]) -> anyhow::Result<Wrk> {
    let out = Command::new("bash")
        .args(["-c", "\"$@\" && times", "bash"])
        .args(prefix)
        .args(args)
        .output()
        .context("running wrk")?;
    ensure!(
        out.status.success(),
        "wrk failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_wrk(&String::from_utf8_lossy(&out.stdout))
}

/// Starts nginx in a fresh sandbox and waits until it serves.
async fn nginx_sandbox(d: &Daemon) -> anyhow::Result<(SandboxId, u32)> {
    let c = &d.client;
    // Every CPU of the host: the peer proxies run in this sandbox beside
    // the server, and one CPU's quota (the default) would cap the two
    // together where the gateway, outside, is not.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let req = CreateRequest {
        ttl_secs: Some(3600),
        limits: mayfly_types::Limits {
            cpu_millis: Some(cpus * 1000),
            ..mayfly_types::Limits::default()
        },
        ..CreateRequest::default()
    };
    let sb = call("creating the server's sandbox", c.create(&req)).await?;
    call(
        "writing nginx.conf",
        c.write_file(
            &sb.id,
            "/workspace/nginx.conf",
            NGINX_CONF.as_bytes().to_vec(),
            Some(0o644),
        ),
    )
    .await?;
    let argv = [NGINX, "-c", "/workspace/nginx.conf", "-p", "/workspace"];
    let start = StartProcessRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        ..StartProcessRequest::default()
    };
    call("starting nginx", c.start_process(&sb.id, &start)).await?;
    let t = std::time::Instant::now();
    while c.connect_port(&sb.id, PORT).await.is_err() {
        ensure!(
            t.elapsed() < Duration::from_secs(10),
            "nginx did not listen within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    call("exposing the port", c.expose(&sb.id, PORT, true)).await?;
    let init = sb.init_pid.context("the sandbox has no init pid")? as u32;
    Ok((sb.id, init))
}

/// Runs the measure on a daemon of its own and returns the outcome.
pub async fn measure(mayfly: &Path, s: &Setup) -> anyhow::Result<Outcome> {
    for (tool, hint) in [
        ("wrk", "apt install wrk"),
        ("nsenter", "apt install util-linux"),
    ] {
        ensure!(
            Command::new(tool).arg("--version").output().is_ok(),
            "`{tool}` is missing ({hint})"
        );
    }
    ensure!(
        Path::new(NGINX).exists(),
        "{NGINX} is missing (apt install nginx-light)"
    );
    gateway_peers::check_installed()?;
    let scratch = Scratch::new("gateway")?;
    let gw_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let gw = format!("127.0.0.1:{gw_port}");
    let mut d = Daemon::start_with(mayfly, &scratch.path, 64, None, &["--gateway", &gw]).await?;
    let (id, init) = nginx_sandbox(&d).await?;
    gateway_peers::start(&d.client, &id, NGINX_CONF, PORT).await?;
    let peer_urls: Vec<String> = Peer::ALL
        .iter()
        .map(|p| format!("http://127.0.0.1:{}/", p.port()))
        .collect();
    let ns = format!("--net=/proc/{init}/ns/net");
    let direct_prefix = ["nsenter", ns.as_str(), "wrk"];
    let direct_url = format!("http://127.0.0.1:{PORT}/");
    let host = format!("Host: {PORT}-{id}.localhost");
    let gw_url = format!("http://{gw}/");
    let load = |url: &str, conns: u32, secs: u64, host: Option<&str>| {
        let mut a = vec![
            "-t1".to_owned(),
            format!("-c{conns}"),
            format!("-d{secs}s"),
            "--latency".to_owned(),
        ];
        if let Some(h) = host {
            a.extend(["-H".to_owned(), h.to_owned()]);
        }
        a.push(url.to_owned());
        a
    };
    // Warm both paths (pooled upstream connections, page cache, nginx).
    wrk(&direct_prefix, &load(&direct_url, s.connections, 1, None))?;
    wrk(&["wrk"], &load(&gw_url, s.connections, 1, Some(&host)))?;
    for url in &peer_urls {
        wrk(&direct_prefix, &load(url, s.connections, 1, None))?;
    }
    let mut out = Outcome::default();
    for round in 0..s.rounds {
        eprintln!("mayfly-bench: gateway round {} of {}", round + 1, s.rounds);
        let nginx = nginx_pid().unwrap_or(0);
        let daemon = d.pid();
        // Each path takes its turn first, round by round, so host noise
        // hits them alike.
        let mut took = [None; 2 + Peer::ALL.len()];
        for k in 0..took.len() {
            let path = (round + k) % took.len();
            let (prefix, url, host, proxy): (&[&str], &str, Option<&str>, u32) = match path {
                0 => (&direct_prefix, &direct_url, None, 0),
                1 => (&["wrk"], &gw_url, Some(&host), daemon),
                p => {
                    let peer = Peer::ALL[p - 2];
                    (
                        &direct_prefix,
                        &peer_urls[p - 2],
                        None,
                        peer.pid().unwrap_or(0),
                    )
                }
            };
            let before = (cpu_us(proxy), cpu_us(nginx));
            let w = wrk(prefix, &load(url, s.connections, s.seconds, host))?;
            let n = (w.rps * s.seconds as f64).max(1.0);
            let per = |after: u64, before: u64| after.saturating_sub(before) as f64 / n;
            // Requests per second, then CPU per request of the proxy,
            // nginx and wrk.
            took[path] = Some((
                w.rps,
                per(cpu_us(proxy), before.0),
                per(cpu_us(nginx), before.1),
                w.cpu_us / n,
            ));
        }
        let [Some(direct), Some(via), ..] = took else {
            bail!("a path of the round was not measured");
        };
        out.throughput.push((direct.0, via.0));
        out.direct_cpu_us.push((direct.2, direct.3));
        out.cpu_us.push((via.1, via.2, via.3));
        out.peers.push(
            took[2..]
                .iter()
                .flatten()
                .map(|(rps, proxy, ..)| (*rps, *proxy))
                .collect(),
        );
        let secs = s.seconds.clamp(1, 5);
        let d1 = wrk(&direct_prefix, &load(&direct_url, 1, secs, None))?;
        let g1 = wrk(&["wrk"], &load(&gw_url, 1, secs, Some(&host)))?;
        out.latency_us.push((d1.p50_us, g1.p50_us));
    }
    call("destroying the sandbox", d.client.destroy(&id)).await?;
    d.stop(Duration::from_secs(30)).await?;
    let alive = Path::new(&format!("/proc/{init}")).exists();
    ensure!(!alive, "the sandbox's init {init} outlived the daemon");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_of_this_process_is_read() {
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(60) {}
        assert!(cpu_us(std::process::id()) > 0);
    }

    #[test]
    fn wrk_output_is_read() {
        let out = "Running 1s test\n  Latency Distribution\n     50%  129.00us\n     75%  1.20ms\nRequests/sec:  34331.72\n0m0.001s 0m0.002s\n0m1.500s 0m2.250s\n";
        let w = parse_wrk(out).unwrap();
        assert_eq!((w.rps, w.p50_us, w.cpu_us), (34331.72, 129.0, 3_750_000.0));
        assert_eq!(duration_us("1.50ms").unwrap(), 1500.0);
    }
}
