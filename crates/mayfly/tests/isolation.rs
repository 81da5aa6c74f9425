//! Each isolation property of a sandbox, proved from inside it and checked
//! against the host, on the real daemon.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::host::{self, oom_kills, procs_inside};
use common::{
    assert_no_leaks, cmd, expect_exit, host_exists, test_dir, text, unique, Daemon,
    SANDBOX_UID_START,
};
use mayfly_types::{ExecRequest, Limits, StartProcessRequest};

/// Numeric entries of a `/proc` listing.
fn pids_listed(ls: &str) -> BTreeSet<u32> {
    ls.split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect()
}

#[tokio::test]
async fn exec_cannot_see_host_pids() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let host_pids = host::all_pids();
    assert!(host_pids.len() > 5, "the host shows only {host_pids:?}");

    let inside = pids_listed(&d.sh(&sb.id, "ls /proc").await);
    // Init (1), the shell and its `ls`: nothing else lives in the pid namespace.
    assert!(
        inside.len() <= 3 && inside.contains(&1) && inside.iter().all(|p| *p < 100),
        "the sandbox's /proc lists {inside:?}"
    );
    for host_pid in [d.pid, std::process::id()] {
        if host_pid > 100 {
            assert!(
                !inside.contains(&host_pid),
                "host pid {host_pid} is visible: {inside:?}"
            );
        }
    }
    let shell_pid: u32 = d.sh(&sb.id, "echo $$").await.trim().parse().expect("a pid");
    assert!(shell_pid < 10, "pid numbering inside starts at {shell_pid}");

    // Pid 1 is Mayfly's init, not the host's.
    let host_init = std::fs::read("/proc/1/cmdline").expect("reading the host's /proc/1/cmdline");
    let r = d.exec(&sb.id, &["cat", "/proc/1/cmdline"]).await;
    assert_eq!(r.status.exit_code, Some(0), "{}", text(&r.stderr.0));
    assert_ne!(r.stdout.0, host_init, "pid 1 inside is the host's init");
    let init = d.sh(&sb.id, "cat /proc/1/comm").await;
    assert_eq!(
        init.trim(),
        "mayfly-init",
        "pid 1 inside should be Mayfly's init"
    );
}

#[tokio::test]
async fn the_daemons_command_line_and_environment_are_not_visible_inside() {
    // A daemon whose argv and environment carry a secret (a TCP bearer
    // token) and host paths (its state directory).
    let token = unique("mayfly-secret-token");
    let d = Daemon::start_with(&["--tcp", "127.0.0.1:0", "--token", &token]).await;
    let sb = d.create().await;
    let state = d.state_dir.display().to_string();
    // Every process a sandbox can see: its own /proc, every pid in it.
    let seen = d
        .sh(
            &sb.id,
            "for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do tr '\\0' ' ' < $f 2>/dev/null; echo; done",
        )
        .await;
    assert!(
        !seen.contains(&token),
        "a sandbox can read the daemon's bearer token:\n{seen}"
    );
    assert!(
        !seen.contains(&state),
        "a sandbox can read the daemon's state directory:\n{seen}"
    );
}

#[tokio::test]
async fn hostname_is_the_sandbox_id_and_the_hosts_is_untouched() {
    let d = Daemon::start().await;
    let before = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("host hostname");
    let sb = d.create().await;
    assert_eq!(d.sh(&sb.id, "hostname").await.trim(), sb.id.as_str());
    assert_eq!(
        d.sh(&sb.id, "cat /proc/sys/kernel/hostname").await.trim(),
        sb.id.as_str()
    );
    let after = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("host hostname");
    assert_eq!(
        before, after,
        "creating a sandbox changed the host's hostname"
    );
}

#[tokio::test]
async fn ipc_namespace_hides_host_shared_memory() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    // SAFETY: shmget of a new private segment; it is removed below.
    let shmid = unsafe { libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o600) };
    assert!(
        shmid >= 0,
        "shmget on the host failed: {}",
        std::io::Error::last_os_error()
    );
    let host_view = std::fs::read_to_string("/proc/sysvipc/shm").unwrap_or_default();
    let inside = d.sh(&sb.id, "cat /proc/sysvipc/shm").await;
    // SAFETY: removing the segment created above; no pointer is involved.
    unsafe { libc::shmctl(shmid, libc::IPC_RMID, std::ptr::null_mut()) };

    // Rows are `key shmid perms size …`; find ours by its shmid.
    let key = shmid;
    let has_key = |table: &str| {
        table
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(1) == Some(&shmid.to_string()))
    };
    assert!(
        has_key(&host_view),
        "the host's own table lacks segment {shmid}: {host_view}"
    );
    assert!(
        !has_key(&inside),
        "the sandbox sees the host's segment {key}:\n{inside}"
    );
    assert_eq!(
        inside.lines().skip(1).count(),
        0,
        "the sandbox sees segments:\n{inside}"
    );
}

