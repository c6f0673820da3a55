//! Operator operations in memory, answering in the shapes Redis stores (see
//! [`store::admin`](crate::store::admin)).

use std::time::Duration;

use async_trait::async_trait;

use super::lock::{raw_set, raw_tickets};
use super::{MemoryStore, SHARDS, Shard};
use crate::error::Result;
use crate::key::Key;
use crate::store::admin::{AdminOps, ForceUnlock, Raw, RawEntry, ScanKeys, Snapshot, Unlocked};
use crate::store::lock::FENCE_TTL;

/// Suffix of a rate limit's penalty key, which memory keeps under the state key.
const BLOCK: &str = ":block";

/// Suffix of a rate limit's quota override (`quota.rs`).
const QUOTA: &str = ":quota";

/// Suffix of a rate limit's exact-key deny entry (`deny.rs`), kept in the overrides' table.
const DENY: &str = ":deny";

impl MemoryStore {
    /// One key as Redis would hold it, at `now`; with its expiry in ms.
    fn raw_entry(&self, key: &Key, now: Duration) -> (Raw, Option<Duration>) {
        let k = key.as_str();
        if k.ends_with(QUOTA) || k.ends_with(DENY) {
            return self.quota_raw(key).unwrap_or((Raw::Absent, None));
        }
        // Every key read here shares the hash tag of `key`, so its shard.
        let mut shard = self.lock_shard(self.shard_of(key));
        if let Some(base) = k.strip_suffix(BLOCK) {
            let base = Key::stored(base);
            let blocks = shard.rate_blocks.at(now);
            if let Some(until) = blocks.get(&base) {
                return (Raw::Text(format!("{until:.0}")), blocks.expires_at(&base));
            }
        }
        if let Some(base) = k.strip_suffix(":registered") {
            let queue = Key::stored(format!("{base}:queue"));
            let queues = shard.fair_queues.at(now);
            if let Some(waiters) = queues.get(&queue) {
                let raw = raw_set(waiters.iter().map(|(owner, at)| (owner.as_str(), *at)));
                return (raw, queues.expires_at(&queue));
            }
            return (Raw::Absent, None);
        }
        let records = shard.idem.at(now);
        if let Some(record) = records.get(key) {
            return (record.raw(), records.expires_at(key));
        }
        let locks = shard.locks.at(now);
        if let Some(state) = locks.get(key) {
            return (state.raw(k.ends_with(":intent")), locks.expires_at(key));
        }
        let sems = shard.semaphores.at(now);
        if let Some(holders) = sems.get(key) {
            let raw = raw_set(holders.iter().map(|(owner, at)| (owner.as_str(), *at)));
            return (raw, sems.expires_at(key));
        }
        let queues = shard.fair_queues.at(now);
        if let Some(queue) = queues.get(key) {
            return (raw_tickets(queue), queues.expires_at(key));
        }
        let fences = shard.fences.at(now);
        if let Some(fence) = fences.get(key) {
            return (Raw::Text(fence.to_string()), fences.expires_at(key));
        }
        let rates = shard.rates.at(now);
        if let Some(state) = rates.get(key) {
            let (raw, at_ms) = state.raw(now.as_nanos());
            let at = at_ms.map(Duration::from_millis).or(rates.expires_at(key));
            return (raw, at);
        }
        (Raw::Absent, None)
    }
}

#[async_trait]
impl AdminOps for MemoryStore {
    async fn admin_read(&self, keys: &[Key]) -> Result<Snapshot> {
        let now = self.clock.now();
        let entries = keys
            .iter()
            .map(|key| {
                let (value, at) = self.raw_entry(key, now);
                RawEntry {
                    key: key.to_string(),
                    value,
                    expires_at_ms: at.map(|at| u64::try_from(at.as_millis()).unwrap_or(u64::MAX)),
                }
            })
            .collect();
        Ok(Snapshot { now, entries })
    }

    async fn admin_scan(&self, prefix: &str, limit: usize) -> Result<ScanKeys> {
        let mut keys: Vec<String> = Vec::new();
        let matching = |key: &&str| key.starts_with(prefix);
        for index in 0..SHARDS {
            let mut shard = self.lock_shard(index);
            let now = self.clock.now();
            keys.extend(
                shard
                    .idem
                    .at(now)
                    .keys()
                    .filter(matching)
                    .map(str::to_owned),
            );
            keys.extend(
                shard
                    .locks
                    .at(now)
                    .keys()
                    .filter(matching)
                    .map(str::to_owned),
            );
            keys.extend(
                shard
                    .semaphores
                    .at(now)
                    .keys()
                    .filter(matching)
                    .map(str::to_owned),
            );
            keys.extend(
                shard
                    .fences
                    .at(now)
                    .keys()
                    .filter(matching)
                    .map(str::to_owned),
            );
            keys.extend(
                shard
                    .rates
                    .at(now)
                    .keys()
                    .filter(matching)
                    .map(str::to_owned),
            );
            for key in shard.fair_queues.at(now).keys().filter(matching) {
                keys.push(key.to_owned());
                if let Some(base) = key.strip_suffix(":queue") {
                    keys.push(format!("{base}:registered"));
                }
            }
            keys.extend(
                shard
                    .rate_blocks
                    .at(now)
                    .keys()
                    .map(|k| format!("{k}{BLOCK}"))
                    .filter(|k| k.starts_with(prefix)),
            );
        }
        keys.extend(self.quota_keys(prefix));
        keys.sort();
        keys.dedup();
        let truncated = keys.len() > limit;
        keys.truncate(limit);
        Ok(ScanKeys { keys, truncated })
    }

