//! Tenants, their quotas, and API keys: the admin API's wire types.
//!
//! Every API key belongs to one tenant. A tenant sees and touches only its
//! own sandboxes; an admin key also manages keys, tenants and pools.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{LimitError, UnixMillis};

/// The longest tenant name.
pub const MAX_TENANT_NAME: usize = 63;

/// Every API key starts with this, so a bearer token is known to be a key
/// (and not the daemon's legacy token) before it is looked up.
pub const KEY_PREFIX: &str = "mfk_";

/// A key id is this many lowercase hex digits.
pub const KEY_ID_LEN: usize = 12;

/// The largest count quota (live sandboxes, creates per minute).
pub const MAX_COUNT_QUOTA: u32 = 1_000_000;

/// The largest CPU or memory total: what the store's signed 64-bit
/// integers hold.
pub const MAX_TOTAL_QUOTA: u64 = i64::MAX as u64;

/// A tenant name that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tenant name `{shown}` is invalid: {reason}")]
pub struct TenantNameError {
    /// The name as given, cut to 64 characters and escaped for display.
    pub shown: String,
    pub reason: &'static str,
}

/// Checks a tenant name: 1 to 63 characters of `[a-z0-9_-]`, starting with
/// a letter or a digit (so it is safe in paths, logs and label values).
pub fn check_tenant_name(name: &str) -> Result<(), TenantNameError> {
    let err = |reason| TenantNameError {
        shown: name
            .chars()
            .take(64)
            .collect::<String>()
            .escape_debug()
            .to_string(),
        reason,
    };
    if name.is_empty() {
        return Err(err("it is empty"));
    }
    if name.len() > MAX_TENANT_NAME {
        return Err(err("it is longer than 63 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err(err("only a-z, 0-9, `-` and `_` are allowed"));
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(err("it must start with a letter or a digit"));
    }
    Ok(())
}

/// A key id that cannot be one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{shown}` is not an API key id: expected {KEY_ID_LEN} lowercase hex digits")]
pub struct KeyIdError {
    pub shown: String,
}

/// Checks a key id: [`KEY_ID_LEN`] lowercase hex digits.
pub fn check_key_id(id: &str) -> Result<(), KeyIdError> {
    if id.len() == KEY_ID_LEN && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(KeyIdError {
            shown: id
                .chars()
                .take(64)
                .collect::<String>()
                .escape_debug()
                .to_string(),
        })
    }
}

/// A tenant's quotas. An absent (or `null`) quota is unlimited.
///
/// `PUT /v1/tenants/{name}` replaces all four: a quota left out becomes
/// unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantQuotas {
    /// The most sandboxes the tenant may have alive at once.
    pub max_live: Option<u32>,
    /// The most creates per minute (a token bucket: up to this many at once,
    /// then one every 60/N seconds).
    pub max_creates_per_min: Option<u32>,
    /// The most CPU, in millicores, that the tenant's live sandboxes may
    /// ask for in total.
    pub max_cpu_millis: Option<u64>,
    /// The most memory, in bytes, that the tenant's live sandboxes may ask
    /// for in total.
    pub max_memory_bytes: Option<u64>,
}

impl TenantQuotas {
    /// Rejects a quota the store cannot hold.
    pub fn validate(&self) -> Result<(), LimitError> {
        let count = |field, v: Option<u32>| match v {
            Some(v) if v > MAX_COUNT_QUOTA => Err(LimitError {
                field,
                value: v.into(),
                min: 0,
                max: MAX_COUNT_QUOTA.into(),
            }),
            _ => Ok(()),
        };
        let total = |field, v: Option<u64>| match v {
            Some(v) if v > MAX_TOTAL_QUOTA => Err(LimitError {
                field,
                value: v,
                min: 0,
                max: MAX_TOTAL_QUOTA,
            }),
            _ => Ok(()),
        };
        count("max_live", self.max_live)?;
        count("max_creates_per_min", self.max_creates_per_min)?;
        total("max_cpu_millis", self.max_cpu_millis)?;
        total("max_memory_bytes", self.max_memory_bytes)
    }
}

/// What a tenant's live sandboxes hold now (including creates under way).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantUsage {
    pub live: u32,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

/// A tenant: its quotas and what it uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantInfo {
    pub name: String,
    pub quotas: TenantQuotas,
    pub usage: TenantUsage,
    pub created_at: UnixMillis,
}

/// `GET /v1/tenants`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantList {
    pub tenants: Vec<TenantInfo>,
}

/// `POST /v1/keys`: a new key for a tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKeyRequest {
    /// The tenant the key acts for; it must exist.
    pub tenant: String,
    /// Whether the key may manage keys, tenants and pools, and see every
    /// tenant's sandboxes.
    #[serde(default)]
    pub admin: bool,
}

/// An API key as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KeyInfo {
    /// The key's public id (the audit trail names callers `key:<id>`).
    pub id: String,
    pub tenant: String,
    pub admin: bool,
    pub created_at: UnixMillis,
    pub revoked_at: Option<UnixMillis>,
    /// When the key was last used, to the minute.
    pub last_used_at: Option<UnixMillis>,
}

/// The answer to `POST /v1/keys`: the only time the secret is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreatedKey {
    /// `mfk_<id>_<secret>`: send it as `Authorization: Bearer <secret>`.
    /// Only its hash is stored; it cannot be shown again.
    pub secret: String,
    pub key: KeyInfo,
}

/// `GET /v1/keys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KeyList {
    pub keys: Vec<KeyInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_are_short_lowercase_words() {
        for good in ["a", "team-1", "ci_runner", "0abc", &"x".repeat(63)] {
            assert_eq!(check_tenant_name(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "A",
            "-x",
            "_x",
            "a b",
            "a/b",
            "é",
            "a\0",
            &"x".repeat(64),
        ] {
            assert!(check_tenant_name(bad).is_err(), "{bad:?} accepted");
        }
        let e = check_tenant_name("bad\nname").unwrap_err();
        assert!(e.to_string().contains("bad\\nname"), "{e}");
    }

    #[test]
    fn key_ids_are_twelve_hex_digits() {
        assert_eq!(check_key_id("0123456789ab"), Ok(()));
        for bad in [
            "",
            "0123456789a",
            "0123456789abc",
            "0123456789AB",
            "0123456789ag",
        ] {
            assert!(check_key_id(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn quotas_reject_what_the_store_cannot_hold_and_unknown_fields() {
        assert!(TenantQuotas::default().validate().is_ok());
        let q = TenantQuotas {
            max_live: Some(MAX_COUNT_QUOTA + 1),
            ..TenantQuotas::default()
        };
        assert_eq!(q.validate().unwrap_err().field, "max_live");
        let q = TenantQuotas {
            max_memory_bytes: Some(u64::MAX),
            ..TenantQuotas::default()
        };
        assert_eq!(q.validate().unwrap_err().field, "max_memory_bytes");
        assert!(serde_json::from_str::<TenantQuotas>(r#"{"max_lives":1}"#).is_err());
        assert!(serde_json::from_str::<TenantQuotas>(r#"{"max_live":-1}"#).is_err());
        let q: TenantQuotas = serde_json::from_str(r#"{"max_live":null,"max_cpu_millis":5}"#)
            .expect("null means unlimited");
        assert_eq!(q.max_live, None);
        assert_eq!(q.max_cpu_millis, Some(5));
    }
}
