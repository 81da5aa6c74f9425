//! Artifacts: what a sandbox leaves behind, collected before teardown into
//! a store outside it, `<state>/artifacts/<sandbox-id>/`.
//!
//! * [`store`]: the on-disk layout. Every artifact is written to a
//!   temporary name, fsynced and renamed; the per-sandbox manifest is
//!   written last the same way, so a sandbox directory without a manifest
//!   is an interrupted collection and nothing in it claims to be complete.
//!   The startup sweep removes temporary leftovers and such directories.
//! * [`collect`]: reads the declared paths through the sandbox's
//!   [`SandboxFs`](crate::files::SandboxFs) (openat2-confined, a final
//!   symlink is never followed), files as they are and directories as a
//!   tar, under a per-artifact and a per-sandbox cap.
//! * [`retention`]: which sandboxes' artifacts go, as a pure plan.

pub mod collect;
pub mod retention;
pub mod store;

pub use collect::{check_artifact_paths, Caps, MAX_ARTIFACTS};
pub use retention::{plan_retention, Retention, StoredSet};
pub use store::{ArtifactError, ArtifactStore};
