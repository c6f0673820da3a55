//! Deny lists in memory, read by `rate_check` before any limit as deny.lua is: an exact key's
//! entry is its `:deny` companion, kept with the `:quota` companions in the limit's shard
//! (written by `admin_quota_set`, as on Redis); prefixes and networks, the handle's pattern
//! hash on Redis, are one table of the store (fields are whole state-key prefixes, so one
//! table serves every handle prefix).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::MemoryStore;
use super::quota::Quotas;
use crate::error::{Error, Result};
use crate::key::Key;
use crate::values::DENY_SUFFIX;

/// The expiry a permanent entry is kept at: never reached.
const PERMANENT: Duration = Duration::MAX;

impl MemoryStore {
    fn deny_table(&self) -> std::sync::MutexGuard<'_, Quotas> {
        // One map operation per change: a poisoned lock still holds a consistent table.
        self.tables
            .deny
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Refuses `key` when a live entry denies it.
    pub(super) fn check_denied(&self, now: Duration, key: &Key) -> Result<()> {
        let exact = {
            let (mut shard, _) = self.shard(key);
            // Without the empty table's test every check would render the `:deny` key.
            (!shard.quotas.is_empty())
                .then(|| {
                    let live = shard.quotas.at(now);
                    let value = live.get(&key.companion(DENY_SUFFIX))?;
                    let now_ms = u64::try_from(now.as_millis()).unwrap_or(u64::MAX);
                    crate::values::exact_reason(value, now_ms).map(str::to_owned)
                })
                .flatten()
        };
        let hit = match exact {
            Some(reason) => Some(reason),
            None => self.pattern_denies(now, key),
        };
        match hit {
            Some(reason) => Err(Error::Denied {
                key: key.to_string(),
                reason: (!reason.is_empty()).then_some(reason),
            }),
            None => Ok(()),
        }
    }

    /// The reason of the first live prefix or network entry that denies `key`.
    fn pattern_denies(&self, now: Duration, key: &Key) -> Option<String> {
        // Every check comes here: without a pattern it takes no lock.
        if !self.tables.has_deny.load(Ordering::Acquire) {
            return None;
        }
        let mut table = self.deny_table();
        let live = table.at(now);
        let hit = live.keys().find_map(|field| {
            let value = live.get(&Key::stored(field))?;
            crate::values::denies(field, value, key.as_str())
        });
        if table.is_empty() {
            self.tables.has_deny.store(false, Ordering::Release);
        }
        hit
    }

    /// Sets or (`None`) removes the pattern entry at `field`; whether one was there.
    pub(super) fn deny_put(
        &self,
        field: &str,
        value: Option<&str>,
        ttl: Option<Duration>,
        max: usize,
    ) -> Result<bool> {
        let now = self.clock.now();
        let mut table = self.deny_table();
        let mut live = table.at(now);
        let field = Key::stored(field);
        let had = live.get(&field).is_some();
        match value {
            Some(value) => {
                if !had && live.keys().count() >= max {
                    return Err(crate::store::admin::prefixes_full(max));
                }
                let at = ttl.map_or(PERMANENT, |ttl| now.saturating_add(ttl));
                live.put(&field, value.to_owned(), at);
            }
            None => {
                live.remove(&field);
            }
        }
        let has = !table.is_empty();
        self.tables.has_deny.store(has, Ordering::Release);
        Ok(had)
    }

    /// The live pattern entries, in the scripts' listing form.
    pub(super) fn deny_entries(&self) -> (Duration, Vec<(String, String)>) {
        let now = self.clock.now();
        let mut table = self.deny_table();
        let live = table.at(now);
        let fields = live
            .keys()
            .filter_map(|field| {
                let key = Key::stored(field);
                let at = live.expires_at(&key).filter(|at| *at != PERMANENT);
                let at_ms = at.map_or(0, |at| u64::try_from(at.as_millis()).unwrap_or(u64::MAX));
                Some((field.to_owned(), format!("{at_ms} {}", live.get(&key)?)))
            })
            .collect();
        (now, fields)
    }
}
