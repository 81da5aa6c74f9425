//! API keys and tenants: the second way in, beside [`crate::SandboxApi`].
//!
//! A front end resolves a request's key into a [`Caller`] with
//! [`TenancyApi::authenticate`], and an admin caller manages tenants and
//! keys through the rest. Quotas are enforced by the engine at admission
//! (`engine::quota`), not here.

use async_trait::async_trait;
use mayfly_types::{CreateKeyRequest, CreatedKey, ErrorCode, KeyInfo, TenantInfo, TenantQuotas};

use crate::{Caller, EngineError};

/// Why a key or tenant operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenancyError {
    /// Unknown id and wrong secret are one answer: a guesser learns nothing.
    #[error("the API key is not valid")]
    BadKey,
    #[error("API key {id} has been revoked")]
    RevokedKey { id: String },
    #[error("tenant `{name}` does not exist")]
    NoSuchTenant { name: String },
    #[error("API key {id} does not exist")]
    NoSuchKey { id: String },
    #[error("tenant `{name}` still has {live} live sandboxes; destroy them first")]
    TenantBusy { name: String, live: u32 },
    #[error("the `default` tenant belongs to the host's operator and cannot be removed")]
    DefaultTenant,
}

impl TenancyError {
    pub fn code(&self) -> ErrorCode {
        match self {
            TenancyError::BadKey | TenancyError::RevokedKey { .. } => ErrorCode::Unauthenticated,
            TenancyError::NoSuchTenant { .. } | TenancyError::NoSuchKey { .. } => {
                ErrorCode::NotFound
            }
            TenancyError::TenantBusy { .. } | TenancyError::DefaultTenant => ErrorCode::Conflict,
        }
    }
}

/// Keys and tenants. Names and ids are checked here too (a bad one is
/// `EngineError::Invalid`), whatever the front end checked before.
#[async_trait]
pub trait TenancyApi: Send + Sync {
    /// The caller a presented key (`mfk_<id>_<secret>`) stands for: its
    /// tenant and admin flag, named `key:<id>` in the audit trail.
    async fn authenticate(&self, key: &str) -> Result<Caller, EngineError>;

    /// Every tenant with its quotas and current usage, by name.
    async fn tenants(&self) -> Result<Vec<TenantInfo>, EngineError>;
    async fn tenant(&self, name: &str) -> Result<TenantInfo, EngineError>;
    /// Creates the tenant or replaces its quotas; they hold from the next
    /// create on.
    async fn put_tenant(&self, name: &str, quotas: TenantQuotas)
        -> Result<TenantInfo, EngineError>;
    /// Removes a tenant without live sandboxes, revoking its keys.
    async fn delete_tenant(&self, name: &str) -> Result<(), EngineError>;

    /// A new key; its secret is in the answer and nowhere else.
    async fn create_key(&self, req: &CreateKeyRequest) -> Result<CreatedKey, EngineError>;
    /// Every key, revoked ones included; never a secret.
    async fn keys(&self) -> Result<Vec<KeyInfo>, EngineError>;
    /// Revokes a key; its next request is refused, and requests it holds
    /// open (streams, forwards) are cut. Idempotent.
    async fn revoke_key(&self, id: &str) -> Result<KeyInfo, EngineError>;

    /// Moves whenever a key is revoked or a tenant removed: a request that
    /// stays open re-authenticates its key then, and ends if it fails.
    fn revocations(&self) -> tokio::sync::watch::Receiver<u64>;
}

/// Checks a tenant name and quotas the way every [`TenancyApi`] must.
pub fn check_tenant(name: &str, quotas: Option<&TenantQuotas>) -> Result<(), EngineError> {
    mayfly_types::check_tenant_name(name).map_err(|e| EngineError::Invalid(e.to_string()))?;
    if let Some(q) = quotas {
        q.validate()
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
    }
    Ok(())
}