#[tokio::test]
async fn every_namespace_differs_from_the_hosts() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let kinds = ["uts", "ipc", "net", "pid", "mnt", "user", "cgroup"];
    let script: String = kinds
        .iter()
        .map(|k| format!("readlink /proc/self/ns/{k};"))
        .collect();
    let inside = d.sh(&sb.id, &script).await;
    let inside: Vec<&str> = inside.lines().collect();
    assert_eq!(inside.len(), kinds.len(), "{inside:?}");
    for (kind, seen) in kinds.iter().zip(inside) {
        let host = std::fs::read_link(format!("/proc/self/ns/{kind}")).expect("host ns link");
        assert_eq!(&seen[..kind.len()], *kind);
        assert_ne!(
            seen,
            host.to_string_lossy(),
            "the sandbox shares the host's {kind} namespace"
        );
    }
}

#[tokio::test]
async fn root_inside_is_an_unprivileged_uid_outside() {
    let d = Daemon::start().await;
    let a = d.create().await;
    let b = d.create().await;
    assert_eq!(d.sh(&a.id, "id -u").await.trim(), "0");
    let map = d.sh(&a.id, "cat /proc/self/uid_map").await;
    let map: Vec<&str> = map.split_whitespace().collect();
    assert_eq!(
        map,
        ["0", &a.uid_base.to_string(), "65536"],
        "uid_map inside"
    );

    let req = StartProcessRequest {
        argv: vec!["sleep".into(), "30".into()],
        ..StartProcessRequest::default()
    };
    d.client
        .start_process(&a.id, &req)
        .await
        .expect("starting sleep");
    let mut sleeps = Vec::new();
    let found = common::eventually(Duration::from_secs(15), || {
        sleeps = procs_inside(a.id.as_str(), a.init_pid)
            .into_iter()
            .filter(|p| p.comm == "sleep")
            .collect();
        !sleeps.is_empty()
    })
    .await;
    assert!(found, "no `sleep` in {}'s cgroup on the host", a.id);
    for p in &sleeps {
        assert!(
            p.uid >= SANDBOX_UID_START,
            "root inside runs as host uid {}: {p:?}",
            p.uid
        );
        assert_eq!(
            p.uid, a.uid_base,
            "root inside should map to the sandbox's uid_base"
        );
    }
    let inside = procs_inside(a.id.as_str(), a.init_pid);
    assert!(
        inside.len() >= 2,
        "expected init and sleep inside: {inside:?}"
    );
    for p in inside {
        assert!(
            p.uid >= SANDBOX_UID_START,
            "a process inside runs as host uid {}: {p:?}",
            p.uid
        );
    }
    assert!(a.uid_base >= SANDBOX_UID_START && b.uid_base >= SANDBOX_UID_START);
    assert!(
        a.uid_base.abs_diff(b.uid_base) >= 65536,
        "two live sandboxes share uids: {} and {}",
        a.uid_base,
        b.uid_base
    );
}

/// Two Mayfly instances with their own state directories (two daemons, or a
/// daemon and a daemonless run) never hand out the same uid range: slots are
/// leased host-wide, and a lease lives exactly as long as its sandbox.
#[tokio::test]
async fn uid_ranges_are_unique_across_instances_on_the_host() {
    let (one, two) = (Daemon::start().await, Daemon::start().await);
    let mut live = Vec::new();
    for _ in 0..3 {
        for d in [&one, &two] {
            live.push((d, d.create().await));
        }
    }
    let mut bases: Vec<u32> = live.iter().map(|(_, s)| s.uid_base).collect();
    bases.sort_unstable();
    bases.dedup();
    let infos: Vec<_> = live.iter().map(|(_, s)| s).collect();
    assert_eq!(bases.len(), live.len(), "uid ranges shared: {infos:#?}");
    // A daemonless run on a third state directory, while all six live,
    // runs as a uid outside all their ranges.
    let state = test_dir();
    let out = common::daemonless(&state, &["run", "--", "sh", "-c", "cat /proc/self/uid_map"]);
    let map = expect_exit(&out, 0, "daemonless run");
    common::daemonless::drain_spares(&state);
    let base: u32 = map.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(
        base >= SANDBOX_UID_START && !bases.contains(&base),
        "the daemonless run got uid base {base}, already in {bases:?}"
    );
    for (d, sb) in &live {
        d.client.destroy(&sb.id).await.unwrap();
    }
}

