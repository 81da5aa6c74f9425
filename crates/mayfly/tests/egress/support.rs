#![allow(dead_code)] // each suite uses a part of it
//! Helpers of the egress suites: a test network namespace (`egt<N>`,
//! 10.77.N.2) that plays "the outside" with TCP servers on 80, 443, 853,
//! 5000, 7000, 7001, 7002 and 8080, a DNS server on 53 and a UDP listener
//! on 853 that record what reaches them;
//! the daemon's resolver maps test names to it (`--dns-hosts`). Python
//! inside the sandboxes is the client.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use super::common::*;
use mayfly_types::{CreateRequest, EgressMode, EgressPolicy, SandboxId};

/// Connects and reports OK (the server answered), BLOCKED or TIMEOUT.
pub const CLIENT: &str = r#"
import socket, ssl, sys
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
name = sys.argv[4] if len(sys.argv) > 4 else host
try:
    if mode == "resolve":
        print(socket.gethostbyname(host)); sys.exit(0)
    if mode == "udp":
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
        u.sendto(b"hello", (host, port))
        try:
            u.recv(512); print("OK")
        except socket.timeout:
            print("BLOCKED (no answer)")
        sys.exit(0)
    if mode == "dns":
        q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\x00\x00\x01\x00\x01"
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(3)
        u.sendto(q, (host, port)); d = u.recv(512)
        print("ANSWERED rcode=%d answers=%d" % (d[3] & 15, d[7])); sys.exit(0)
    s = socket.create_connection((host, port), timeout=3)
    if mode == "http":
        s.sendall(b"GET / HTTP/1.1\r\nHost: " + name.encode() + b"\r\n\r\n")
    elif mode == "send":
        # `name` is the bytes to send, with escapes (`\r\n`).
        s.sendall(name.encode().decode("unicode_escape").encode("latin-1"))
    elif mode == "tls":
        inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ssl.create_default_context().wrap_bio(inc, out, server_hostname=name)
        try:
            obj.do_handshake()
        except ssl.SSLWantReadError:
            pass
        s.sendall(out.read())
    else:
        s.sendall(b"hello\r\n")
    s.settimeout(3)
    try:
        d = s.recv(200)
        print("OK" if d.startswith(b"HTTP/1.0 200") else "BLOCKED")
    except socket.timeout:
        print("TIMEOUT")
except OSError as e:
    print("BLOCKED", e)
"#;

/// The outside's servers; each connection and each DNS packet is a line
/// of the log.
pub const SERVER: &str = r#"
import socket, sys, threading, time
log = open(sys.argv[1], "a", buffering=1)
addr = sys.argv[2]
def handle(c, port):
    log.write("tcp %d\n" % port)
    c.settimeout(2)
    data = b""
    try: data = c.recv(4096)
    except OSError: pass
    if port == 7002:
        # Silent: never answers, never closes; says when it is reset.
        while c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != 7:
            time.sleep(0.05)
        log.write("reset 7002\n")
    elif port == 7000:
        # Held until the client closes.
        c.settimeout(None)
        try:
            while c.recv(4096): pass
        except OSError: pass
    elif port == 7001:
        try: c.sendall(b"x" * (4 << 20))
        except OSError: pass
    else:
        try: c.sendall(b"HTTP/1.0 200 OK\r\n\r\nhello")
        except OSError: pass
    if port == 80:
        # Every Host that reached the server, pipelined ones included.
        c.settimeout(1)
        try:
            while True:
                d = c.recv(4096)
                if not d: break
                data += d
        except OSError: pass
        for line in data.split(b"\r\n"):
            if line.lower().startswith(b"host:"):
                log.write("host %s\n" % line[5:].strip().decode("latin-1"))
    c.close()
def serve(port):
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port)); ls.listen(64)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=handle, args=(c, port), daemon=True).start()
def udp(port, what):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, port))
    while True:
        _, peer = u.recvfrom(4096); log.write(what + "\n")
        if port != 53: u.sendto(b"answer", peer)
for p in (80, 443, 853, 8080, 5000, 7000, 7001, 7002):
    threading.Thread(target=serve, args=(p,), daemon=True).start()
threading.Thread(target=udp, args=(53, "dns"), daemon=True).start()
threading.Thread(target=udp, args=(853, "udp 853"), daemon=True).start()
print("ready", flush=True)
while True: time.sleep(3600)
"#;

pub static NEXT: AtomicU32 = AtomicU32::new(0);

pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace with a veth to the host and the recording servers.
pub struct Outside {
    pub ns: String,
    pub addr: String,
    log: std::path::PathBuf,
    server: Child,
    _dir: tempfile::TempDir,
}