    async fn admin_unlock(&self, unlock: ForceUnlock<'_>) -> Result<Unlocked> {
        let freed = |owner: &str| unlock.owners.contains(&owner);
        let mut removed = 0u64;
        // The lock, its readers and its fence share a hash tag, so a shard.
        let (mut shard, now) = self.shard(unlock.lock);
        let Shard {
            locks,
            semaphores,
            fences,
            ..
        } = &mut *shard;
        let mut locks = locks.at(now);
        let mut sems = semaphores.at(now);
        let mut drop_holders = |key: &Key| {
            if let Some(holders) = sems.get_mut(key) {
                let before = holders.len();
                holders.retain(|owner, _| !freed(owner));
                removed += (before - holders.len()) as u64;
                if holders.is_empty() {
                    sems.remove(key);
                }
            }
        };
        if unlock.semaphore {
            drop_holders(unlock.lock);
        } else {
            if let Some(readers) = unlock.readers {
                drop_holders(readers);
            }
            if locks
                .get(unlock.lock)
                .is_some_and(|state| freed(state.owner()))
            {
                locks.remove(unlock.lock);
                removed += 1;
            }
        }
        if removed == 0 {
            return Ok(Unlocked {
                removed: 0,
                fence: None,
            });
        }
        let mut fences = fences.at(now);
        let clock = u64::try_from(now.as_micros()).unwrap_or(u64::MAX);
        let fence = fences
            .get(unlock.fence)
            .map_or(0, |last| last.saturating_add(1))
            .max(clock);
        fences.put(unlock.fence, fence, now + FENCE_TTL);
        drop(shard);
        self.tables.lock_waiters.notify(unlock.lock.as_str());
        Ok(Unlocked {
            removed,
            fence: Some(fence),
        })
    }

    async fn admin_forget(&self, key: &Key, fields: &[(String, String)]) -> Result<bool> {
        let (mut shard, now) = self.shard(key);
        let mut records = shard.idem.at(now);
        let unchanged = records.get(key).is_some_and(|record| match record.raw() {
            Raw::Hash { fields: now, .. } => fields.iter().all(|seen| now.contains(seen)),
            _ => false,
        });
        if unchanged {
            records.remove(key);
        }
        Ok(unchanged)
    }

    async fn admin_delete(&self, keys: &[Key]) -> Result<u64> {
        let mut deleted = 0;
        for key in keys {
            let k = key.as_str();
            if k.ends_with(QUOTA) || k.ends_with(DENY) {
                deleted += u64::from(self.quota_remove(key));
                continue;
            }
            let (mut shard, now) = self.shard(key);
            let existed = if let Some(base) = k.strip_suffix(BLOCK) {
                shard
                    .rate_blocks
                    .at(now)
                    .remove(&Key::stored(base))
                    .is_some()
            } else {
                shard.idem.at(now).remove(key).is_some()
                    || shard.rates.at(now).remove(key).is_some()
                    || shard.locks.at(now).remove(key).is_some()
                    || shard.semaphores.at(now).remove(key).is_some()
                    || shard.fair_queues.at(now).remove(key).is_some()
                    || shard.fences.at(now).remove(key).is_some()
            };
            deleted += u64::from(existed);
        }
        Ok(deleted)
    }

    async fn admin_quota_set(&self, key: &Key, value: &str, ttl: Option<Duration>) -> Result<()> {
        self.quota_put(key, value, ttl);
        Ok(())
    }

    async fn admin_quota_prefix(
        &self,
        hash: &Key,
        field: &str,
        value: Option<&str>,
        ttl: Option<Duration>,
        max: usize,
    ) -> Result<bool> {
        // Fields are whole state-key prefixes: one table serves every handle prefix.
        if is_deny_hash(hash) {
            return self.deny_put(field, value, ttl, max);
        }
        self.prefix_put(field, value, ttl, max)
    }

    async fn admin_quota_prefixes(&self, hash: &Key) -> Result<(Duration, Vec<(String, String)>)> {
        if is_deny_hash(hash) {
            return Ok(self.deny_entries());
        }
        Ok(self.prefix_list())
    }

    async fn admin_refund(&self, key: &Key, units: u64) -> Result<u64> {
        let (mut shard, now) = self.shard(key);
        Ok(shard
            .rates
            .at(now)
            .get_mut(key)
            .map_or(0, |state| state.refund(units, now.as_nanos())))
    }
}

/// Whether `hash` is the pattern deny hash (the store's prefix-hash operations serve both
/// features).
fn is_deny_hash(hash: &Key) -> bool {
    hash.as_str()
        .strip_suffix(crate::values::DENY_HASH)
        .is_some_and(|rest| rest.ends_with(":rate:"))
}
