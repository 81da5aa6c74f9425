//! Nothing leaks: not after many create/exec/destroy cycles, not after the
//! daemon is killed with live sandboxes, not after a failed create; and one
//! Mayfly instance never tears down another's sandboxes.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::host::{self, children_of, procs_in_sandbox, start_time};
use common::{assert_no_leaks, cmd, host_exists, test_dir, text, Daemon};
use mayfly_client::Client;
use mayfly_types::{
    CreateRequest, ErrorCode, SandboxId, SandboxState, StartProcessRequest, TemplateRef,
};

const CYCLES: usize = 200;
const WORKERS: usize = 2;

async fn cycles(client: Client, worker: usize, n: usize) -> Vec<SandboxId> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let sb = client
            .create(&CreateRequest::default())
            .await
            .expect("create");
        let word = format!("w{worker}-{i}");
        let r = client
            .exec(&sb.id, &cmd(&["echo", &word]))
            .await
            .expect("exec");
        assert_eq!(
            text(&r.stdout.0),
            format!("{word}\n"),
            "cycle {i} of worker {worker}"
        );
        let gone = client.destroy(&sb.id).await.expect("destroy");
        assert!(
            matches!(gone.state, SandboxState::Stopping | SandboxState::Destroyed),
            "cycle {i}: {gone:?}"
        );
        ids.push(sb.id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_create_exec_destroy_cycles_leave_nothing_behind() {
    let d = Daemon::start().await;
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| tokio::spawn(cycles(d.client.clone(), w, CYCLES / WORKERS)))
        .collect();
    let mut ids = Vec::new();
    for w in workers {
        ids.extend(w.await.expect("a worker panicked"));
    }
    assert_eq!(ids.len(), CYCLES);
    let ids: Vec<&str> = ids.iter().map(SandboxId::as_str).collect();
    assert_no_leaks(&d.state_dir, &ids);
    assert!(d.client.list(false).await.expect("list").is_empty());
    // The record turns `destroyed` when the background cleanup finishes.
    let t = std::time::Instant::now();
    loop {
        let all = d.client.list(true).await.expect("list all");
        assert_eq!(all.len(), CYCLES);
        let pending: Vec<_> = all
            .iter()
            .filter(|s| s.state != SandboxState::Destroyed)
            .collect();
        if pending.is_empty() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "records not destroyed within 15 s: {pending:?}; log:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A process, identified by pid and start time so a reused pid is not it.
fn alive(pid: u32, started: u64) -> bool {
    start_time(pid) == Some(started) && host::proc_info(pid).is_some_and(|p| !p.is_zombie())
}

#[tokio::test]
async fn killing_the_daemon_kills_its_sandboxes_and_restart_recovers_everything() {
    let mut d = Daemon::start().await;
    let mut ids = Vec::new();
    let sleep = StartProcessRequest {
        argv: vec!["sleep".into(), "1000".into()],
        ..StartProcessRequest::default()
    };
    for _ in 0..10 {
        let sb = d.create().await;
        d.client
            .start_process(&sb.id, &sleep)
            .await
            .expect("start sleep");
        ids.push(sb.id);
    }
    let ready = common::eventually(Duration::from_secs(15), || {
        ids.iter().all(|id| {
            procs_in_sandbox(id.as_str())
                .iter()
                .any(|p| p.comm == "sleep")
        })
    })
    .await;
    assert!(ready, "not every sandbox shows its sleep on the host");
    // Everything the daemon started: the zygote, every init, every sleep.
    let mut victims: Vec<(u32, u64, String)> = children_of(d.pid)
        .into_iter()
        .chain(ids.iter().flat_map(|id| procs_in_sandbox(id.as_str())))
        .filter_map(|p| Some((p.pid, start_time(p.pid)?, p.comm)))
        .collect();
    victims.sort();
    victims.dedup();
    assert!(
        victims.len() >= 21,
        "expected a zygote, 10 inits and 10 sleeps: {victims:?}"
    );
    // Every Mayfly cgroup the daemon's processes sit in, including any it
    // prepared for sandboxes not yet asked for.
    let prepared = host::cgroup_ids_below(d.pid);

    d.kill9();
    let mut left = Vec::new();
    let dead = common::eventually(Duration::from_secs(15), || {
        left = victims
            .iter()
            .filter(|(p, t, _)| alive(*p, *t))
            .cloned()
            .collect();
        left.is_empty()
    })
    .await;
    assert!(
        dead,
        "processes outlived the daemon's kill -9 by 15 s: {left:?}"
    );

    // Stub markers whose writers died before renaming them: one names a
    // dead owner, one was left empty a while ago. One being written by a
    // live owner (this test) is left alone.
    let stubs = d.state_dir.join("stubs");
    let (dead_pid, dead_start, _) = victims[0].clone();
    let dead = stubs.join(".mf-deadwriter00");
    std::fs::write(&dead, format!("{dead_pid} {dead_start}\n")).expect("planting a marker");
    let empty = stubs.join(".mf-emptywriter0");
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::create(&empty)
        .and_then(|f| f.set_modified(old))
        .expect("planting an empty marker");
    let live = stubs.join(".mf-livewriter00");
    let me = std::process::id();
    let me_start = start_time(me).expect("this test's start time");
    std::fs::write(&live, format!("{me} {me_start}\n")).expect("planting a live marker");

    d.restart().await;
    assert!(
        !host_exists(&dead) && !host_exists(&empty),
        "recovery left dead writers' stub markers"
    );
    assert!(
        host_exists(&live),
        "recovery removed a live writer's marker"
    );
    std::fs::remove_file(&live).expect("removing the planted marker");
    for id in &ids {
        let info = d
            .client
            .get(id)
            .await
            .expect("the record survives the crash");
        assert_eq!(info.state, SandboxState::Failed, "{info:?}");
        let reason = info.reason.clone().unwrap_or_default();
        assert!(reason.contains("owner_died"), "{id}: reason {reason:?}");
        assert_eq!(info.init_pid, None);
    }
    assert!(d.client.list(false).await.expect("list").is_empty());
    let mut all: BTreeSet<&str> = ids.iter().map(SandboxId::as_str).collect();
    all.extend(prepared.iter().map(String::as_str));
    assert_no_leaks(&d.state_dir, &all.into_iter().collect::<Vec<_>>());
    // The restarted daemon works.
    let sb = d.create().await;
    assert_eq!(d.sh(&sb.id, "echo back").await, "back\n");
}

#[tokio::test]
async fn stopping_the_daemon_destroys_its_sandboxes_and_leaves_nothing() {
    let mut d = Daemon::start().await;
    let mut ids = BTreeSet::new();
    for _ in 0..3 {
        let sb = d.create().await;
        let sleep = StartProcessRequest {
            argv: vec!["sleep".into(), "1000".into()],
            ..StartProcessRequest::default()
        };
        d.client
            .start_process(&sb.id, &sleep)
            .await
            .expect("start sleep");
        ids.insert(sb.id.to_string());
    }
    ids.extend(host::cgroup_ids_below(d.pid));
    let tree: Vec<(u32, u64, String)> = host::descendants(d.pid)
        .into_iter()
        .filter_map(|p| Some((p.pid, start_time(p.pid)?, p.comm)))
        .collect();
    assert!(
        tree.len() >= 8,
        "expected the daemon, a zygote, 3 inits and 3 sleeps: {tree:?}"
    );

    d.stop();
    // The zygote dies of its parent-death SIGKILL as the daemon exits; the
    // kernel delivers that asynchronously, so give it a moment on a busy host.
    let gone = common::eventually(std::time::Duration::from_secs(15), || {
        tree.iter().all(|(p, t, _)| !alive(*p, *t))
    })
    .await;
    let left: Vec<_> = tree.iter().filter(|(p, t, _)| alive(*p, *t)).collect();
    assert!(
        gone,
        "processes outlived the daemon's SIGTERM shutdown by 15 s: {left:?}"
    );
    assert_no_leaks(&d.state_dir, &ids.iter().collect::<Vec<_>>());
}

#[tokio::test]
async fn another_instance_starting_leaves_live_sandboxes_alone() {
    let a = Daemon::start().await;
    let sb = a.create().await;
    let sleep = StartProcessRequest {
        argv: vec!["sleep".into(), "1000".into()],
        ..StartProcessRequest::default()
    };
    let p = a
        .client
        .start_process(&sb.id, &sleep)
        .await
        .expect("start sleep");
    let cgroups = host::cgroup_dirs(sb.id.as_str());
    assert!(!cgroups.is_empty());

    // A second daemon and a daemonless run, each with its own state directory.
    let mut b = Daemon::start().await;
    let dir = test_dir();
    let out = common::daemonless(&dir, &["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    common::daemonless::drain_spares(&dir);
    b.assert_healthy().await;

    assert_eq!(
        host::cgroup_dirs(sb.id.as_str()),
        cgroups,
        "another instance removed {}'s cgroups",
        sb.id
    );
    let info = a
        .client
        .wait_process(&sb.id, p.handle, Some(10))
        .await
        .expect("wait");
    assert_eq!(
        info.status, None,
        "another instance killed {}'s process: {info:?}",
        sb.id
    );
    assert_eq!(a.sh(&sb.id, "echo alive").await, "alive\n");
}

#[tokio::test]
async fn a_create_with_a_missing_template_is_refused_and_leaves_nothing() {
    // No warm pool: its boots (directories without a stub marker once
    // recorded) would race the check below.
    let d = Daemon::start_with(&["--pool", "host=0"]).await;
    let req = CreateRequest {
        template: Some(TemplateRef::Dir("/nonexistent-mayfly-template".into())),
        ..CreateRequest::default()
    };
    let e = d
        .client
        .create(&req)
        .await
        .expect_err("a missing template directory");
    match &e {
        mayfly_client::ClientError::Api { status, error } => {
            assert!((400..500).contains(status), "{status} {error:?}");
            assert_eq!(error.code, ErrorCode::InvalidArgument);
        }
        other => panic!("expected an API error, got {other:?}"),
    }
    assert!(d.client.list(true).await.expect("list").is_empty());
    // The daemon's idle stubs have directories made ahead of time (each
    // named by a marker in `stubs/`); anything else would be a leak.
    let stubs = d.state_dir.join("stubs");
    let left: Vec<_> = std::fs::read_dir(d.state_dir.join("sandboxes"))
        .map(|r| {
            r.flatten()
                .filter(|e| !stubs.join(e.file_name()).exists())
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "a refused create left {left:?}");
    assert!(host::mounts_mentioning(&[&d.state_dir.to_string_lossy()]).is_empty());
}

#[tokio::test]
async fn a_template_without_a_shell_fails_exec_cleanly_and_destroys_cleanly() {
    let d = Daemon::start().await;
    let rootfs = test_dir();
    std::fs::create_dir_all(rootfs.path().join("etc")).expect("mkdir etc");
    std::fs::write(rootfs.path().join("etc/hostname"), "empty\n").expect("a file");
    let req = CreateRequest {
        template: Some(TemplateRef::Dir(rootfs.path().to_owned())),
        ..CreateRequest::default()
    };
    let sb = d.create_with(&req).await;
    let e = d
        .client
        .exec(&sb.id, &cmd(&["sh", "-c", "true"]))
        .await
        .expect_err("no sh");
    assert_eq!(e.code(), Some(ErrorCode::ExecFailed), "{e:?}");
    d.client.destroy(&sb.id).await.expect("destroy");
    assert_no_leaks(&d.state_dir, &[sb.id.as_str()]);
    assert!(
        rootfs.path().join("etc/hostname").exists(),
        "destroy touched the template"
    );
}

/// A test that kills its daemon and fails before starting it again must
/// not leak either: the harness (`Daemon`'s drop) starts it once more on
/// the same state directory, whose recovery removes what the killed one
/// left (its sandboxes, its pool's, its stubs), before the directory goes.
#[tokio::test]
async fn a_killed_daemon_its_test_never_restarts_leaks_nothing() {
    let mut d = Daemon::start_with(&["--pool", "host=2"]).await;
    let sb = d.create().await;
    d.wait_pool("host", |p| p.ready == 2).await;
    // The live sandbox, the pool's two and the stubs made ahead.
    let ids = host::cgroup_ids_below(d.pid);
    assert!(ids.contains(sb.id.as_str()), "{ids:?}");
    assert!(ids.len() >= 3, "{ids:?}");
    let state = d.state_dir.clone();
    d.kill9();
    drop(d);
    let ids: Vec<String> = ids.into_iter().collect();
    assert_no_leaks(&state, &ids);
}

/// The cgroups of sandbox `id` in every hierarchy, made now (afresh) with
/// no limits written, as another instance would have made them.
fn foreign_cgroups(id: &str) -> Vec<std::path::PathBuf> {
    let dirs = cgroup_dirs(&id.parse().expect("id"));
    for d in &dirs {
        let _ = std::fs::remove_dir(d);
        std::fs::create_dir_all(d).expect("mkdir cgroup");
    }
    dirs
}

/// Where sandbox `id`'s cgroups are, in every hierarchy.
fn cgroup_dirs(id: &SandboxId) -> Vec<std::path::PathBuf> {
    let layout = mayfly_sys::cgroup::CgroupLayout::discover().expect("cgroup layout");
    mayfly_engine::plan::cgroup::plan(&layout, id, &mayfly_types::ResolvedLimits::DEFAULT)
        .expect("plan")
        .sandbox_dirs
}

fn age(dirs: &[std::path::PathBuf]) {
    for d in dirs {
        let ok = std::process::Command::new("touch")
            .args(["-d", "2 minutes ago"])
            .arg(d)
            .status()
            .expect("touch");
        assert!(ok.success());
    }
}

/// Removes the test's cgroups and its process, also when it fails.
struct Foreign {
    dirs: Vec<std::path::PathBuf>,
    sleeper: Option<std::process::Child>,
}

impl Drop for Foreign {
    fn drop(&mut self) {
        if let Some(s) = &mut self.sleeper {
            let _ = s.kill();
            let _ = s.wait();
        }
        for dir in &self.dirs {
            for _ in 0..100 {
                if !dir.exists() || std::fs::remove_dir(dir).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gone_instances_sandbox_cgroups_are_removed_and_nothing_in_use_is() {
    // Four sandboxes of other Mayfly instances, whose stores this daemon
    // never sees: only the orphan's instance is gone for good. Each is set
    // up in the order an instance makes it (lease, cgroups, process), since
    // other tests' daemons start meanwhile and sweep too.
    let mut f = Foreign {
        dirs: Vec::new(),
        sleeper: None,
    };
    // A live instance's uid lease naming its sandbox, taken first.
    let lease_path = std::path::Path::new("/run/mayfly/uid-slots/slot-16300");
    std::fs::create_dir_all(lease_path.parent().unwrap()).unwrap();
    let lease = mayfly_sys::process::try_lock_file(lease_path)
        .expect("lock")
        .expect("the test's lease slot is free");
    std::fs::write(lease_path, "mf-kept33333333").unwrap();
    let leased = foreign_cgroups("mf-kept33333333");
    f.dirs.extend(leased.clone());
    // A process of an instance too old to write leases.
    let busy = foreign_cgroups("mf-busy44444444");
    f.dirs.extend(busy.clone());
    let sleeper = f.sleeper.insert(
        std::process::Command::new("sleep")
            .arg("300")
            .spawn()
            .expect("sleep"),
    );
    for d in &busy {
        std::fs::write(d.join("cgroup.procs"), sleeper.id().to_string()).expect("join");
    }
    let young = foreign_cgroups("mf-yung55555555");
    f.dirs.extend(young.clone());
    let orphan = foreign_cgroups("mf-qrphan222222");
    f.dirs.extend(orphan.clone());
    age(&leased);
    age(&busy);
    age(&orphan);

    let d = Daemon::start().await;
    assert!(d.client.health().await.expect("health"));
    let exists = |dirs: &[std::path::PathBuf]| dirs.iter().all(|d| d.exists());
    assert!(
        orphan.iter().all(|d| !d.exists()),
        "the orphan's cgroups are left; daemon log:\n{}",
        d.log()
    );
    assert_eq!(
        (exists(&leased), exists(&busy), exists(&young)),
        (true, true, true),
        "(leased, busy, young) kept"
    );
    let sleeper = f.sleeper.as_mut().expect("sleeper");
    assert!(
        sleeper.try_wait().expect("wait").is_none(),
        "a process in a foreign cgroup was killed"
    );
    drop(lease);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_daemon_never_started_again_leaves_no_cgroups_once_another_starts() {
    let live = Daemon::start().await;
    let kept = live
        .client
        .create(&CreateRequest::default())
        .await
        .expect("create");
    let mut gone = Daemon::start().await;
    let dead = gone
        .client
        .create(&CreateRequest::default())
        .await
        .expect("create");
    let (kept_dirs, dead_dirs) = (cgroup_dirs(&kept.id), cgroup_dirs(&dead.id));
    assert!(kept_dirs.iter().chain(&dead_dirs).all(|d| d.exists()));
    gone.kill9();
    // Its sandboxes die with it (the parent-death chain), asynchronously.
    let empty = |dirs: &[std::path::PathBuf]| {
        dirs.iter().all(|d| {
            std::fs::read_to_string(d.join("cgroup.procs")).map_or(true, |p| p.trim().is_empty())
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !empty(&dead_dirs) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        empty(&dead_dirs),
        "the killed daemon's sandbox still has processes"
    );
    // Both look old now; the live one still has its processes and its
    // uid lease, the dead one neither.
    age(&kept_dirs);
    age(&dead_dirs);
    let next = Daemon::start().await;
    assert!(
        dead_dirs.iter().all(|d| !d.exists()),
        "the dead daemon's sandbox cgroups are left; log:\n{}",
        next.log()
    );
    assert!(
        kept_dirs.iter().all(|d| d.exists()),
        "a live sandbox's cgroups were removed"
    );
    let r = live
        .client
        .exec(&kept.id, &cmd(&["echo", "alive"]))
        .await
        .expect("exec in the live sandbox");
    assert_eq!(text(&r.stdout.0), "alive\n");
}
