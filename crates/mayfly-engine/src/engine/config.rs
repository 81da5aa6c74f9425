//! The engine's configuration, with embedded defaults.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mayfly_sys::cgroup::CgroupLayout;
use mayfly_types::ResolvedLimits;

use crate::EngineError;

/// Host uids from here up are Mayfly's: slot `n` owns `[start + n·65536,
/// start + (n+1)·65536)`. 2^30 is far above any distribution's subuid ranges.
pub const UID_RANGE_START: u32 = 1 << 30;
/// Ids per sandbox: a full 16-bit range, as container images expect.
pub const UIDS_PER_SANDBOX: u32 = 65536;
/// Slots that fit below 2^32 - 1 (the invalid uid).
pub const MAX_SLOTS: u32 = ((u32::MAX - UID_RANGE_START) / UIDS_PER_SANDBOX) - 1;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Store, sandbox directories and templates live here.
    pub state_dir: PathBuf,
    /// Where the `host` template's system directories come from.
    pub host_root: PathBuf,
    pub default_limits: ResolvedLimits,
    pub default_ttl: Duration,
    pub max_ttl: Duration,
    /// Idle timeout of a sandbox whose create names none (zero: none).
    pub default_idle: Duration,
    /// The most sandboxes alive at once (also bounded by the uid slots).
    pub max_sandboxes: u32,
    /// `None` discovers the layout from `/proc/self/mountinfo`.
    pub cgroup_layout: Option<CgroupLayout>,
    /// How long init may take to report ready.
    pub setup_timeout: Duration,
    /// Stubs kept forked and placed in fresh cgroups ahead of creates (0 for
    /// a one-shot `mayfly run`, which has nothing to prepare ahead for).
    pub stub_pool: usize,
    /// Host-wide uid slot leases, shared by every Mayfly instance on the
    /// host whatever its state directory (see `engine::leases`).
    pub slot_lease_dir: PathBuf,
    /// Where a one-shot engine takes its sandbox's network, UTS and IPC
    /// namespaces ready-made, and where its reaper leaves a fresh set for
    /// the next run (see `mayfly_sys::spare_ns`). None: never.
    pub spare_ns_dir: Option<PathBuf>,
    /// Whether a one-shot engine's reaper starts a keeper that parks a
    /// sandbox for the next run, and how (see `crate::park`). None: never.
    pub park: Option<crate::park::ParkPlan>,
    /// Warm pools set up at start, by name (changeable through the API).
    pub pools: Vec<(String, mayfly_types::PoolSpec)>,
    /// A directory for the sandboxes' writable layers, mount points and
    /// trash instead of the state directory, e.g. on a tmpfs (see
    /// `Engine::new`). None: in the state directory.
    pub scratch_dir: Option<PathBuf>,
    /// The egress policy of a create that names none, per template.
    pub template_egress: Vec<(mayfly_types::TemplateRef, mayfly_types::EgressPolicy)>,
    /// How long and how much collected artifacts are kept.
    pub artifact_retention: crate::artifacts::Retention,
    /// Size caps of one sandbox's artifact collection.
    pub artifact_caps: crate::artifacts::Caps,
    /// How long an ended sandbox's record, transitions, exec audit and
    /// events are kept (see `engine::history`). None: forever.
    pub history: Option<Duration>,
    /// URL prefixes (each ending in `/`) a tenant's workspace repository
    /// must start with. Empty: any http(s):// or git:// URL. An admin is
    /// never limited by it.
    pub tenant_repos: Vec<String>,
    /// The most commands one sandbox may run through the API. Each is a
    /// row of the audit trail, so this bounds a live sandbox's audit; a
    /// command past it is refused, not run unaudited.
    pub max_commands: u64,
    /// Bytes of file reads and tar downloads the daemon holds in memory at
    /// once, over all sandboxes (see `engine::buffers`); past it such a
    /// request answers 503.
    pub file_buffer_bytes: u64,
}

/// [`EngineConfig::max_commands`] by default.
pub const DEFAULT_MAX_COMMANDS: u64 = 100_000;

/// The history kept by default: 30 days.
const DEFAULT_HISTORY: Duration = Duration::from_secs(30 * 24 * 3600);

/// The host-wide directory of spare namespaces for daemonless runs.
pub const DEFAULT_SPARE_NS_DIR: &str = "/run/mayfly/spare-ns";

/// How many spares reapers keep ready, host-wide.
pub const SPARE_NS_TARGET: usize = 2;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            state_dir: PathBuf::from("/var/lib/mayfly"),
            host_root: PathBuf::from("/"),
            default_limits: ResolvedLimits::DEFAULT,
            default_ttl: Duration::from_secs(600),
            max_ttl: Duration::from_secs(24 * 3600),
            default_idle: Duration::ZERO,
            max_sandboxes: 4096,
            cgroup_layout: None,
            setup_timeout: Duration::from_secs(10),
            stub_pool: 4,
            slot_lease_dir: PathBuf::from(super::leases::DEFAULT_LEASE_DIR),
            spare_ns_dir: None,
            park: None,
            pools: Vec::new(),
            scratch_dir: None,
            template_egress: Vec::new(),
            artifact_retention: Default::default(),
            artifact_caps: Default::default(),
            history: Some(DEFAULT_HISTORY),
            tenant_repos: Vec::new(),
            max_commands: DEFAULT_MAX_COMMANDS,
            file_buffer_bytes: super::buffers::DEFAULT_FILE_BUFFER_BYTES,
        }
    }
}

