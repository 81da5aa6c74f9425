//! [`TenancyApi`] for the fake engine: keys and tenants in a real, in-memory
//! store (so keys are made, hashed and checked as the daemon does), and
//! usage and the `max_live` quota counted over the fake's own sandboxes.

use async_trait::async_trait;
use mayfly_engine::{Caller, EngineError, QuotaError, TenancyApi, TenancyError};
use mayfly_store::{KeyCheck, Store, TenantRecord, TenantRemoval};
use mayfly_types::{
    CreateKeyRequest, CreatedKey, KeyInfo, SandboxId, SandboxInfo, SandboxState, TenantInfo,
    TenantQuotas, TenantUsage,
};

use super::FakeEngine;

/// The fake's store of tenants and keys.
pub struct FakeTenancy {
    pub store: Store,
    pub revocations: tokio::sync::watch::Sender<u64>,
}

impl Default for FakeTenancy {
    fn default() -> Self {
        FakeTenancy {
            store: Store::open_in_memory().expect("an in-memory store"),
            revocations: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl FakeEngine {
    /// Makes `tenant` (without quotas) if it is missing, and a key for it;
    /// returns the key's secret.
    pub fn make_key(&self, tenant: &str, admin: bool) -> String {
        let store = &self.tenancy.store;
        if store.tenant(tenant).expect("reading tenants").is_none() {
            store
                .put_tenant(tenant, &TenantQuotas::default())
                .expect("making a tenant");
        }
        store
            .create_key(tenant, admin)
            .expect("making a key")
            .expect("the tenant exists")
            .secret
    }

    /// Adds a sandbox that waits unclaimed in a pool (no tenant).
    pub fn insert_unclaimed(&self, id: SandboxId) {
        let mut st = self.lock();
        let mut info = st
            .sandboxes
            .values()
            .next()
            .cloned()
            .expect("insert_unclaimed needs one sandbox made first, as a model");
        info.id = id.clone();
        info.tenant = None;
        info.source = mayfly_types::SandboxSource::Pool;
        st.sandboxes.insert(id, info);
    }

    fn usage(&self, tenant: &str) -> TenantUsage {
        let st = self.lock();
        let live: Vec<&SandboxInfo> = st
            .sandboxes
            .values()
            .filter(|s| s.tenant.as_deref() == Some(tenant) && s.state == SandboxState::Ready)
            .collect();
        TenantUsage {
            live: live.len() as u32,
            cpu_millis: live.iter().map(|s| u64::from(s.limits.cpu_millis)).sum(),
            memory_bytes: live.iter().map(|s| s.limits.memory_bytes).sum(),
        }
    }

    /// The fake's admission: only the `max_live` quota, counted as the
    /// engine does.
    pub(super) fn admit(&self, caller: &Caller) -> Result<(), EngineError> {
        let rec = self.tenancy.store.tenant(&caller.tenant)?.ok_or_else(|| {
            TenancyError::NoSuchTenant {
                name: caller.tenant.clone(),
            }
        })?;
        match rec.quotas.max_live {
            Some(max) if self.usage(&caller.tenant).live >= max => Err(QuotaError::Live {
                tenant: caller.tenant.clone(),
                max,
            }
            .into()),
            _ => Ok(()),
        }
    }

    fn info(&self, rec: TenantRecord) -> TenantInfo {
        TenantInfo {
            usage: self.usage(&rec.name),
            name: rec.name,
            quotas: rec.quotas,
            created_at: rec.created_at,
        }
    }
}

#[async_trait]
impl TenancyApi for FakeEngine {
    async fn authenticate(&self, key: &str) -> Result<Caller, EngineError> {
        match self.tenancy.store.verify_key(key)? {
            KeyCheck::Valid(k) => Ok(Caller {
                name: format!("key:{}", k.id),
                tenant: k.tenant,
                admin: k.admin,
            }),
            KeyCheck::Revoked(k) => Err(TenancyError::RevokedKey { id: k.id }.into()),
            KeyCheck::Malformed | KeyCheck::Wrong => Err(TenancyError::BadKey.into()),
        }
    }

    async fn tenants(&self) -> Result<Vec<TenantInfo>, EngineError> {
        let recs = self.tenancy.store.tenants()?;
        Ok(recs.into_iter().map(|r| self.info(r)).collect())
    }

    async fn tenant(&self, name: &str) -> Result<TenantInfo, EngineError> {
        let rec = self
            .tenancy
            .store
            .tenant(name)?
            .ok_or_else(|| TenancyError::NoSuchTenant {
                name: name.to_owned(),
            })?;
        Ok(self.info(rec))
    }

    async fn put_tenant(
        &self,
        name: &str,
        quotas: TenantQuotas,
    ) -> Result<TenantInfo, EngineError> {
        let (rec, _) = self.tenancy.store.put_tenant(name, &quotas)?;
        Ok(self.info(rec))
    }

    async fn delete_tenant(&self, name: &str) -> Result<(), EngineError> {
        if name == mayfly_engine::api::DEFAULT_TENANT {
            return Err(TenancyError::DefaultTenant.into());
        }
        let live = self.usage(name).live;
        if live > 0 {
            return Err(TenancyError::TenantBusy {
                name: name.to_owned(),
                live,
            }
            .into());
        }
        match self.tenancy.store.remove_tenant(name)? {
            TenantRemoval::Removed { .. } => Ok(()),
            TenantRemoval::Missing => Err(TenancyError::NoSuchTenant {
                name: name.to_owned(),
            }
            .into()),
            TenantRemoval::HasSandboxes { live } => Err(TenancyError::TenantBusy {
                name: name.to_owned(),
                live,
            }
            .into()),
        }
    }

    async fn create_key(&self, req: &CreateKeyRequest) -> Result<CreatedKey, EngineError> {
        let k = self
            .tenancy
            .store
            .create_key(&req.tenant, req.admin)?
            .ok_or_else(|| TenancyError::NoSuchTenant {
                name: req.tenant.clone(),
            })?;
        Ok(CreatedKey {
            secret: k.secret,
            key: k.info,
        })
    }

    async fn keys(&self) -> Result<Vec<KeyInfo>, EngineError> {
        Ok(self.tenancy.store.keys()?)
    }

    async fn revoke_key(&self, id: &str) -> Result<KeyInfo, EngineError> {
        let info = self
            .tenancy
            .store
            .revoke_key(id)?
            .ok_or_else(|| TenancyError::NoSuchKey { id: id.to_owned() })?;
        self.tenancy.revocations.send_modify(|n| *n += 1);
        Ok(info)
    }

    fn revocations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.tenancy.revocations.subscribe()
    }
}
