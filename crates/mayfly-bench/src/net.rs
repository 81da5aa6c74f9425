//! The egress measures (issue 4): cold create→ready with policy `allow`
//! against `none`, pool claims with network against without, and the two
//! mechanisms compared: Mayfly's (a veth pair into a prepared namespace,
//! nftables redirecting to the daemon's proxy) against a direct host
//! connection, for setup cost and TCP throughput (a user-space stack,
//! `pasta`, was tried; see `PASTA`).
//!
//! The results go to their own section of docs/BENCHMARKS.md, between the
//! `<!-- net:begin -->` and `<!-- net:end -->` markers, replaced whole.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use mayfly_client::Client;
use mayfly_types::{CreateRequest, EgressMode, EgressPolicy, PoolSpec, SandboxSource};

use crate::api::{call, Ledger};
use crate::daemon::Daemon;
use crate::stats::{paired_ratio_median, Samples};

const BEGIN: &str = "<!-- net:begin -->";
const END: &str = "<!-- net:end -->";
/// The outside network the throughput runs reach: a namespace of the
/// bench's own with a sink server.
const OUTSIDE_NS: &str = "mfbench-out";
const SINK: &str = "10.78.0.2";
/// Bytes each throughput run sends.
const BYTES: u64 = 256 << 20;

/// Every figure of the section.
#[derive(Default)]
pub struct NetReport {
    pub rows: Vec<(String, Samples)>,
    pub ratios: Vec<(String, Option<f64>)>,
    pub throughput: Vec<(String, f64)>,
    pub notes: Vec<String>,
}

fn allow() -> EgressPolicy {
    EgressPolicy {
        mode: EgressMode::Allow,
        allow: vec!["sink.test:9000".parse().expect("entry")],
        ..EgressPolicy::default()
    }
}

async fn timed_create(
    c: &Client,
    egress: Option<EgressPolicy>,
    ledger: &mut Ledger,
) -> anyhow::Result<(Duration, mayfly_types::SandboxInfo)> {
    let req = CreateRequest {
        egress,
        ..CreateRequest::default()
    };
    let t = Instant::now();
    let sb = call("creating a sandbox", c.create(&req)).await?;
    let took = t.elapsed();
    ledger.note(&sb);
    Ok((took, sb))
}

/// Cold create→ready, `none` and `allow` alternating.
pub async fn cold(
    d: &Daemon,
    n: usize,
    warmup: usize,
    ledger: &mut Ledger,
    r: &mut NetReport,
) -> anyhow::Result<()> {
    let c = &d.client;
    let (mut none, mut allowed) = (Samples::new(), Samples::new());
    for i in 0..warmup + n {
        // Each create alone on the daemon: its destroy is finished first.
        let (tn, a) = timed_create(c, None, ledger).await?;
        call("destroying", c.destroy(&a.id)).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (ta, b) = timed_create(c, Some(allow()), ledger).await?;
        ensure!(
            b.source == SandboxSource::Cold,
            "the allow create was not cold"
        );
        call("destroying", c.destroy(&b.id)).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        if i >= warmup {
            none.push(tn);
            allowed.push(ta);
        }
    }
    r.ratios.push((
        "cold create, allow / none (paired median)".into(),
        paired_ratio_median(&allowed, &none),
    ));
    r.rows.push(("cold create→ready, egress none".into(), none));
    r.rows
        .push(("cold create→ready, egress allow".into(), allowed));
    Ok(())
}

async fn settle(c: &Client, name: &str, ready: u32) -> anyhow::Result<()> {
    crate::pool::settle_pool(c, name, ready, Duration::from_secs(60)).await?;
    Ok(())
}

/// Pool claims, with network and without, alternating, each against a
/// full, quiet pool.
pub async fn claims(
    d: &Daemon,
    n: usize,
    warmup: usize,
    ledger: &mut Ledger,
    r: &mut NetReport,
) -> anyhow::Result<()> {
    let c = &d.client;
    for (name, network) in [("plain", false), ("net", true)] {
        let spec = PoolSpec {
            target: Some(4),
            max: Some(4),
            network: Some(network),
            ..PoolSpec::default()
        };
        call("setting a pool", c.set_pool(name, &spec)).await?;
    }
    let (mut plain, mut net) = (Samples::new(), Samples::new());
    for i in 0..warmup + n {
        settle(c, "plain", 4).await?;
        settle(c, "net", 4).await?;
        // Alternating which goes first: the second claim meets the first
        // one's refill starting.
        let ((tp, a), (tn, b)) = if i % 2 == 0 {
            let p = timed_create(c, None, ledger).await?;
            (p, timed_create(c, Some(allow()), ledger).await?)
        } else {
            let n = timed_create(c, Some(allow()), ledger).await?;
            (timed_create(c, None, ledger).await?, n)
        };
        ensure!(
            a.source == SandboxSource::Pool && b.source == SandboxSource::Pool,
            "a claim missed its pool"
        );
        call("destroying", c.destroy(&a.id)).await?;
        call("destroying", c.destroy(&b.id)).await?;
        if i >= warmup {
            plain.push(tp);
            net.push(tn);
        }
    }
    for name in ["plain", "net"] {
        call("draining a pool", c.drain_pool(name)).await?;
    }
    r.ratios.push((
        "pool claim, with network / without (paired median)".into(),
        paired_ratio_median(&net, &plain),
    ));
    r.rows.push(("pool claim, no network".into(), plain));
    r.rows
        .push(("pool claim, with network (policy swapped in)".into(), net));
    Ok(())
}