#[tokio::test]
async fn network_has_only_loopback() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let dev = d.sh(&sb.id, "cat /proc/net/dev").await;
    let ifaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .collect();
    assert_eq!(
        ifaces.iter().map(|s| s.trim()).collect::<Vec<_>>(),
        ["lo"],
        "{dev}"
    );

    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a host listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("its address").port();
    for (host, port) in [("127.0.0.1", port), ("1.1.1.1", 53)] {
        let script = format!(
            "import socket\ns = socket.socket()\ns.settimeout(3)\ns.connect(('{host}', {port}))\nprint('connected')"
        );
        let r = d.exec(&sb.id, &["python3", "-c", &script]).await;
        assert_ne!(
            r.status.exit_code,
            Some(0),
            "connecting to {host}:{port} worked"
        );
        assert!(!text(&r.stdout.0).contains("connected"));
        let err = text(&r.stderr.0);
        assert!(
            err.contains("refused") || err.contains("unreachable"),
            "connecting to {host}:{port} failed oddly: {err}"
        );
    }
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the host listener got a connection from the sandbox: {other:?}"),
    }
}

#[tokio::test]
async fn host_secrets_and_homes_are_not_visible() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let r = d.exec(&sb.id, &["cat", "/etc/shadow"]).await;
    assert_ne!(
        r.status.exit_code,
        Some(0),
        "/etc/shadow is readable inside"
    );
    assert!(r.stdout.0.is_empty());

    // No line of the host's shadow file appears anywhere in the sandbox's /etc.
    let etc = d.sh(&sb.id, "cat /etc/* /etc/*/* 2>/dev/null; true").await;
    let shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
    for line in shadow.lines().filter(|l| l.len() > 10) {
        assert!(
            !etc.contains(line),
            "host shadow line visible in the sandbox's /etc: {line}"
        );
    }
    assert_eq!(
        d.sh(&sb.id, "ls -A /root /home | grep -v : | grep . ; true")
            .await,
        ""
    );
    let state = d.state_dir.display().to_string();
    for path in ["/work/main", "/work", state.as_str(), "/var/lib/mayfly"] {
        let r = d.exec(&sb.id, &["test", "-e", path]).await;
        assert_eq!(
            r.status.exit_code,
            Some(1),
            "{path} exists inside the sandbox"
        );
    }
}

#[tokio::test]
async fn fork_bomb_is_stopped_by_the_pids_limit_and_the_host_is_unaffected() {
    let mut d = Daemon::start().await;
    let bomb = d
        .create_limited(Limits {
            pids: Some(64),
            ..Limits::default()
        })
        .await;
    let other = d.create().await;
    let req = ExecRequest {
        timeout_ms: Some(4000),
        ..cmd(&[
            "sh",
            "-c",
            "i=0; while [ $i -lt 500 ]; do sleep 20 & i=$((i+1)); done; wait",
        ])
    };
    let t = Instant::now();
    let r = d.exec_req(&bomb.id, &req).await;
    let err = text(&r.stderr.0);
    assert!(
        err.contains("Resource temporarily unavailable") || err.contains("Cannot fork"),
        "no fork failure reported: {:?}, stderr {err:?}",
        r.status
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the bomb ran {:?}",
        t.elapsed()
    );
    let max = host::cgroup_file(bomb.id.as_str(), ("pids", "pids.max"), "pids.max");
    assert_eq!(max.as_deref().map(str::trim), Some("64"));
    if let Some(peak) = host::cgroup_file(bomb.id.as_str(), ("pids", "pids.peak"), "pids.peak") {
        let peak: u32 = peak.trim().parse().expect("pids.peak");
        assert!(peak <= 64, "the sandbox reached {peak} tasks");
    }

    // The host, the daemon and other sandboxes carry on.
    let host = std::process::Command::new("true")
        .status()
        .expect("forking on the host");
    assert!(host.success());
    d.assert_healthy().await;
    assert_eq!(d.sh(&other.id, "echo still here").await, "still here\n");
    assert_eq!(d.sh(&bomb.id, "echo recovered").await, "recovered\n");

    d.client
        .destroy(&bomb.id)
        .await
        .expect("destroying the bomb");
    assert_no_leaks(&d.state_dir, &[bomb.id.as_str()]);
}

