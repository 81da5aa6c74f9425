//! Printing answers, and mapping failures to exit codes.

use std::io::Write;

use mayfly_types::{ErrorCode, ExecEvent, ExecResult, SandboxInfo};

/// Exit codes follow `docker run`: 125 for Mayfly's own failures, 126 when
/// the command could not be invoked, 127 when it was not found.
pub fn exit_code_for(e: &anyhow::Error) -> i32 {
    let code = if let Some(c) = e.downcast_ref::<mayfly_client::ClientError>() {
        c.code()
    } else {
        e.downcast_ref::<mayfly_engine::EngineError>()
            .map(|e| e.code())
    };
    match code {
        Some(ErrorCode::ExecFailed) => {
            let msg = e.to_string();
            if msg.contains("No such file") || msg.contains("os error 2") {
                127
            } else {
                126
            }
        }
        _ => 125,
    }
}

pub fn json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v)?;
    writeln!(out)?;
    Ok(())
}

pub fn sandbox_table(list: &[SandboxInfo]) {
    println!(
        "{:<16} {:<10} {:<24} {:>8} {:>10}",
        "ID", "STATE", "TEMPLATE", "PID", "CREATE_MS"
    );
    for s in list {
        println!(
            "{:<16} {:<10} {:<24} {:>8} {:>10}",
            s.id,
            s.state.as_str(),
            s.template.to_string(),
            s.init_pid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into()),
            s.create_ms
                .map(|m| format!("{m:.2}"))
                .unwrap_or_else(|| "-".into()),
        );
    }
}

/// Writes one streamed event to this process's stdout or stderr, raw.
pub fn write_event(ev: &ExecEvent) -> std::io::Result<()> {
    write_event_to(
        ev,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
}

/// Writes one streamed event to `out` or `err`, raw.
pub fn write_event_to(
    ev: &ExecEvent,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<()> {
    match ev {
        ExecEvent::Stdout(b) => {
            out.write_all(b)?;
            out.flush()
        }
        ExecEvent::Stderr(b) => {
            err.write_all(b)?;
            err.flush()
        }
        ExecEvent::Exit(_) => Ok(()),
    }
}

/// Reports a finished command (notes go to stderr) and returns its exit code.
pub fn finish(r: &ExecResult, json_mode: bool) -> anyhow::Result<i32> {
    finish_to(
        r,
        json_mode,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
}

/// [`finish`], writing to `out` and `err`.
pub fn finish_to(
    r: &ExecResult,
    json_mode: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<i32> {
    if json_mode {
        serde_json::to_writer_pretty(&mut *out, r)?;
        writeln!(out)?;
    } else {
        if r.status.timed_out {
            writeln!(err, "mayfly: command timed out and was killed")?;
        }
        if r.stdout_truncated || r.stderr_truncated {
            writeln!(err, "mayfly: output was truncated at the output limit")?;
        }
        if let Some(h) = &r.hook_error {
            writeln!(err, "mayfly: {h}")?;
        }
    }
    // A task run whose after_run hook failed does not count as a success.
    match (r.status.shell_code(), &r.hook_error) {
        (0, Some(_)) => Ok(1),
        (code, _) => Ok(code),
    }
}
