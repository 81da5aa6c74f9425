//! Resource limits: what a create may ask for, and what a sandbox gets.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// Optional per-create overrides. Absent fields take the daemon's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Memory limit in bytes. Swap is always disabled.
    pub memory_bytes: Option<u64>,
    /// CPU quota in millicores (1000 = one full CPU).
    pub cpu_millis: Option<u32>,
    /// Maximum number of tasks (processes and threads).
    pub pids: Option<u32>,
    /// Size of the `/tmp` tmpfs in bytes.
    pub tmp_bytes: Option<u64>,
    /// RLIMIT_NOFILE for every command.
    pub nofile: Option<u64>,
    /// What the sandbox's writable layers (its changes to the root and
    /// `/workspace`) may hold on the host's disk, in bytes. Checked every
    /// second; a sandbox found past it is destroyed (reason `disk`).
    pub disk_bytes: Option<u64>,
}

/// The limits a sandbox actually runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolvedLimits {
    pub memory_bytes: u64,
    pub cpu_millis: u32,
    pub pids: u32,
    pub tmp_bytes: u64,
    pub nofile: u64,
    /// Records from before disk limits have the default.
    #[serde(default = "default_disk_bytes")]
    pub disk_bytes: u64,
}

fn default_disk_bytes() -> u64 {
    ResolvedLimits::DEFAULT.disk_bytes
}

/// A limit outside its allowed range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("limit `{field}` = {value} is out of range; allowed is {min}..={max}")]
pub struct LimitError {
    pub field: &'static str,
    pub value: u64,
    pub min: u64,
    pub max: u64,
}

impl ResolvedLimits {
    pub const MEMORY: (u64, u64) = (16 * MIB, 256 * GIB);
    pub const CPU: (u64, u64) = (10, 256_000);
    pub const PIDS: (u64, u64) = (8, 1 << 22);
    pub const TMP: (u64, u64) = (MIB, 256 * GIB);
    pub const NOFILE: (u64, u64) = (64, 1 << 20);
    pub const DISK: (u64, u64) = (64 * MIB, 16 * 1024 * GIB);

    /// Sensible defaults for an agent's sandbox.
    pub const DEFAULT: ResolvedLimits = ResolvedLimits {
        memory_bytes: 512 * MIB,
        cpu_millis: 1000,
        pids: 512,
        tmp_bytes: 256 * MIB,
        nofile: 4096,
        disk_bytes: 10 * GIB,
    };

    /// Applies overrides on top of `self`, rejecting anything out of range.
    pub fn with(self, o: &Limits) -> Result<ResolvedLimits, LimitError> {
        let r = ResolvedLimits {
            memory_bytes: o.memory_bytes.unwrap_or(self.memory_bytes),
            cpu_millis: o.cpu_millis.unwrap_or(self.cpu_millis),
            pids: o.pids.unwrap_or(self.pids),
            tmp_bytes: o.tmp_bytes.unwrap_or(self.tmp_bytes),
            nofile: o.nofile.unwrap_or(self.nofile),
            disk_bytes: o.disk_bytes.unwrap_or(self.disk_bytes),
        };
        r.validate()?;
        Ok(r)
    }

    pub fn validate(&self) -> Result<(), LimitError> {
        check("memory_bytes", self.memory_bytes, Self::MEMORY)?;
        check("cpu_millis", self.cpu_millis.into(), Self::CPU)?;
        check("pids", self.pids.into(), Self::PIDS)?;
        check("tmp_bytes", self.tmp_bytes, Self::TMP)?;
        check("nofile", self.nofile, Self::NOFILE)?;
        check("disk_bytes", self.disk_bytes, Self::DISK)
    }
}

fn check(field: &'static str, value: u64, (min, max): (u64, u64)) -> Result<(), LimitError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(LimitError {
            field,
            value,
            min,
            max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_replace_only_given_fields() {
        let r = ResolvedLimits::DEFAULT
            .with(&Limits {
                pids: Some(64),
                ..Limits::default()
            })
            .unwrap();
        assert_eq!(
            r,
            ResolvedLimits {
                pids: 64,
                ..ResolvedLimits::DEFAULT
            }
        );
    }

    #[test]
    fn zero_and_huge_limits_are_rejected_with_the_field_named() {
        let e = ResolvedLimits::DEFAULT
            .with(&Limits {
                memory_bytes: Some(u64::MAX),
                ..Limits::default()
            })
            .unwrap_err();
        assert_eq!(e.field, "memory_bytes");
        let e = ResolvedLimits::DEFAULT
            .with(&Limits {
                pids: Some(0),
                ..Limits::default()
            })
            .unwrap_err();
        assert_eq!(e.field, "pids");
    }

    #[test]
    fn unknown_limit_fields_are_rejected() {
        assert!(serde_json::from_str::<Limits>(r#"{"swap": 1}"#).is_err());
        assert!(serde_json::from_str::<Limits>(r#"{"pids": -1}"#).is_err());
    }

    #[test]
    fn records_from_before_disk_limits_read_with_the_default() {
        let old = r#"{"memory_bytes":1,"cpu_millis":2,"pids":3,"tmp_bytes":4,"nofile":5}"#;
        let r: ResolvedLimits = serde_json::from_str(old).unwrap();
        assert_eq!(r.disk_bytes, ResolvedLimits::DEFAULT.disk_bytes);
        assert_eq!((r.memory_bytes, r.nofile), (1, 5));
    }
}
