//! [`TenancyApi`] for [`Engine`]: keys and tenants in the store, quotas in
//! the admission ledger, kept in step under the ledger's lock.

use async_trait::async_trait;
use mayfly_store::{KeyCheck, TenantRecord, TenantRemoval};
use mayfly_types::{
    check_key_id, CreateKeyRequest, CreatedKey, Event, KeyInfo, SandboxId, TenantInfo, TenantQuotas,
};

use super::quota::Ledger;
use super::{now_ms, Engine};
use crate::api::{Caller, DEFAULT_TENANT};
use crate::tenancy::{check_tenant, TenancyApi, TenancyError};
use crate::EngineError;

/// A key's last use is recorded at most this often (a write per request
/// would serialise every keyed request on the store's write lock).
const TOUCH_EVERY_MS: u64 = 60_000;

impl Engine {
    /// Loads every tenant's quotas from the store into a fresh ledger.
    pub(crate) fn load_ledger(store: &mayfly_store::Store) -> Result<Ledger, EngineError> {
        let tenants = store.tenants()?;
        Ok(Ledger::new(
            tenants.into_iter().map(|t| (t.name, t.quotas)),
            now_ms(),
        ))
    }

    /// The tenant owning a sandbox: from the ledger for live ones (no store
    /// read), else from its record; `None` for an unclaimed pool sandbox.
    pub(crate) fn owner(&self, id: &SandboxId) -> Result<Option<String>, EngineError> {
        if let Some(c) = self.ledger().owner(id) {
            return Ok(c.tenant.clone());
        }
        Ok(self.info(id)?.tenant)
    }

    pub(crate) fn events_of(
        &self,
        tenant: &str,
        since: i64,
        limit: u32,
    ) -> Result<Vec<Event>, EngineError> {
        Ok(self
            .inner
            .store
            .tenant_events(tenant, since, limit.min(10_000))?)
    }

    fn tenant_info(&self, rec: TenantRecord, ledger: &Ledger) -> TenantInfo {
        TenantInfo {
            usage: ledger.usage(&rec.name),
            name: rec.name,
            quotas: rec.quotas,
            created_at: rec.created_at,
        }
    }

    /// Records a key's use if the last record is a minute old, off the
    /// request's path.
    fn touch(&self, info: &KeyInfo) {
        let now = now_ms();
        if info
            .last_used_at
            .is_some_and(|t| now.saturating_sub(t) < TOUCH_EVERY_MS)
        {
            return;
        }
        let (engine, id) = (self.clone(), info.id.clone());
        tokio::task::spawn_blocking(move || {
            if let Err(e) = engine.inner.store.touch_key(&id, now) {
                tracing::warn!(key = %id, error = %e, "recording a key's use failed");
            }
        });
    }
}

#[async_trait]
impl TenancyApi for Engine {
    async fn authenticate(&self, key: &str) -> Result<Caller, EngineError> {
        match self.inner.store.verify_key(key)? {
            KeyCheck::Valid(info) => {
                self.touch(&info);
                Ok(Caller {
                    name: format!("key:{}", info.id),
                    tenant: info.tenant,
                    admin: info.admin,
                })
            }
            KeyCheck::Revoked(info) => Err(TenancyError::RevokedKey { id: info.id }.into()),
            KeyCheck::Malformed | KeyCheck::Wrong => Err(TenancyError::BadKey.into()),
        }
    }

    async fn tenants(&self) -> Result<Vec<TenantInfo>, EngineError> {
        let recs = self.inner.store.tenants()?;
        let ledger = self.ledger();
        Ok(recs
            .into_iter()
            .map(|r| self.tenant_info(r, &ledger))
            .collect())
    }

    async fn tenant(&self, name: &str) -> Result<TenantInfo, EngineError> {
        check_tenant(name, None)?;
        let rec = self
            .inner
            .store
            .tenant(name)?
            .ok_or_else(|| TenancyError::NoSuchTenant {
                name: name.to_owned(),
            })?;
        Ok(self.tenant_info(rec, &self.ledger()))
    }

    async fn put_tenant(
        &self,
        name: &str,
        quotas: TenantQuotas,
    ) -> Result<TenantInfo, EngineError> {
        check_tenant(name, Some(&quotas))?;
        // The store and the ledger change under one lock, so concurrent
        // updates leave both with the same last word.
        let mut ledger = self.ledger();
        let (rec, created) = self.inner.store.put_tenant(name, &quotas)?;
        ledger.set_quotas(name, quotas, now_ms());
        tracing::info!(tenant = %name, created, ?quotas, "tenant quotas set");
        Ok(self.tenant_info(rec, &ledger))
    }

    async fn delete_tenant(&self, name: &str) -> Result<(), EngineError> {
        check_tenant(name, None)?;
        if name == DEFAULT_TENANT {
            return Err(TenancyError::DefaultTenant.into());
        }
        let busy = |live| TenancyError::TenantBusy {
            name: name.to_owned(),
            live,
        };
        // Under the ledger's lock no create of this tenant can be admitted
        // between the check and the removal.
        let mut ledger = self.ledger();
        let live = ledger.usage(name).live;
        if live > 0 {
            return Err(busy(live).into());
        }
        match self.inner.store.remove_tenant(name)? {
            TenantRemoval::Missing => Err(TenancyError::NoSuchTenant {
                name: name.to_owned(),
            }
            .into()),
            TenantRemoval::HasSandboxes { live } => Err(busy(live).into()),
            TenantRemoval::Removed { revoked_keys } => {
                ledger.remove_tenant(name).map_err(busy)?;
                self.inner.revocations.send_modify(|n| *n += 1);
                tracing::info!(tenant = %name, revoked_keys, "tenant removed");
                Ok(())
            }
        }
    }

    async fn create_key(&self, req: &CreateKeyRequest) -> Result<CreatedKey, EngineError> {
        check_tenant(&req.tenant, None)?;
        let key = self
            .inner
            .store
            .create_key(&req.tenant, req.admin)?
            .ok_or_else(|| TenancyError::NoSuchTenant {
                name: req.tenant.clone(),
            })?;
        // The id only: the secret is never logged.
        tracing::info!(key = %key.info.id, tenant = %req.tenant, admin = req.admin, "API key created");
        Ok(CreatedKey {
            secret: key.secret,
            key: key.info,
        })
    }

    async fn keys(&self) -> Result<Vec<KeyInfo>, EngineError> {
        Ok(self.inner.store.keys()?)
    }

    async fn revoke_key(&self, id: &str) -> Result<KeyInfo, EngineError> {
        check_key_id(id).map_err(|e| EngineError::Invalid(e.to_string()))?;
        let info = self
            .inner
            .store
            .revoke_key(id)?
            .ok_or_else(|| TenancyError::NoSuchKey { id: id.to_owned() })?;
        self.inner.revocations.send_modify(|n| *n += 1);
        tracing::info!(key = %id, "API key revoked");
        Ok(info)
    }

    fn revocations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.revocations.subscribe()
    }
}
