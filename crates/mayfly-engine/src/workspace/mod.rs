//! A git checkout made into a sandbox's `/workspace` at create.
//!
//! Git runs on the host as a subprocess (never through a shell), with
//! hooks, system and global configuration, and the `ext::` transport off
//! (see [`git::git`]). Every repository is fetched into a local bare mirror
//! (`<state>/git-cache/<sha256 of the repo>.git`) under a per-repository
//! `flock`; the checkout is a local clone of that mirror (hardlinked
//! objects, no network) made in a host temporary directory, which is then
//! streamed into the running sandbox as a tar through the file API's
//! upload, so it lands owned by the sandbox's root and never through a
//! path the sandbox controls. Alternates (`--shared`, `--reference`) would
//! be faster still but name a host path the sandbox cannot see, leaving a
//! repository that is broken inside it.

pub mod git;
mod size;
pub mod validate;

pub use git::{Checkout, GitCache, WorkspaceError};
pub use validate::{check_ref_name, check_repo, check_workspace, is_local_repo};
