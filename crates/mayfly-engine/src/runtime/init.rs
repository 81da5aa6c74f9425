//! Mayfly's init: pid 1 of every sandbox.
//!
//! It finishes the sandbox's setup from inside its namespaces (mounts, pivot,
//! hostname, loopback), then serves the daemon over one control socket: it
//! spawns every command, reaps every zombie, reports exits, and forwards the
//! signals it receives. It is single-threaded and never execs, so the
//! daemon's control socket is the only descriptor it keeps.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use mayfly_sys::{ipc, mount, process, supervise};

use super::apply::apply_mount_op;
use super::exec_child::{exec_command, ExecSetup};
use super::proto::{InitEvent, InitRequest, SpawnCommand, SpawnPlan};

/// Runs in the cloned child. Never returns.
pub fn run(plan: &SpawnPlan, ctl: OwnedFd, setup: OwnedFd) -> ! {
    match setup_sandbox(plan, &setup) {
        Ok(()) => {
            drop(setup);
            process::close_fds_except(3, &[ctl.as_raw_fd()]);
            send(&ctl, &InitEvent::Ready);
            // The seccomp allowlist goes on init itself: every command
            // inherits it through fork and execve, so no exec pays for
            // loading a 1,500-instruction filter, and init (which the
            // sandbox's processes could otherwise try to subvert) is bound
            // by it too. It is installed after `Ready` is sent, to keep its
            // cost off the create's critical path, but before the first
            // request is read: no command can ever start unfiltered. If it
            // cannot be installed, init exits, and the sandbox dies with it
            // (fail closed).
            if install_filter().is_err() {
                process::exit_now(1);
            }
            // Every command's bounding set, dropped once here and inherited
            // by each fork, rather than in each command before its exec;
            // init's own capabilities are unchanged. Fail closed as above.
            let keep = crate::plan::hardening::default_capabilities();
            if mayfly_sys::hardening::drop_bounding_set(&keep).is_err() {
                process::exit_now(1);
            }
            // What every command's capability sets become, read once.
            let Ok(caps) = mayfly_sys::hardening::command_cap_masks(&keep) else {
                process::exit_now(1);
            };
            serve(plan, ctl, caps)
        }
        Err(message) => {
            send(&ctl, &InitEvent::SetupFailed { message });
            process::exit_now(1)
        }
    }
}

fn install_filter() -> Result<(), String> {
    let filter = super::compiled_filter()?;
    mayfly_sys::hardening::install_seccomp(filter).map_err(|e| super::chain(&e))
}

fn setup_sandbox(plan: &SpawnPlan, setup: &OwnedFd) -> Result<(), String> {
    // If the zygote (and so the daemon) dies, so does the sandbox. (getppid
    // is 0 here, the parent being outside this pid namespace; a zygote that
    // died before this point is noticed by the receive below failing.)
    process::set_parent_death_signal(libc::SIGKILL).map_err(|e| super::chain(&e))?;
    // pid 1's command line is readable by everyone inside: show nothing of
    // the daemon's arguments or environment.
    process::set_title("mayfly-init");
    // The zygote sends the layer mounts once the id maps are written and
    // this process is in its cgroup; until then nothing here is mapped.
    let mut buf = Vec::new();
    let layers = ipc::recv(setup.as_fd(), &mut buf, false).map_err(|e| super::chain(&e))?;
    if layers.len() != plan.layers.len() {
        return Err(format!(
            "expected {} layer mounts, got {}",
            plan.layers.len(),
            layers.len()
        ));
    }
    // Enter the sandbox's directory while still host uid 0 (the owner of
    // every directory above it); from here on all paths are relative.
    mount::chdir(&plan.workdir).map_err(|e| super::chain(&e))?;
    process::become_root_in_userns().map_err(|e| super::chain(&e))?;
    process::unshare_cgroup_ns().map_err(|e| super::chain(&e))?;
    mount::make_rprivate().map_err(|e| super::chain(&e))?;
    for (layer, fd) in plan.layers.iter().zip(&layers) {
        let target = plan.rootfs.join(&layer.target);
        mount::move_mount(fd.as_fd(), &target).map_err(|e| super::chain(&e))?;
    }
    drop(layers);
    for op in &plan.before_pivot {
        apply_mount_op(op).map_err(|e| super::chain(&e))?;
    }
    mount::pivot_into(&plan.rootfs).map_err(|e| super::chain(&e))?;
    for op in &plan.after_pivot {
        apply_mount_op(op).map_err(|e| super::chain(&e))?;
    }
    // Same-uid processes in the sandbox must not ptrace init or read its fds.
    process::set_dumpable(false).map_err(|e| super::chain(&e))?;
    Ok(())
}

