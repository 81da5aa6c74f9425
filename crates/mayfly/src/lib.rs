//! The `mayfly` package: two binaries over one set of command modules.
//!
//! - `mayfly`, the CLI ([`client_main`]): parses the command line and talks
//!   to the daemon through `mayfly-client`. It links no engine or server
//!   code and is linked position-dependent (`build.rs`), so its start costs
//!   about a millisecond more than `/bin/true`'s; a process start is a large
//!   part of what a `mayfly exec` or a `mayfly run` through a warm daemon
//!   costs the caller.
//!   What needs the engine (`serve`, a daemonless `run` that no parked
//!   sandbox takes, `park`, `prune`) it hands to `mayflyd` by `execve`,
//!   same pid and same arguments.
//! - `mayflyd` ([`daemon_main`]): the daemon, the one-shot engine and every
//!   CLI command too (`cargo run` runs it, so a fresh checkout needs no
//!   install step).
//!
//! Each subcommand is glue: parse arguments, call the engine (in process) or
//! the daemon (through `mayfly-client`), print the answer.

mod cli;
mod cmd_admin;
mod cmd_artifacts;
mod cmd_cp;
mod cmd_gateway;
mod cmd_park;
mod cmd_pool;
mod cmd_run;
mod cmd_sandbox;
mod cmd_serve;
mod cmd_stats;
mod cmd_template;
mod cmd_top;
mod dispatch;
mod handoff;
mod output;
mod parse;

use clap::Parser;

/// `mayfly`: the CLI. Exits the process.
pub fn client_main() -> ! {
    finish(dispatch::client(cli::Cli::parse()))
}

/// `mayflyd`: the daemon and the in-process engine (and every CLI command).
/// Exits the process.
pub fn daemon_main() -> ! {
    finish(dispatch::daemon(cli::Cli::parse()))
}

fn finish(result: anyhow::Result<i32>) -> ! {
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mayfly: {e:#}");
            output::exit_code_for(&e)
        }
    };
    std::process::exit(code)
}
