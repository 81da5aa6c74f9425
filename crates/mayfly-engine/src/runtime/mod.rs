//! The sandbox runtime: the zygote, each sandbox's init, and the protocol
//! between them and the daemon.

pub mod apply;
pub mod channel;
pub mod conn;
mod exec_child;
pub mod init;
pub mod proto;
pub mod stub;
pub mod zygote;

/// A failure of the runtime machinery (not of a user's command).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("the zygote is gone")]
    ZygoteGone,
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    #[error("a peer sent a malformed message: {0}")]
    Protocol(String),
    #[error("the sandbox's init closed its control channel")]
    Closed,
    #[error("{op} failed")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Ipc(mayfly_sys::ipc::IpcError),
    #[error(transparent)]
    Process(mayfly_sys::process::ProcessError),
}

/// An error and all its sources, as one sentence.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

static FILTER: std::sync::OnceLock<Result<crate::plan::seccomp::Filter, String>> =
    std::sync::OnceLock::new();

/// The seccomp allowlist, as the build compiled it (see `build.rs`), made
/// once per process: a daemon's zygote makes it before it forks, so its
/// stubs and every init inherit it.
pub fn compiled_filter() -> Result<&'static crate::plan::seccomp::Filter, String> {
    FILTER
        .get_or_init(|| crate::plan::seccomp::default_filter().map_err(|e| chain(&e)))
        .as_ref()
        .map_err(Clone::clone)
}