fn send(ctl: &OwnedFd, ev: &InitEvent) {
    if let Ok(data) = serde_json::to_vec(ev) {
        // A failed send means the daemon is gone; the recv loop notices.
        let _ = ipc::send(ctl.as_fd(), &data, &[]);
    }
}

struct Running {
    handle: u64,
}

fn serve(plan: &SpawnPlan, ctl: OwnedFd, caps: mayfly_sys::spawn::CapMasks) -> ! {
    process::reset_signals();
    let sfd = match supervise::signal_fd() {
        Ok(s) => s,
        Err(_) => process::exit_now(2),
    };
    let Ok(mut setup) = ExecSetup::new(plan, caps) else {
        process::exit_now(2)
    };
    let mut running: HashMap<i32, Running> = HashMap::new();
    let mut buf = Vec::new();
    loop {
        let ready = match supervise::poll_readable(&[ctl.as_fd(), sfd.as_fd()]) {
            Ok(r) => r,
            Err(_) => process::exit_now(3),
        };
        if ready[1] {
            for sig in supervise::read_signals(&sfd) {
                if sig == libc::SIGCHLD {
                    reap(&ctl, &mut running);
                } else {
                    // Forward to every command's session.
                    for pid in running.keys() {
                        let _ = process::kill(-pid, sig);
                    }
                }
            }
        }
        if ready[0] {
            let fds = match ipc::recv(ctl.as_fd(), &mut buf, true) {
                Ok(fds) => fds,
                Err(e) if e.would_block() => continue,
                // The daemon is gone: exiting as pid 1 tears the sandbox down.
                Err(_) => process::exit_now(0),
            };
            match serde_json::from_slice::<InitRequest>(&buf) {
                Ok(InitRequest::Spawn(cmd)) => spawn(&ctl, &mut setup, &cmd, fds, &mut running),
                Ok(InitRequest::Signal {
                    handle,
                    signal,
                    tree,
                }) => {
                    if let Some((&pid, _)) = running.iter().find(|(_, r)| r.handle == handle) {
                        if tree {
                            kill_session(pid, signal);
                        } else {
                            let _ = process::kill(pid, signal);
                        }
                    }
                }
                Err(_) => {}
            }
        }
    }
}

fn spawn(
    ctl: &OwnedFd,
    setup: &mut ExecSetup,
    cmd: &SpawnCommand,
    fds: Vec<OwnedFd>,
    running: &mut HashMap<i32, Running>,
) {
    let result = if fds.len() == 3 {
        exec_command(setup, cmd, &fds)
    } else {
        Err((libc::EINVAL, "descriptors".to_owned()))
    };
    drop(fds);
    match result {
        Ok(pid) => {
            running.insert(pid, Running { handle: cmd.handle });
            send(
                ctl,
                &InitEvent::Spawned {
                    handle: cmd.handle,
                    pid,
                },
            );
        }
        Err((errno, stage)) => send(
            ctl,
            &InitEvent::SpawnFailed {
                handle: cmd.handle,
                errno,
                stage,
            },
        ),
    }
}

fn reap(ctl: &OwnedFd, running: &mut HashMap<i32, Running>) {
    for r in supervise::reap_all() {
        let (pid, code, signal) = match r {
            supervise::Reaped::Exited { pid, code } => (pid, Some(code), None),
            supervise::Reaped::Signaled { pid, signal } => (pid, None, Some(signal)),
        };
        // Orphans reparented to init are reaped here too; only commands the
        // daemon started are reported.
        if let Some(run) = running.remove(&pid) {
            // A command's lifetime bounds its session: background children
            // it left behind are killed with it.
            kill_session(pid, libc::SIGKILL);
            send(
                ctl,
                &InitEvent::Exited {
                    handle: run.handle,
                    code,
                    signal,
                },
            );
        }
    }
}

/// Signals every process of the session led by `sid` (it may have exited).
fn kill_session(sid: i32, signal: i32) {
    let _ = process::kill(-sid, signal);
    for pid in supervise::pids_in_session("/proc", sid) {
        let _ = process::kill(pid, signal);
    }
}

/// Resolves a command name against `PATH` the way `execvp` does, inside the
/// sandbox (init has already pivoted, so this sees the sandbox's files).
pub fn resolve_program(argv0: &str, path_var: &str) -> Vec<CString> {
    if argv0.contains('/') {
        return CString::new(argv0).into_iter().collect();
    }
    path_var
        .split(':')
        .filter(|d| !d.is_empty())
        .filter_map(|d| CString::new(format!("{}/{}", d.trim_end_matches('/'), argv0)).ok())
        .filter(|p| Path::new(p.to_str().unwrap_or("")).exists())
        .collect()
}