#[tokio::test]
async fn memory_hog_is_oom_killed_inside_its_cgroup_while_the_daemon_serves() {
    let mut d = Daemon::start().await;
    let sb = d
        .create_limited(Limits {
            memory_bytes: Some(64 << 20),
            ..Limits::default()
        })
        .await;
    let hog = "b = bytearray(512*1024*1024); b[::4096] = b'x' * len(b[::4096]); print('survived')";
    let r = d
        .exec_req(
            &sb.id,
            &ExecRequest {
                timeout_ms: Some(30_000),
                ..cmd(&["python3", "-c", hog])
            },
        )
        .await;
    assert!(
        !r.status.timed_out,
        "the hog was not killed by the OOM killer"
    );
    assert!(
        !text(&r.stdout.0).contains("survived"),
        "512 MiB fit in a 64 MiB sandbox"
    );
    assert!(
        r.status.signal == Some(9) || r.status.exit_code == Some(137),
        "the hog was not SIGKILLed: {:?}, stderr {:?}",
        r.status,
        text(&r.stderr.0)
    );
    let kills = oom_kills(sb.id.as_str());
    assert!(
        kills.is_some_and(|k| k >= 1),
        "the sandbox's memory cgroup counts {kills:?} OOM kills"
    );
    d.assert_healthy().await;
    assert_eq!(
        d.sh(&sb.id, "echo ok").await,
        "ok\n",
        "the sandbox died with its hog"
    );
}

#[tokio::test]
async fn writes_are_invisible_to_other_sandboxes_and_gone_after_destroy() {
    let d = Daemon::start().await;
    let a = d.create().await;
    let b = d.create().await;
    let name = unique("mayfly-x");
    let script = format!(
        "echo secret > /workspace/secret && echo '#!/bin/sh' > /usr/local/bin/{name} && \
         chmod 755 /usr/local/bin/{name} && cat /workspace/secret"
    );
    assert_eq!(d.sh(&a.id, &script).await, "secret\n");
    let host_copy = format!("/usr/local/bin/{name}");
    assert!(
        !host_exists(&host_copy),
        "a sandbox's write reached the host: {host_copy}"
    );
    for path in ["/workspace/secret".to_owned(), host_copy.clone()] {
        let r = d.exec(&b.id, &["test", "-e", &path]).await;
        assert_eq!(
            r.status.exit_code,
            Some(1),
            "sandbox {} sees {}'s {path}",
            b.id,
            a.id
        );
    }
    let dir = d.sandbox_dir(&a.id);
    assert!(
        dir.exists(),
        "{} should hold {}'s upper layer",
        dir.display(),
        a.id
    );

    d.client.destroy(&a.id).await.expect("destroy");
    assert_no_leaks(&d.state_dir, &[a.id.as_str()]);
    let r = d.exec(&b.id, &["test", "-e", "/workspace/secret"]).await;
    assert_eq!(r.status.exit_code, Some(1));
    let fresh = d.create().await;
    let r = d
        .exec(&fresh.id, &["test", "-e", "/workspace/secret"])
        .await;
    assert_eq!(
        r.status.exit_code,
        Some(1),
        "a new sandbox sees a destroyed one's file"
    );
}

#[tokio::test]
async fn commands_run_under_the_seccomp_allowlist_with_reduced_capabilities() {
    let d = Daemon::start().await;
    let sb = d.create().await;
    let status = d
        .sh(
            &sb.id,
            "grep -E '^(Seccomp|NoNewPrivs|CapBnd):' /proc/self/status",
        )
        .await;
    assert!(status.contains("Seccomp:\t2"), "not filtered: {status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    // Docker's default set: CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID
    // SETUID SETPCAP NET_BIND_SERVICE NET_RAW SYS_CHROOT MKNOD AUDIT_WRITE
    // SETFCAP.
    assert!(status.contains("CapBnd:\t00000000a80425fb"), "{status}");
    // The allowlist denies new namespaces even to root inside.
    let r = d.exec(&sb.id, &["unshare", "-U", "true"]).await;
    assert_ne!(r.status.exit_code, Some(0), "unshare -U succeeded inside");
    // init, pid 1, is bound by the same filter.
    let init = d.sh(&sb.id, "grep '^Seccomp:' /proc/1/status").await;
    assert!(init.contains("Seccomp:\t2"), "init not filtered: {init}");
    d.client.destroy(&sb.id).await.expect("destroy");
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
}
