//! Lock operations in memory.

use std::time::Duration;

use async_trait::async_trait;

use super::MemoryStore;
use crate::error::Result;
use crate::key::Key;
use crate::store::lock::FENCE_TTL;
use crate::store::{LockAcquire, LockOps, LockRelease, LockWatch};

#[derive(Debug)]
pub(super) struct LockState {
    /// Empty while a released lock is kept for `hold_at_least`: nobody can renew or enter it.
    owner: String,
    depth: u32,
    fence: u64,
}

#[async_trait]
impl LockOps for MemoryStore {
    async fn lock_acquire(
        &self,
        key: &Key,
        owner: &str,
        lease: Duration,
        max_depth: u32,
    ) -> Result<LockAcquire> {
        let (mut locks, now) = self.lock(&self.tables.locks);
        if let Some(state) = locks.get_mut(key) {
            if state.owner != owner || owner.is_empty() {
                let ttl = locks
                    .expires_at(key)
                    .map_or(Duration::ZERO, |at| at.saturating_sub(now));
                return Ok(LockAcquire::Held { ttl });
            }
            if state.depth >= max_depth {
                return Ok(LockAcquire::TooDeep { depth: state.depth });
            }
            state.depth += 1;
            let (fence, depth) = (state.fence, state.depth);
            // A nested entry may extend the lease, never shorten the outer level's.
            if locks.expires_at(key).is_some_and(|at| at < now + lease) {
                locks.set_expiry(key, now + lease);
            }
            return Ok(LockAcquire::Acquired { fence, depth });
        }
        // Same rule as the Redis script: increment, or restart from the clock in microseconds
        // when the counter has expired, so tokens keep increasing across long idle gaps.
        let fence_key = key.companion("fence");
        let (mut fences, _) = self.lock(&self.tables.fences);
        let fence = match fences.get(&fence_key) {
            Some(last) => last.saturating_add(1),
            None => u64::try_from(now.as_micros()).unwrap_or(u64::MAX),
        };
        fences.put(&fence_key, fence, now + FENCE_TTL.max(lease));
        let state = LockState {
            owner: owner.to_owned(),
            depth: 1,
            fence,
        };
        locks.put(key, state, now + lease);
        Ok(LockAcquire::Acquired { fence, depth: 1 })
    }

    async fn lock_renew(&self, key: &Key, owner: &str, lease: Duration) -> Result<bool> {
        let (mut locks, now) = self.lock(&self.tables.locks);
        let owned = locks
            .get(key)
            .is_some_and(|state| !owner.is_empty() && state.owner == owner);
        if owned {
            locks.set_expiry(key, now + lease);
        }
        Ok(owned)
    }

    async fn lock_release(&self, key: &Key, owner: &str, keep: Duration) -> Result<LockRelease> {
        let (mut locks, now) = self.lock(&self.tables.locks);
        let Some(state) = locks.get_mut(key) else {
            return Ok(LockRelease::NotOwner);
        };
        if owner.is_empty() || state.owner != owner {
            return Ok(LockRelease::NotOwner);
        }
        if state.depth > 1 {
            state.depth -= 1;
            return Ok(LockRelease::Nested { depth: state.depth });
        }
        if keep.is_zero() {
            locks.remove(key);
            drop(locks);
            self.tables.lock_waiters.notify(key.as_str());
        } else {
            state.owner.clear();
            state.depth = 0;
            locks.set_expiry(key, now + keep);
        }
        Ok(LockRelease::Released)
    }

    async fn lock_watch(&self, key: &Key) -> LockWatch {
        self.tables.lock_waiters.watch(key.as_str(), true)
    }
}
