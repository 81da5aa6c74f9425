//! `mayfly tenant …` and `mayfly key …`: the admin API, through the daemon.

use clap::{Args, Subcommand};
use mayfly_types::{CreateKeyRequest, KeyInfo, TenantInfo, TenantQuotas};

use crate::cli::{parse_size, Cli};
use crate::cmd_sandbox::client;
use crate::output;

#[derive(Debug, Subcommand)]
pub enum TenantCmd {
    /// List tenants with their quotas and what their live sandboxes hold.
    Ls,
    /// Create a tenant or replace its quotas. A quota not given is unlimited.
    Set(TenantSetArgs),
    /// Remove a tenant without live sandboxes; its keys are revoked.
    Rm { name: String },
}

#[derive(Debug, Args)]
pub struct TenantSetArgs {
    pub name: String,
    /// The most sandboxes alive at once.
    #[arg(long)]
    pub max_live: Option<u32>,
    /// The most creates per minute.
    #[arg(long)]
    pub max_creates_per_min: Option<u32>,
    /// The most CPU, in millicores, its live sandboxes may hold in total.
    #[arg(long)]
    pub max_cpu_millis: Option<u64>,
    /// The most memory its live sandboxes may hold in total (e.g. 8g).
    #[arg(long, value_parser = parse_size)]
    pub max_memory: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum KeyCmd {
    /// Make an API key for a tenant and print its secret (shown only once).
    Create {
        #[arg(long)]
        tenant: String,
        /// The key may manage keys and tenants and sees every tenant.
        #[arg(long)]
        admin: bool,
    },
    /// List API keys (never their secrets).
    Ls,
    /// Revoke an API key.
    Revoke { id: String },
}

pub async fn tenant(cli: &Cli, cmd: &TenantCmd) -> anyhow::Result<i32> {
    let c = client(cli)?;
    match cmd {
        TenantCmd::Ls => {
            let tenants = c.tenants().await?;
            if cli.json {
                output::json(&tenants)?;
            } else {
                tenant_table(&tenants);
            }
        }
        TenantCmd::Set(a) => {
            let quotas = TenantQuotas {
                max_live: a.max_live,
                max_creates_per_min: a.max_creates_per_min,
                max_cpu_millis: a.max_cpu_millis,
                max_memory_bytes: a.max_memory,
            };
            let t = c.put_tenant(&a.name, &quotas).await?;
            if cli.json {
                output::json(&t)?;
            } else {
                println!("{}", t.name);
            }
        }
        TenantCmd::Rm { name } => {
            c.delete_tenant(name).await?;
            if !cli.json {
                println!("{name}");
            }
        }
    }
    Ok(0)
}

pub async fn key(cli: &Cli, cmd: &KeyCmd) -> anyhow::Result<i32> {
    let c = client(cli)?;
    match cmd {
        KeyCmd::Create { tenant, admin } => {
            let req = CreateKeyRequest {
                tenant: tenant.clone(),
                admin: *admin,
            };
            let k = c.create_key(&req).await?;
            if cli.json {
                output::json(&k)?;
            } else {
                // The secret alone on stdout, so `KEY=$(mayfly key create …)` works.
                println!("{}", k.secret);
                eprintln!(
                    "key {} for tenant `{}`{}: store the secret now, it cannot be shown again",
                    k.key.id,
                    k.key.tenant,
                    if k.key.admin { " (admin)" } else { "" }
                );
            }
        }
        KeyCmd::Ls => {
            let keys = c.keys().await?;
            if cli.json {
                output::json(&keys)?;
            } else {
                key_table(&keys);
            }
        }
        KeyCmd::Revoke { id } => {
            let k = c.revoke_key(id).await?;
            if cli.json {
                output::json(&k)?;
            } else {
                println!("{}", k.id);
            }
        }
    }
    Ok(0)
}

fn limit<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".to_owned())
}

fn tenant_table(tenants: &[TenantInfo]) {
    println!(
        "{:<24} {:>10} {:>10} {:>16} {:>24}",
        "NAME", "LIVE", "CREATES/M", "CPU_MILLIS", "MEMORY_BYTES"
    );
    for t in tenants {
        let (q, u) = (&t.quotas, &t.usage);
        println!(
            "{:<24} {:>10} {:>10} {:>16} {:>24}",
            t.name,
            format!("{}/{}", u.live, limit(q.max_live)),
            limit(q.max_creates_per_min),
            format!("{}/{}", u.cpu_millis, limit(q.max_cpu_millis)),
            format!("{}/{}", u.memory_bytes, limit(q.max_memory_bytes)),
        );
    }
}

fn key_table(keys: &[KeyInfo]) {
    println!(
        "{:<14} {:<24} {:<6} {:<8} {:>14}",
        "ID", "TENANT", "ADMIN", "STATE", "CREATED_AT"
    );
    for k in keys {
        println!(
            "{:<14} {:<24} {:<6} {:<8} {:>14}",
            k.id,
            k.tenant,
            if k.admin { "yes" } else { "no" },
            if k.revoked_at.is_some() {
                "revoked"
            } else {
                "active"
            },
            k.created_at,
        );
    }
}
