//! `mayfly pool ls|set|drain`, and the `--pool` setting of `mayfly serve`.

use clap::{Args, Subcommand};
use mayfly_types::{PoolInfo, PoolSpec};

use crate::cli::{Cli, LimitArgs};
use crate::output;

#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// List the pools and how full they are.
    Ls,
    /// Create or change a pool.
    Set(PoolSetArgs),
    /// Empty a pool and stop its refill (its target becomes 0).
    Drain {
        /// The pool's name.
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct PoolSetArgs {
    /// The pool's name.
    pub name: String,
    /// `host`, `dir:/path/to/rootfs` or a built template's name (default: `host`, or the pool's).
    #[arg(long, short = 't')]
    pub template: Option<String>,
    /// Booted, unclaimed sandboxes to keep ready.
    #[arg(long)]
    pub target: Option<u32>,
    /// The most unclaimed sandboxes the pool may hold.
    #[arg(long)]
    pub max: Option<u32>,
    /// Sandboxes booted at once while refilling.
    #[arg(long)]
    pub concurrency: Option<u32>,
    /// Boot the pool's sandboxes with a network interface: they serve
    /// creates with egress `allow` or `open` (and only those).
    #[arg(long)]
    pub network: Option<bool>,
    /// The limits of the pool's sandboxes.
    #[command(flatten)]
    pub limits: LimitArgs,
}

pub async fn pool(cli: &Cli, cmd: &PoolCommand) -> anyhow::Result<i32> {
    let c = crate::cmd_sandbox::client(cli)?;
    match cmd {
        PoolCommand::Ls => {
            let pools = c.pools().await?;
            if cli.json {
                output::json(&pools)?;
            } else {
                pool_table(&pools);
            }
        }
        PoolCommand::Set(a) => {
            mayfly_engine::check_pool_name(&a.name)?;
            let spec = PoolSpec {
                template: a.template.clone(),
                target: a.target,
                max: a.max,
                refill_concurrency: a.concurrency,
                limits: a.limits.limits(None)?,
                network: a.network,
            };
            let info = c.set_pool(&a.name, &spec).await?;
            show(cli, &info)?;
        }
        PoolCommand::Drain { name } => {
            mayfly_engine::check_pool_name(name)?;
            let info = c.drain_pool(name).await?;
            show(cli, &info)?;
        }
    }
    Ok(0)
}

fn show(cli: &Cli, info: &PoolInfo) -> anyhow::Result<()> {
    if cli.json {
        output::json(info)
    } else {
        pool_table(std::slice::from_ref(info));
        Ok(())
    }
}

fn pool_table(pools: &[PoolInfo]) {
    println!(
        "{:<16} {:<24} {:>6} {:>6} {:>6} {:>7} {:>5} {:>8} {:>7}",
        "NAME", "TEMPLATE", "READY", "TARGET", "MAX", "FILLING", "CONC", "CLAIMS", "MISSES"
    );
    for p in pools {
        println!(
            "{:<16} {:<24} {:>6} {:>6} {:>6} {:>7} {:>5} {:>8} {:>7}",
            p.name,
            p.template,
            p.ready,
            p.target,
            p.max,
            p.filling,
            p.refill_concurrency,
            p.claims,
            p.misses
        );
    }
}

/// `--pool NAME=TARGET[,max=N][,concurrency=N][,template=T]` of `mayfly serve`.
pub fn parse_pool_flag(s: &str) -> Result<(String, PoolSpec), String> {
    let (name, rest) = s.split_once('=').ok_or_else(|| {
        format!("`{s}`: expected NAME=TARGET[,max=N][,concurrency=N][,template=T][,network=on]")
    })?;
    mayfly_engine::check_pool_name(name).map_err(|e| e.to_string())?;
    let mut parts = rest.split(',');
    let num = |k: &str, v: &str| {
        v.parse::<u32>()
            .map_err(|_| format!("`{s}`: {k} `{v}` is not a whole number"))
    };
    let mut spec = PoolSpec {
        target: Some(num("target", parts.next().unwrap_or_default())?),
        ..PoolSpec::default()
    };
    for kv in parts {
        match kv.split_once('=') {
            Some(("max", v)) => spec.max = Some(num("max", v)?),
            Some(("concurrency", v)) => spec.refill_concurrency = Some(num("concurrency", v)?),
            Some(("template", v)) => spec.template = Some(v.to_owned()),
            Some(("network", "true" | "on")) => spec.network = Some(true),
            Some(("network", "false" | "off")) => spec.network = Some(false),
            _ => {
                return Err(format!(
                "`{s}`: unknown setting `{kv}`; use max=N, concurrency=N, template=T or network=on"
            ))
            }
        }
    }
    Ok((name.to_owned(), spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_flags_parse() {
        let (name, spec) = parse_pool_flag("host=8,max=16,concurrency=2").unwrap();
        assert_eq!(name, "host");
        assert_eq!(
            spec,
            PoolSpec {
                target: Some(8),
                max: Some(16),
                refill_concurrency: Some(2),
                ..PoolSpec::default()
            }
        );
        let (_, spec) = parse_pool_flag("py=2,template=dir:/srv/py").unwrap();
        assert_eq!(spec.template.as_deref(), Some("dir:/srv/py"));
        for bad in [
            "host",
            "host=x",
            "Host=1",
            "host=1,max=-1",
            "host=1,size=2",
            "=1",
        ] {
            assert!(parse_pool_flag(bad).is_err(), "{bad}");
        }
    }
}