impl Outside {
    pub fn start() -> Outside {
        require_root();
        // Unique among this binary's tests (at most five use one) and, mostly, across runs.
        let n = 20 + (std::process::id() % 40) * 5 + NEXT.fetch_add(1, Ordering::SeqCst) % 5;
        let ns = format!("egt{n}");
        let (h, i) = (format!("egt{n}h"), format!("egt{n}i"));
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let _ = Command::new("ip").args(["link", "del", &h]).output();
        ip(&["netns", "add", &ns]);
        ip(&[
            "link", "add", &h, "type", "veth", "peer", "name", &i, "netns", &ns,
        ]);
        ip(&["addr", "add", &format!("10.77.{n}.1/24"), "dev", &h]);
        ip(&["link", "set", &h, "up"]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("10.77.{n}.2/24"),
            "dev",
            &i,
        ]);
        ip(&["-n", &ns, "link", "set", &i, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        let dir = test_dir();
        let log = dir.path().join("outside.log");
        let addr = format!("10.77.{n}.2");
        let mut server = Command::new("ip")
            .args(["netns", "exec", &ns, "python3", "-c", SERVER])
            .arg(&log)
            .arg(&addr)
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the outside's servers");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(server.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("reading the servers' ready line");
        assert_eq!(line.trim(), "ready");
        Outside {
            ns,
            addr,
            log,
            server,
            _dir: dir,
        }
    }

    /// A hosts file naming the outside `allowed.test`, `other.test` and
    /// `a.wild.test`, and `loop.test` the host's loopback.
    pub fn hosts_file(&self) -> String {
        let f = self._dir.path().join("hosts");
        std::fs::write(
            &f,
            format!(
                "{0} allowed.test other.test a.wild.test\n127.0.0.1 loop.test\n",
                self.addr
            ),
        )
        .expect("writing the hosts file");
        f.to_string_lossy().into_owned()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn hits(&self, what: &str) -> usize {
        self.log().lines().filter(|l| *l == what).count()
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

pub fn policy(mode: EgressMode, allow: &[&str]) -> EgressPolicy {
    EgressPolicy {
        mode,
        allow: allow.iter().map(|s| s.parse().expect("entry")).collect(),
        ..EgressPolicy::default()
    }
}

pub async fn create(d: &Daemon, p: EgressPolicy) -> SandboxId {
    d.create_with(&CreateRequest {
        egress: Some(p),
        ..CreateRequest::default()
    })
    .await
    .id
}

/// Runs the client in `id`: `mode host port [name]`.
pub async fn probe(d: &Daemon, id: &SandboxId, args: &[&str]) -> String {
    let mut argv = vec!["python3", "-c", CLIENT];
    argv.extend_from_slice(args);
    let r = d.exec(id, &argv).await;
    String::from_utf8_lossy(&r.stdout.0).trim().to_owned()
}

pub async fn expect(d: &Daemon, id: &SandboxId, args: &[&str], want: &str) {
    let got = probe(d, id, args).await;
    assert!(
        got.starts_with(want),
        "{args:?} from {id}: expected {want}, got {got:?}"
    );
}

/// The sandbox's own address (a UDP connect sends nothing).
pub async fn own_addr(d: &Daemon, id: &SandboxId) -> String {
    d.sh(id, "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('192.0.2.1', 9)); print(s.getsockname()[0])\"")
        .await
        .trim()
        .to_owned()
}

/// A host address that is neither loopback nor a test or sandbox link's.
pub fn host_addr() -> String {
    mayfly_sys::veth::host_addresses()
        .expect("reading the host's addresses")
        .into_iter()
        .filter_map(|a| match a {
            std::net::IpAddr::V4(v4) if !v4.is_loopback() => Some(v4.to_string()),
            _ => None,
        })
        .find(|a| !a.starts_with("100.96.") && !a.starts_with("10.77."))
        .expect("the host has an IPv4 address")
}

pub fn tag(d: &Daemon) -> String {
    mayfly_engine::egress::plan::Names::for_state_dir(&d.state_dir).tag
}

pub fn links_of(tag: &str) -> Vec<String> {
    mayfly_sys::veth::list_links(&format!("mf-{tag}-")).expect("listing links")
}

pub fn table_exists(tag: &str) -> bool {
    mayfly_sys::nft::inet_tables(&format!("mayfly-{tag}"))
        .expect("listing nft tables")
        .iter()
        .any(|t| *t == format!("mayfly-{tag}"))
}

/// How many sockets `pid` holds that are connected to `addr:port` (from
/// its network namespace's `/proc/net/tcp` and its descriptors).
pub fn sockets_to(pid: u32, addr: &str, port: u16) -> usize {
    let ip: std::net::Ipv4Addr = addr.parse().expect("an IPv4 address");
    let remote = format!("{:08X}:{port:04X}", u32::from_ne_bytes(ip.octets()));
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&remote.as_str())).then(|| f.get(9).map(|i| i.to_string()))?
        })
        .filter(|i| i != "0")
        .collect();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter(|t| {
                    let t = t.to_string_lossy();
                    inodes.iter().any(|i| t == format!("socket:[{i}]"))
                })
                .count()
        })
        .unwrap_or(0)
}

pub async fn daemon_for(out: &Outside, extra: &[&str]) -> Daemon {
    let hosts = out.hosts_file();
    let mut args = vec!["--dns-hosts", hosts.as_str(), "--egress-pool", "2"];
    args.extend_from_slice(extra);
    Daemon::start_with(&args).await
}