fn sh(args: &[&str]) -> anyhow::Result<()> {
    let st = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .with_context(|| format!("running {args:?}"))?;
    ensure!(st.success(), "{args:?} failed: {st}");
    Ok(())
}

/// Why the user-space stack has no row: what was tried, and what happened.
const PASTA: &str = "The user-space alternative was tried with `pasta` (Debian bookworm's passt \
    0.0~git20230309) and could not be measured on this host: run as root it drops to `nobody`, cannot \
    write its user namespace's `uid_map`, and then spins at 100% CPU without ever running even `true` \
    (observed for 10 minutes). Its setup cost is at least a process, a user and network namespace and a \
    tap device, more than the veth path's namespace and pair, and its data path copies every packet \
    through a user-space TCP stack on top of the proxy's own copy. See docs/ARCHITECTURE.md, Egress.";

/// Setup and teardown of one veth-wired namespace, made the way the
/// daemon prepares them (`mayfly_sys::veth`).
pub fn setup_costs(n: usize, r: &mut NetReport) -> anyhow::Result<()> {
    let (mut veth, mut teardown) = (Samples::new(), Samples::new());
    for i in 0..n {
        let plan = mayfly_sys::veth::VethPlan {
            host_if: format!("mf-bench-{i}"),
            host_addr: std::net::Ipv4Addr::new(100, 97, (i / 64) as u8, (i % 64 * 4 + 1) as u8),
            sandbox_addr: std::net::Ipv4Addr::new(100, 97, (i / 64) as u8, (i % 64 * 4 + 2) as u8),
            prefix: 30,
        };
        let t = Instant::now();
        let ns = mayfly_sys::veth::make_netns_with_veth(&plan)?;
        veth.push(t.elapsed());
        let t = Instant::now();
        mayfly_sys::veth::delete_link(&plan.host_if)?;
        drop(ns);
        teardown.push(t.elapsed());
    }
    r.rows.push((
        "veth namespace setup (netns, pair, addresses, route)".into(),
        veth,
    ));
    r.rows
        .push(("veth namespace teardown (link delete)".into(), teardown));
    r.notes.push(PASTA.into());
    Ok(())
}

/// A namespace with a sink server that counts what it receives.
pub struct Outside;

impl Outside {
    pub fn start() -> anyhow::Result<Outside> {
        let _ = Command::new("ip")
            .args(["netns", "del", OUTSIDE_NS])
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", "mfbench-h"])
            .status();
        sh(&["ip", "netns", "add", OUTSIDE_NS])?;
        sh(&[
            "ip",
            "link",
            "add",
            "mfbench-h",
            "type",
            "veth",
            "peer",
            "name",
            "mfbench-i",
            "netns",
            OUTSIDE_NS,
        ])?;
        sh(&["ip", "addr", "add", "10.78.0.1/24", "dev", "mfbench-h"])?;
        sh(&["ip", "link", "set", "mfbench-h", "up"])?;
        sh(&[
            "ip",
            "-n",
            OUTSIDE_NS,
            "addr",
            "add",
            "10.78.0.2/24",
            "dev",
            "mfbench-i",
        ])?;
        sh(&["ip", "-n", OUTSIDE_NS, "link", "set", "mfbench-i", "up"])?;
        sh(&["ip", "-n", OUTSIDE_NS, "link", "set", "lo", "up"])?;
        let sink = "import socket, threading\n\
            ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
            ls.bind(('10.78.0.2', 9000)); ls.listen(16)\n\
            def h(c):\n    n = 0\n    while True:\n        d = c.recv(1 << 20)\n        if not d: break\n        n += len(d)\n    c.sendall(str(n).encode()); c.close()\n\
            while True:\n    c, _ = ls.accept(); threading.Thread(target=h, args=(c,), daemon=True).start()\n";
        Command::new("ip")
            .args(["netns", "exec", OUTSIDE_NS, "python3", "-c", sink])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the sink")?;
        std::thread::sleep(Duration::from_millis(300));
        Ok(Outside)
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        // Deleting the namespace kills nothing; its server is found by it.
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", OUTSIDE_NS])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").arg(pid).status();
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", OUTSIDE_NS])
            .status();
    }
}

