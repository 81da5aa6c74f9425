//! Messages between a run and a keeper: one JSON document per
//! `SOCK_SEQPACKET` packet, as between the engine and init.

use mayfly_types::{Bytes64, CreateRequest, ExecRequest, SandboxId};
use serde::{Deserialize, Serialize};

use super::ExeId;

/// Run → keeper.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToKeeper {
    /// Serve this run. Carries two descriptors: the run's stdout and
    /// stderr.
    Claim(Box<ClaimMsg>),
    /// A piece of the run's stdin (`--interactive`), after `Accepted` and
    /// before `Go`; the run read it to its end before it claimed, as a cold
    /// run reads it before it creates.
    Stdin(Bytes64),
    /// The run has committed: start the command.
    Go,
    /// Destroy the parked sandbox and exit (`mayfly prune`). The keeper
    /// closes the connection once its sandbox is gone.
    Retire,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ClaimMsg {
    pub version: u32,
    pub exe: ExeId,
    pub create: CreateRequest,
    /// Without stdin: with `interactive`, it follows in `Stdin` messages.
    pub exec: ExecRequest,
    pub interactive: bool,
    /// Print the result as JSON (`--json`).
    pub json: bool,
}

/// Keeper → run.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToRun {
    Accepted {
        id: SandboxId,
    },
    Refused {
        reason: String,
    },
    /// The command's output has been written and the run's streams
    /// closed; exit with `code`.
    Done {
        code: i32,
    },
}

pub(super) fn encode<T: Serialize>(m: &T) -> Vec<u8> {
    serde_json::to_vec(m).unwrap_or_default()
}

pub(super) fn decode<'a, T: Deserialize<'a>>(b: &'a [u8]) -> Result<T, super::ParkError> {
    serde_json::from_slice(b).map_err(|e| super::ParkError::Protocol(e.to_string()))
}