impl EngineConfig {
    /// Where the sandboxes' writable layers, mount points and trash live:
    /// the scratch directory if one is set, else the state directory.
    pub fn scratch_root(&self) -> &std::path::Path {
        self.scratch_dir.as_deref().unwrap_or(&self.state_dir)
    }

    pub fn sandboxes_dir(&self) -> PathBuf {
        self.scratch_root().join("sandboxes")
    }

    pub fn templates_dir(&self) -> PathBuf {
        self.state_dir.join("templates")
    }

    /// Built templates' records.
    pub fn registry_dir(&self) -> PathBuf {
        self.state_dir.join("templates").join("built")
    }

    /// The content-addressed layer store (image layers and build steps).
    pub fn layers_dir(&self) -> PathBuf {
        self.state_dir.join("layers")
    }

    /// One file per stub made by this state directory's owners, naming the
    /// owner, so recovery removes exactly the stubs of dead owners and never
    /// those of another live daemon or `mayfly run`. With the sandboxes'
    /// directories, which a stub makes ahead: every stub creates and removes
    /// its marker, and on a filesystem where a file create is costly (ext4
    /// without a journal) a scratch tmpfs spares it that too.
    pub fn stubs_dir(&self) -> PathBuf {
        self.scratch_root().join("stubs")
    }

    /// `<state>/artifacts`: collected artifacts, one directory per sandbox.
    pub fn artifacts_dir(&self) -> PathBuf {
        self.state_dir.join("artifacts")
    }

    /// `<state>/git-cache`: bare mirrors of workspace repositories, and
    /// (in `tmp/`) checkouts on their way into a sandbox.
    pub fn git_cache_dir(&self) -> PathBuf {
        self.state_dir.join("git-cache")
    }

    pub fn trash_dir(&self) -> PathBuf {
        self.scratch_root().join("trash")
    }

    pub fn uid_base(slot: u32) -> u32 {
        UID_RANGE_START + slot * UIDS_PER_SANDBOX
    }

    pub fn slots(&self) -> u32 {
        self.max_sandboxes.min(MAX_SLOTS)
    }
}

/// Prepares a scratch directory: made (0711) if missing, and refused
/// unless it is a real directory (not a symlink) owned by the state
/// directory's owner and writable by nobody else. It may sit in a
/// world-writable place such as `/dev/shm`, where another user could have
/// made it first to watch or steer what sandboxes write.
pub(crate) fn check_scratch(dir: &Path, state_dir: &Path) -> Result<(), EngineError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let bad = |why: String| {
        EngineError::Invalid(format!("the scratch directory {}: {why}", dir.display()))
    };
    if !dir.is_absolute() {
        return Err(bad("must be an absolute path".into()));
    }
    std::fs::create_dir_all(state_dir)
        .map_err(|e| EngineError::Internal(format!("preparing {}: {e}", state_dir.display())))?;
    match std::fs::DirBuilder::new().mode(0o711).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(bad(format!("cannot be made: {e}"))),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| bad(e.to_string()))?;
    let owner = std::fs::metadata(state_dir)
        .map_err(|e| EngineError::Internal(format!("reading {}: {e}", state_dir.display())))?
        .uid();
    if !meta.file_type().is_dir() {
        return Err(bad("is not a directory (a symlink is refused)".into()));
    }
    if meta.uid() != owner || meta.mode() & 0o022 != 0 {
        return Err(bad(format!(
            "must be owned by uid {owner} and writable by it alone (it is uid {}, mode {:o})",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_ranges_of_slots_are_disjoint_and_fit_below_the_invalid_uid() {
        assert_eq!(EngineConfig::uid_base(0), 1 << 30);
        assert_eq!(
            EngineConfig::uid_base(1) - EngineConfig::uid_base(0),
            UIDS_PER_SANDBOX
        );
        let last = EngineConfig::uid_base(MAX_SLOTS - 1) as u64 + UIDS_PER_SANDBOX as u64 - 1;
        assert!(
            last < u32::MAX as u64,
            "the last id {last} must stay below 2^32-1"
        );
        // Root inside maps to the first id of the range, never to host root.
        assert!(EngineConfig::uid_base(0) > 65535);
    }

    #[test]
    fn slots_are_capped_by_the_uid_space() {
        let cfg = EngineConfig {
            max_sandboxes: u32::MAX,
            ..EngineConfig::default()
        };
        assert_eq!(cfg.slots(), MAX_SLOTS);
        assert_eq!(EngineConfig::default().slots(), 4096);
    }
}
