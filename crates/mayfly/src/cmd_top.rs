//! `mayfly top`: live sandboxes and what they use (CPU, memory, pids, OOM
//! kills, disk), once or refreshing with `--watch`.

use std::collections::HashMap;
use std::io::Write as _;
use std::time::Instant;

use mayfly_types::{SandboxId, SandboxInfo, SandboxUsage};

use crate::cli::{Cli, TopArgs};
use crate::cmd_sandbox::client;

/// One row: a sandbox and its usage.
#[derive(serde::Serialize)]
struct Row {
    #[serde(flatten)]
    usage: SandboxUsage,
    tenant: Option<String>,
    template: String,
    state: &'static str,
}

pub async fn top(cli: &Cli, a: &TopArgs) -> anyhow::Result<i32> {
    let c = client(cli)?;
    // CPU seconds at the previous refresh, for the CPU% column.
    let mut before: HashMap<SandboxId, (f64, Instant)> = HashMap::new();
    loop {
        let rows = sample(&c).await?;
        let mut out = std::io::stdout().lock();
        if cli.json {
            if a.watch {
                // One document per refresh, one per line.
                serde_json::to_writer(&mut out, &rows)?;
                writeln!(out)?;
            } else {
                serde_json::to_writer_pretty(&mut out, &rows)?;
                writeln!(out)?;
            }
        } else {
            if a.watch {
                // Home the cursor and clear the screen.
                write!(out, "\x1b[H\x1b[2J")?;
            }
            write_table(&mut out, &rows, &before)?;
        }
        out.flush()?;
        if !a.watch {
            return Ok(0);
        }
        before = rows
            .iter()
            .filter_map(|r| Some((r.usage.id.clone(), (r.usage.cpu_seconds?, Instant::now()))))
            .collect();
        tokio::select! {
            _ = tokio::time::sleep(a.interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(0),
        }
    }
}

/// Every live sandbox's usage; one that ends meanwhile is left out.
async fn sample(c: &mayfly_client::Client) -> anyhow::Result<Vec<Row>> {
    let list: Vec<SandboxInfo> = c.list(false).await?;
    let mut rows = Vec::with_capacity(list.len());
    for sb in list {
        match c.usage(&sb.id).await {
            Ok(usage) => rows.push(Row {
                usage,
                tenant: sb.tenant,
                template: sb.template.to_string(),
                state: sb.state.as_str(),
            }),
            // Gone, or no longer running, since the list.
            Err(e) if e.is_not_found() || e.code() == Some(mayfly_types::ErrorCode::Conflict) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(rows)
}

fn write_table(
    out: &mut dyn std::io::Write,
    rows: &[Row],
    before: &HashMap<SandboxId, (f64, Instant)>,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<16} {:<10} {:<12} {:>9} {:>6} {:>9} {:>9} {:>9} {:>5} {:>4} {:>10}",
        "ID", "STATE", "TENANT", "CPU_S", "CPU%", "MEM", "PEAK", "LIMIT", "PIDS", "OOM", "DISK"
    )?;
    for r in rows {
        let u = &r.usage;
        let cpu_pct = match (u.cpu_seconds, before.get(&u.id)) {
            (Some(now), Some((then, at))) => {
                let dt = at.elapsed().as_secs_f64();
                (dt > 0.0).then(|| format!("{:.0}", (now - then) / dt * 100.0))
            }
            _ => None,
        };
        let disk = format!(
            "{}{}",
            size(u.disk.bytes),
            if u.disk.truncated { "+" } else { "" }
        );
        writeln!(
            out,
            "{:<16} {:<10} {:<12} {:>9} {:>6} {:>9} {:>9} {:>9} {:>5} {:>4} {:>10}",
            u.id,
            r.state,
            r.tenant.as_deref().unwrap_or("-"),
            u.cpu_seconds
                .map(|s| format!("{s:.2}"))
                .unwrap_or_else(|| "-".into()),
            cpu_pct.unwrap_or_else(|| "-".into()),
            size(u.memory_bytes),
            u.memory_peak_bytes.map(size).unwrap_or_else(|| "-".into()),
            size(u.memory_limit_bytes),
            u.pids,
            u.oom_kills
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into()),
            disk,
        )?;
    }
    Ok(())
}

/// Bytes in binary units: `512B`, `4.0K`, `12.5M`, `2.0G`.
pub fn size(b: u64) -> String {
    const UNITS: [&str; 4] = ["K", "M", "G", "T"];
    if b < 1024 {
        return format!("{b}B");
    }
    let mut v = b as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1}{}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::size;

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(size(0), "0B");
        assert_eq!(size(1023), "1023B");
        assert_eq!(size(4096), "4.0K");
        assert_eq!(size(3 << 20), "3.0M");
        assert_eq!(size((5 << 30) / 2), "2.5G");
    }
}
