//! The pass-through store: every guard lets every call through.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::error::Result;
use crate::handle::Redguard;
use crate::key::Key;
use crate::store::admin::{ForceUnlock, ScanKeys, Snapshot, Unlocked};
use crate::store::{
    Acquire, AdminOps, Begin, Finish, IdemBegin, IdemFinished, IdemOps, LockAcquire, LockOps,
    LockRelease, LockWatch, RateAdjust, RateCheck, RateMode, RateOps, RateOutcome, Release,
    Resolve, Resolved, Store, StoreKind, TokenOps, TokenOutcome,
};
use crate::values::{Decision, Replicas};

/// Stores nothing and refuses nothing: each idempotent call runs its body, each lock is
/// granted at once (with increasing fencing tokens), each rate limit admits, each token is
/// accepted.
#[derive(Debug, Default)]
pub(crate) struct PassStore {
    fences: AtomicU64,
}

impl PassStore {
    pub(crate) fn handle() -> Redguard {
        Redguard::memory().wrap_store(|_| Arc::new(PassStore::default()))
    }

    fn acquired(&self, level: u32) -> LockAcquire {
        LockAcquire::Acquired {
            fence: self.fences.fetch_add(1, Ordering::Relaxed) + 1,
            depth: level.max(1),
        }
    }
}

fn released(level: u32) -> LockRelease {
    match level {
        0 | 1 => LockRelease::Released,
        level => LockRelease::Nested { depth: level - 1 },
    }
}

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

#[async_trait]
impl Store for PassStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Memory
    }

    async fn time(&self) -> Result<Duration> {
        Ok(now())
    }
}

#[async_trait]
impl IdemOps for PassStore {
    async fn idem_begin(&self, _: Begin<'_>) -> Result<IdemBegin> {
        Ok(IdemBegin::Started)
    }

    async fn idem_renew(&self, _: &Key, _: &str, _: Duration) -> Result<bool> {
        Ok(true)
    }

    async fn idem_abandon(&self, _: &Key, _: &str) -> Result<()> {
        Ok(())
    }

    async fn idem_finish(&self, _: Finish<'_>) -> Result<IdemFinished> {
        Ok(IdemFinished::Recorded)
    }

    async fn idem_resolve(&self, _: Resolve<'_>) -> Result<Resolved> {
        Ok(Resolved::Missing)
    }

    async fn idem_watch(&self, _: &Key) -> LockWatch {
        LockWatch::polling()
    }
}

#[async_trait]
impl LockOps for PassStore {
    async fn lock_acquire(&self, acquire: Acquire<'_>) -> Result<LockAcquire> {
        Ok(self.acquired(acquire.level))
    }

    async fn lock_renew(&self, _: &Key, _: &str, _: Duration) -> Result<bool> {
        Ok(true)
    }

    async fn lock_release(&self, release: Release<'_>) -> Result<LockRelease> {
        Ok(released(release.level))
    }

    async fn semaphore_acquire(&self, _: Acquire<'_>, _: u32) -> Result<LockAcquire> {
        Ok(self.acquired(1))
    }

    async fn semaphore_renew(&self, _: &Key, _: &str, _: Duration) -> Result<bool> {
        Ok(true)
    }

    async fn semaphore_release(&self, _: &Key, _: &str) -> Result<LockRelease> {
        Ok(LockRelease::Released)
    }

    async fn rw_acquire(&self, _: Acquire<'_>, _: bool) -> Result<LockAcquire> {
        Ok(self.acquired(1))
    }

    async fn rw_release_read(&self, _: &Key, _: &str) -> Result<LockRelease> {
        Ok(LockRelease::Released)
    }

    async fn fair_acquire(&self, acquire: Acquire<'_>) -> Result<LockAcquire> {
        Ok(self.acquired(acquire.level))
    }

    async fn fair_release(&self, release: Release<'_>) -> Result<LockRelease> {
        Ok(released(release.level))
    }

    async fn fair_leave(&self, _: &Key, _: &str) -> Result<()> {
        Ok(())
    }

    async fn lock_watch(&self, _: &Key) -> LockWatch {
        LockWatch::polling()
    }

    async fn fair_watch(&self, _: &Key, _: &str) -> LockWatch {
        LockWatch::polling()
    }
}

#[async_trait]
impl RateOps for PassStore {
    async fn rate_check(&self, checks: &[RateCheck<'_>], _: RateMode) -> Result<RateOutcome> {
        let decisions = checks
            .iter()
            .map(|check| Decision::degraded(check.limit.burst(), check.limit.window()))
            .collect();
        Ok(RateOutcome {
            now: now(),
            decisions,
        })
    }

    async fn rate_adjust(&self, _: &RateCheck<'_>, adjust: RateAdjust) -> Result<u64> {
        // Nothing is counted here, so everything asked is as good as done.
        Ok(match adjust {
            RateAdjust::Charge(units) | RateAdjust::Refund(units) => units,
        })
    }
}

#[async_trait]
impl TokenOps for PassStore {
    async fn token_issue(&self, _: &Key, _: &str, _: Duration, _: Option<Replicas>) -> Result<()> {
        Ok(())
    }

    async fn token_consume(&self, _: &Key, _: &str, _: &str) -> Result<TokenOutcome> {
        Ok(TokenOutcome::Consumed)
    }

    async fn token_restore(&self, _: &Key, _: &str, _: &str) -> Result<bool> {
        Ok(true)
    }
}

#[async_trait]
impl AdminOps for PassStore {
    async fn admin_read(&self, keys: &[Key]) -> Result<Snapshot> {
        let entries = keys
            .iter()
            .map(|key| crate::store::admin::RawEntry {
                key: key.as_str().to_owned(),
                value: crate::store::admin::Raw::Absent,
                expires_at_ms: None,
            })
            .collect();
        Ok(Snapshot {
            now: now(),
            entries,
        })
    }

    async fn admin_scan(&self, _: &str, _: usize) -> Result<ScanKeys> {
        Ok(ScanKeys::default())
    }

    async fn admin_unlock(&self, _: ForceUnlock<'_>) -> Result<Unlocked> {
        Ok(Unlocked {
            removed: 0,
            fence: None,
        })
    }

    async fn admin_delete(&self, _: &[Key]) -> Result<u64> {
        Ok(0)
    }

    async fn admin_forget(&self, _: &Key, _: &[(String, String)]) -> Result<bool> {
        Ok(false)
    }

    async fn admin_refund(&self, _: &Key, _: u64) -> Result<u64> {
        Ok(0)
    }

    async fn admin_quota_set(&self, _: &Key, _: &str, _: Option<Duration>) -> Result<()> {
        Ok(())
    }
}