/// Sends `BYTES` to the sink and prints MB/s (the sink's count must match).
const CLIENT: &str = "import socket, sys, time\n\
    host, n = sys.argv[1], int(sys.argv[2])\n\
    buf = b'x' * (1 << 20)\n\
    t = time.monotonic(); s = socket.create_connection((host, 9000))\n\
    sent = 0\n\
    while sent < n:\n    s.sendall(buf); sent += len(buf)\n\
    s.shutdown(socket.SHUT_WR); got = int(s.recv(64)); el = time.monotonic() - t\n\
    assert got == n, (got, n)\n\
    print('%.1f' % (n / el / 1e6))\n";

fn mbps(out: &[u8]) -> anyhow::Result<f64> {
    String::from_utf8_lossy(out)
        .trim()
        .parse::<f64>()
        .context("reading the client's MB/s")
}

/// TCP throughput to the sink: from the host directly, from a sandbox
/// through Mayfly's proxy, and from a pasta namespace.
pub async fn throughput(d: &Daemon, ledger: &mut Ledger, r: &mut NetReport) -> anyhow::Result<()> {
    let n = BYTES.to_string();
    let direct = Command::new("python3")
        .args(["-c", CLIENT, SINK, &n])
        .output()?;
    ensure!(
        direct.status.success(),
        "the direct run failed: {}",
        String::from_utf8_lossy(&direct.stderr)
    );
    r.throughput
        .push(("host → sink, direct".into(), mbps(&direct.stdout)?));
    let (_, sb) = timed_create(&d.client, Some(allow()), ledger).await?;
    let exec = mayfly_types::ExecRequest {
        argv: vec![
            "python3".into(),
            "-c".into(),
            CLIENT.into(),
            "sink.test".into(),
            n.clone(),
        ],
        ..mayfly_types::ExecRequest::default()
    };
    let res = call(
        "running the client in a sandbox",
        d.client.exec(&sb.id, &exec),
    )
    .await?;
    ensure!(
        res.status.exit_code == Some(0),
        "the sandbox run failed: {}",
        String::from_utf8_lossy(&res.stderr.0)
    );
    r.throughput.push((
        "sandbox → sink, veth + nftables + Mayfly's proxy (allow, Host/SNI not involved)".into(),
        mbps(&res.stdout.0)?,
    ));
    call("destroying", d.client.destroy(&sb.id)).await?;
    Ok(())
}

fn ms(v: f64) -> String {
    format!("{v:.2}")
}

/// The section, markers included.
pub fn markdown(r: &NetReport, when: &str, machine: &str, command: &str, commit: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{BEGIN}\n## Egress (issue 4)\n");
    let _ = writeln!(s, "Generated by `mayfly-bench net`; do not edit by hand. Measured on {when}, {machine}, at {commit}.\n");
    let _ = writeln!(s, "Reproduce (as root, with `nftables` installed):\n\n```sh\ncargo build --release -p mayfly -p mayfly-bench\n{command}\n```\n");
    let _ = writeln!(s, "### Latency (milliseconds)\n\n| measure | n | p50 | p95 | p99 | mean |\n| --- | --- | --- | --- | --- | --- |");
    for (name, samples) in &r.rows {
        if let Some(x) = samples.summary() {
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {} | {} | {} |",
                x.n,
                ms(x.p50),
                ms(x.p95),
                ms(x.p99),
                ms(x.mean)
            );
        }
    }
    let _ = writeln!(s, "\n### Ratios\n\n| ratio | value |\n| --- | --- |");
    for (name, v) in &r.ratios {
        let _ = writeln!(
            s,
            "| {name} | {} |",
            v.map_or("n/a".into(), |v| format!("{v:.2}"))
        );
    }
    let _ = writeln!(
        s,
        "\n### TCP throughput, one connection, {} MiB\n\n| path | MB/s |\n| --- | --- |",
        BYTES >> 20
    );
    for (name, v) in &r.throughput {
        let _ = writeln!(s, "| {name} | {v:.0} |");
    }
    if !r.notes.is_empty() {
        let _ = writeln!(s, "\n### Notes\n");
        for n in &r.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    let _ = writeln!(s, "{END}");
    s
}

/// Puts the section into `file`: replaces the previous one, or appends.
pub fn write_section(file: &Path, section: &str) -> anyhow::Result<()> {
    crate::section::write(file, BEGIN, END, section)
}
