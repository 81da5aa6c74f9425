//! Sandbox commands that go through the daemon: create, exec, ps, rm,
//! inspect, events, audit.

use anyhow::Context;
use mayfly_types::{ExecEvent, SandboxId};

use crate::cli::{Cli, CreateArgs, EventsArgs, ExecArgs, IdArgs, PsArgs, RmArgs};
use crate::output;

pub fn parse_id(s: &str) -> anyhow::Result<SandboxId> {
    Ok(s.parse::<SandboxId>()?)
}

pub(crate) fn client(cli: &Cli) -> anyhow::Result<mayfly_client::Client> {
    if !cli.daemon_reachable() {
        anyhow::bail!(
            "no Mayfly daemon answers at {}; start one with `mayfly serve` (or use `mayfly run`, which works without one)",
            cli.socket.display()
        );
    }
    cli.client()
}

pub async fn create(cli: &Cli, a: &CreateArgs) -> anyhow::Result<i32> {
    let info = client(cli)?.create(&a.spec.request()?).await?;
    if cli.json {
        output::json(&info)?;
    } else {
        println!("{}", info.id);
    }
    Ok(0)
}

pub async fn exec(cli: &Cli, a: &ExecArgs) -> anyhow::Result<i32> {
    let id = parse_id(&a.id)?;
    let mut req = crate::cmd_run::exec_request(&a.cmd, &a.env)?;
    req.run = a.run;
    let c = client(cli)?;
    if cli.json {
        let r = c.exec(&id, &req).await?;
        return output::finish(&r, true);
    }
    let mut stream = c.exec_stream(&id, &req).await?;
    while let Some(ev) = stream.next_event().await? {
        if let ExecEvent::Exit(r) = &ev {
            return output::finish(r, false);
        }
        output::write_event(&ev)?;
    }
    anyhow::bail!("the daemon ended the stream without an exit status")
}

pub async fn ps(cli: &Cli, a: &PsArgs) -> anyhow::Result<i32> {
    let list = client(cli)?.list_recent(a.all, a.limit).await?;
    if cli.json {
        output::json(&list)?;
    } else if a.quiet {
        for sb in &list {
            println!("{}", sb.id);
        }
    } else {
        output::sandbox_table(&list);
    }
    Ok(0)
}

pub async fn rm(cli: &Cli, a: &RmArgs) -> anyhow::Result<i32> {
    let c = client(cli)?;
    let mut out = Vec::new();
    let mut failed = false;
    for raw in &a.ids {
        let result = async {
            c.destroy(&parse_id(raw)?)
                .await
                .map_err(anyhow::Error::from)
        }
        .await;
        match result {
            Ok(info) => {
                if !cli.json {
                    println!("{}", info.id);
                }
                out.push(info);
            }
            Err(e) => {
                eprintln!("mayfly: rm {raw}: {e:#}");
                failed = true;
            }
        }
    }
    if cli.json {
        output::json(&out)?;
    }
    Ok(if failed { 1 } else { 0 })
}

pub async fn inspect(cli: &Cli, a: &IdArgs) -> anyhow::Result<i32> {
    let info = client(cli)?.get(&parse_id(&a.id)?).await?;
    output::json(&info)?;
    Ok(0)
}

/// `mayfly egress ID`: the live policy; with flags, replaces it.
pub async fn egress(cli: &Cli, a: &crate::cli::EgressCmdArgs) -> anyhow::Result<i32> {
    let id = parse_id(&a.id)?;
    let c = client(cli)?;
    let policy = match a.egress.policy()? {
        Some(p) => c.set_egress(&id, &p).await?,
        None => c.egress(&id).await?,
    };
    output::json(&policy)?;
    Ok(0)
}

pub async fn events(cli: &Cli, a: &EventsArgs) -> anyhow::Result<i32> {
    if a.follow {
        let mut stream = client(cli)?.event_stream(a.since).await?;
        while let Some(e) = stream.next_event().await? {
            print_event(cli, &e)?;
        }
        return Ok(0);
    }
    let evs = client(cli)?.events(a.since.unwrap_or(0), a.limit).await?;
    if cli.json {
        output::json(&evs)?;
    } else {
        for e in &evs {
            print_event(cli, e)?;
        }
    }
    Ok(0)
}

/// One event on a line: `seq sandbox kind detail`, or (following, with
/// --json) one JSON document per line.
fn print_event(cli: &Cli, e: &mayfly_types::Event) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if cli.json {
        serde_json::to_writer(&mut out, e)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "{} {} {} {}",
            e.seq,
            e.sandbox_id.as_deref().unwrap_or("-"),
            e.kind,
            e.detail
        )?;
    }
    out.flush()?;
    Ok(())
}

pub async fn audit(cli: &Cli, a: &IdArgs) -> anyhow::Result<i32> {
    let trail = client(cli)?
        .audit(&parse_id(&a.id)?)
        .await
        .context("reading the audit trail")?;
    if cli.json {
        output::json(&trail)?;
    } else {
        for x in trail {
            println!(
                "{} exit={:?} signal={:?} timed_out={} {}us out={}B err={}B by={} argv={:?}",
                x.at,
                x.exit_code,
                x.signal,
                x.timed_out,
                x.duration_us,
                x.stdout_bytes,
                x.stderr_bytes,
                x.caller,
                x.argv
            );
        }
    }
    Ok(0)
}
