//! The peers of the gateway measure: two mature reverse proxies in front of
//! the same nginx, in the same run. nginx's own `proxy_pass` (kept-alive
//! upstream connections) and HAProxy (`http-reuse always`), each on one
//! thread as the gateway is, run inside the server's sandbox and are
//! reached by wrk as the server is direct (in the sandbox's network
//! namespace). So each does what the gateway does per request, a read and
//! a write on each of two loopback connections, on the same two vCPUs,
//! and their rates say how far a proxy gets on this host at all.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context};
use mayfly_client::Client;
use mayfly_types::{SandboxId, StartProcessRequest};

use crate::api::call;

const HAPROXY: &str = "/usr/sbin/haproxy";

/// A peer proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    NginxProxy,
    Haproxy,
}

impl Peer {
    pub const ALL: [Peer; 2] = [Peer::NginxProxy, Peer::Haproxy];

    pub fn name(self) -> &'static str {
        match self {
            Peer::NginxProxy => "nginx `proxy_pass`",
            Peer::Haproxy => "HAProxy",
        }
    }

    /// Where it listens, on the sandbox's loopback.
    pub fn port(self) -> u16 {
        match self {
            Peer::NginxProxy => 8081,
            Peer::Haproxy => 8082,
        }
    }

    fn conf_path(self) -> &'static str {
        match self {
            Peer::NginxProxy => "/workspace/nginx-proxy.conf",
            Peer::Haproxy => "/workspace/haproxy.cfg",
        }
    }

    /// Its configuration, in front of the server on `server_port`.
    fn conf(self, server_conf: &str, server_port: u16) -> String {
        match self {
            Peer::NginxProxy => {
                let upstream = format!(
                    "upstream server {{ server 127.0.0.1:{server_port}; keepalive 64; \
                     keepalive_requests 100000000; }}\n  server {{\n    listen 127.0.0.1:{};\n    \
                     location / {{ proxy_pass http://server; proxy_http_version 1.1; \
                     proxy_set_header Connection \"\"; }}\n  }}\n}}\n",
                    self.port()
                );
                // The server's configuration up to its `server` block, with
                // a pid file of its own.
                let head = server_conf
                    .split_once("  server {")
                    .map_or(server_conf, |(h, _)| h)
                    .replace("/workspace/nginx.pid", "/workspace/nginx-proxy.pid");
                format!("{head}  {upstream}")
            }
            Peer::Haproxy => format!(
                "global\n  nbthread 1\n  maxconn 1000\n\
                 defaults\n  mode http\n  timeout connect 5s\n  timeout client 60s\n  \
                 timeout server 60s\n  http-reuse always\n\
                 frontend gateway-peer\n  bind 127.0.0.1:{}\n  default_backend server\n\
                 backend server\n  server s1 127.0.0.1:{server_port}\n",
                self.port()
            ),
        }
    }

    fn argv(self) -> Vec<String> {
        let a: &[&str] = match self {
            Peer::NginxProxy => &[
                "/usr/sbin/nginx",
                "-c",
                self.conf_path(),
                "-p",
                "/workspace",
            ],
            // -db: in the foreground, as the sandbox's process.
            Peer::Haproxy => &[HAPROXY, "-db", "-f", self.conf_path()],
        };
        a.iter().map(|s| s.to_string()).collect()
    }

    /// Its host pid.
    pub fn pid(self) -> Option<u32> {
        crate::gateway::pid_of(self.conf_path())
    }
}

/// Fails with an install hint when a peer is missing.
pub fn check_installed() -> anyhow::Result<()> {
    ensure!(
        Path::new(HAPROXY).exists(),
        "{HAPROXY} is missing (apt install haproxy)"
    );
    Ok(())
}

/// Starts both peers in the sandbox `id`, in front of its server, and
/// waits until they answer.
pub async fn start(
    c: &Client,
    id: &SandboxId,
    server_conf: &str,
    server_port: u16,
) -> anyhow::Result<()> {
    for p in Peer::ALL {
        let conf = p.conf(server_conf, server_port);
        call(
            "writing a peer's configuration",
            c.write_file(id, p.conf_path(), conf.into_bytes(), Some(0o644)),
        )
        .await?;
        let start = StartProcessRequest {
            argv: p.argv(),
            ..StartProcessRequest::default()
        };
        call("starting a peer proxy", c.start_process(id, &start)).await?;
        let t = std::time::Instant::now();
        while c.connect_port(id, p.port()).await.is_err() {
            ensure!(
                t.elapsed() < Duration::from_secs(10),
                "{} did not listen within 10 s",
                p.name()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        p.pid()
            .with_context(|| format!("{} listens but its process is not found", p.name()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nginx_peer_keeps_the_servers_settings_and_proxies_to_it() {
        let server = "daemon off;\npid /workspace/nginx.pid;\nhttp {\n  access_log off;\n  \
                      server {\n    listen 127.0.0.1:8080;\n  }\n}\n";
        let conf = Peer::NginxProxy.conf(server, 8080);
        assert!(conf.starts_with("daemon off;\npid /workspace/nginx-proxy.pid;\nhttp {\n"));
        assert!(conf.contains("access_log off;"));
        assert!(conf.contains("server 127.0.0.1:8080; keepalive 64;"));
        assert!(conf.contains("listen 127.0.0.1:8081;"));
        assert!(!conf.contains("listen 127.0.0.1:8080"));
        assert_eq!(conf.matches('{').count(), conf.matches('}').count());
        let h = Peer::Haproxy.conf(server, 8080);
        assert!(h.contains("bind 127.0.0.1:8082") && h.contains("server s1 127.0.0.1:8080"));
    }
}
