//! The fake's events, exec audit, keepalives and pools (the trait methods
//! in `fake.rs` delegate here).

use mayfly_engine::{Caller, EngineError, SandboxApi};
use mayfly_types::{Event, ExecAudit, SandboxId, SandboxInfo};

use super::FakeEngine;

impl FakeEngine {
    pub(super) fn events_now(&self, since: i64, limit: u32) -> Result<Vec<Event>, EngineError> {
        Ok(self
            .lock()
            .events
            .iter()
            .filter(|e| e.seq > since)
            .take(limit as usize)
            .cloned()
            .collect())
    }

    pub(super) async fn audit_now(&self, id: &SandboxId) -> Result<Vec<ExecAudit>, EngineError> {
        self.get(id).await?;
        Ok(self
            .lock()
            .audit
            .iter()
            .filter(|a| a.sandbox_id == id.as_str())
            .cloned()
            .collect())
    }

    pub(super) fn keepalive_now(
        &self,
        id: &SandboxId,
        ttl_secs: Option<u64>,
    ) -> Result<SandboxInfo, EngineError> {
        let mut st = self.lock();
        let info = st
            .sandboxes
            .get_mut(id)
            .ok_or_else(|| EngineError::NoSuchSandbox(id.clone()))?;
        if let Some(t) = ttl_secs {
            info.expires_at = info.created_at + t * 1000;
        }
        Ok(info.clone())
    }

    pub(super) fn pools_now(&self) -> Result<Vec<mayfly_types::PoolInfo>, EngineError> {
        Ok(self.lock().pools.values().cloned().collect())
    }

    pub(super) fn set_pool_now(
        &self,
        name: &str,
        spec: mayfly_types::PoolSpec,
        caller: &Caller,
    ) -> Result<mayfly_types::PoolInfo, EngineError> {
        if !caller.admin {
            return Err(EngineError::Forbidden("admin only".into()));
        }
        mayfly_engine::check_pool_name(name)?;
        let target = spec.target.unwrap_or(0);
        let info = mayfly_types::PoolInfo {
            name: name.to_owned(),
            template: spec.template.unwrap_or_else(|| "host".into()),
            target,
            max: spec.max.unwrap_or(target),
            refill_concurrency: spec.refill_concurrency.unwrap_or(1),
            limits: mayfly_types::ResolvedLimits::DEFAULT,
            network: spec.network.unwrap_or(false),
            ready: target,
            filling: 0,
            claims: 0,
            misses: 0,
        };
        self.lock().pools.insert(name.to_owned(), info.clone());
        Ok(info)
    }

    pub(super) fn drain_pool_now(
        &self,
        name: &str,
        _caller: &Caller,
    ) -> Result<mayfly_types::PoolInfo, EngineError> {
        let mut st = self.lock();
        let p = st
            .pools
            .get_mut(name)
            .ok_or_else(|| EngineError::NoSuchPool(name.to_owned()))?;
        p.target = 0;
        p.ready = 0;
        Ok(p.clone())
    }
}
