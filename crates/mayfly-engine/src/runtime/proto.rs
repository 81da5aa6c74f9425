//! Messages between the daemon, the zygote and each sandbox's init.
//!
//! Each message is one JSON document in one `SOCK_SEQPACKET` packet, so
//! framing is the kernel's job; descriptors ride along as `SCM_RIGHTS`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::plan::mounts::MountOp;
use crate::template::Layer;

/// Everything the zygote and the new init need to bring a sandbox up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpawnPlan {
    pub id: String,
    pub uid_base: u32,
    pub uid_count: u32,
    /// Overlays: the first is the root, the rest are mounted inside it.
    pub layers: Vec<Layer>,
    /// One (upper, work) pair per layer.
    pub uppers: Vec<(PathBuf, PathBuf)>,
    /// The sandbox's directory on the host; init enters it before it gives
    /// up host uid 0, so no ancestor needs to be searchable by others.
    pub workdir: PathBuf,
    /// The empty directory the root is attached to inside init's
    /// namespace, relative to `workdir`.
    pub rootfs: PathBuf,
    pub before_pivot: Vec<MountOp>,
    pub after_pivot: Vec<MountOp>,
    /// Applied to every command: (resource, soft, hard).
    pub rlimits: Vec<(i32, u64, u64)>,
    /// Environment every command starts from.
    pub env: Vec<(String, String)>,
}

/// Daemon → zygote.
#[derive(Debug, Serialize, Deserialize)]
pub enum ZygoteRequest {
    /// Fork a stub for the future sandbox `id` (its hostname). The stub
    /// moves itself into the cgroups whose `tasks` files are listed (v1).
    ForkStub { id: String, join: Vec<PathBuf> },
    /// Fork a detached reaper that finishes destroying a sandbox after the
    /// requester has gone (see `engine::reaper`). Carries four
    /// descriptors: the sandbox's init pidfd, its stub's pidfd, the read
    /// end of the pipe that hands the sandbox over, and its uid slot's
    /// lease.
    Reap { plan: Box<ReapPlan> },
}

/// What a one-shot engine's stub does itself, before it joins its
/// cgroups and makes its namespaces: everything a daemonless run's create
/// would otherwise wait for, started as soon as the process does (see
/// `engine::early`). Handed down by fork, never sent.
#[derive(Debug, Clone)]
pub struct EarlyWork {
    pub id: String,
    /// The v1 `tasks` files to join; empty on v2, where the engine moves
    /// the stub.
    pub join: Vec<PathBuf>,
    /// The stub's marker, and the owner it names.
    pub marker: PathBuf,
    pub marker_text: String,
    pub cgroup: mayfly_sys::cgroup::CgroupPlan,
    /// `<state>/sandboxes/<id>`, made with the `host` template's layers
    /// (or with the plan's).
    pub dir: PathBuf,
    /// The whole sandbox, planned before the process forked anything: the
    /// stub then clones init as soon as its namespaces are made, without
    /// waiting for the engine. The engine checks that the plan it makes
    /// itself is this one.
    pub plan: Option<SpawnPlan>,
    /// The uid slot's lease (inherited by fork), which the stub holds for
    /// its life.
    pub lease_fd: Option<i32>,
    /// Where to claim ready-made network, UTS and IPC namespaces from.
    pub spare_ns: Option<PathBuf>,
}

/// What a reaper removes and records. Built by the engine from a live
/// sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReapPlan {
    pub id: mayfly_types::SandboxId,
    /// The sandbox's directory, moved into `trash` before it is deleted.
    pub dir: PathBuf,
    pub trash: PathBuf,
    pub cgroup: mayfly_sys::cgroup::CgroupPlan,
    /// For removing the shared `mayfly` cgroup parents once empty.
    pub layout: mayfly_sys::cgroup::CgroupLayout,
    /// Where the store is, to record the sandbox destroyed.
    pub state_dir: PathBuf,
    /// Where to leave a fresh set of spare namespaces for the next run.
    pub spare_ns: Option<PathBuf>,
    /// How to start the next keeper (see `crate::park`).
    pub park: Option<crate::park::ParkPlan>,
    /// The engine's `history`: the reaper prunes one batch of ended
    /// sandboxes older than this (see `engine::history`).
    pub history: Option<std::time::Duration>,
}

/// Zygote → daemon. `Forked` carries two descriptors: the stub's pidfd and
/// the daemon's end of the stub's socket.
#[derive(Debug, Serialize, Deserialize)]
pub enum ZygoteReply {
    Forked {
        pid: i32,
    },
    /// A reaper is on its way; no descriptors.
    Detached {
        pid: i32,
    },
    Failed {
        message: String,
    },
}

/// Stub → daemon, in answer to a [`SpawnPlan`]. `Spawned` carries two
/// descriptors: init's pidfd and the daemon's end of init's control socket.
#[derive(Debug, Serialize, Deserialize)]
pub enum StubReply {
    /// The stub has made the sandbox's network, UTS and IPC namespaces.
    Prepared,
    Spawned {
        pid: i32,
    },
    Failed {
        message: String,
    },
}

/// Daemon → init.
#[derive(Debug, Serialize, Deserialize)]
pub enum InitRequest {
    /// Start a command; carries stdin, stdout and stderr descriptors.
    Spawn(Box<SpawnCommand>),
    /// Signal a command, or its whole session with `tree`.
    Signal {
        handle: u64,
        signal: i32,
        tree: bool,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpawnCommand {
    pub handle: u64,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
}

/// Init → daemon.
#[derive(Debug, Serialize, Deserialize)]
pub enum InitEvent {
    Ready,
    SetupFailed {
        message: String,
    },
    Spawned {
        handle: u64,
        pid: i32,
    },
    SpawnFailed {
        handle: u64,
        errno: i32,
        stage: String,
    },
    Exited {
        handle: u64,
        code: Option<i32>,
        signal: Option<i32>,
    },
}
