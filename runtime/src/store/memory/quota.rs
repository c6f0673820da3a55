//! Quota overrides in memory: the `:quota` companion keys `redguard::admin` writes, kept in
//! their own table of the limit's shard (same hash tag), applied by `rate_check` as the
//! scripts apply them (quota.lua).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::table::Table;
use super::{MemoryStore, SHARDS, Shard};
use crate::key::Key;
use crate::store::admin::Raw;
use crate::values::{Limit, QUOTA_SUFFIX, Quota};

/// Overrides by their `:quota` key, as stored: the text and its expiry.
pub(super) type Quotas = Table<String>;

/// The expiry a permanent override is kept at: never reached.
const PERMANENT: Duration = Duration::MAX;

/// `limit` with the override of the state at `key` applied, read from `shard` (locked by
/// the caller: the override shares the state's hash tag), else with that of the longest
/// prefix of `key` among `store`'s prefix overrides, if one is set; an override that is not
/// one is ignored (warned, counted), as the scripts ignore it.
pub(super) fn with_quota(
    store: &MemoryStore,
    shard: &mut Shard,
    now: Duration,
    key: &Key,
    limit: &Limit,
) -> Option<Limit> {
    // Without the empty table's test every check would render the `:quota` key.
    let own = (!shard.quotas.is_empty())
        .then(|| {
            shard
                .quotas
                .at(now)
                .get(&key.companion(QUOTA_SUFFIX))
                .cloned()
        })
        .flatten();
    let stored = match own {
        Some(stored) => stored,
        None => store.prefix_quota(now, key)?,
    };
    let applied = Quota::decode(&stored)
        .ok()
        .and_then(|quota| quota.apply(limit));
    if applied.is_none() {
        crate::store::rate::quota_ignored(key);
    }
    applied
}

impl MemoryStore {
    /// The override at `key` (a `:quota` key) as Redis holds it, with its expiry.
    pub(super) fn quota_raw(&self, key: &Key) -> Option<(Raw, Option<Duration>)> {
        let (mut shard, now) = self.shard(key);
        let quotas = shard.quotas.at(now);
        let value = quotas.get(key)?.clone();
        let at = quotas.expires_at(key).filter(|at| *at != PERMANENT);
        Some((Raw::Text(value), at))
    }

    /// Every override key starting with `prefix`.
    pub(super) fn quota_keys(&self, prefix: &str) -> Vec<String> {
        let mut keys = Vec::new();
        for index in 0..SHARDS {
            let mut shard = self.lock_shard(index);
            let now = self.clock.now();
            keys.extend(
                shard
                    .quotas
                    .at(now)
                    .keys()
                    .filter(|k| k.starts_with(prefix))
                    .map(str::to_owned),
            );
        }
        keys
    }

    /// Removes the override at `key`; whether there was one.
    pub(super) fn quota_remove(&self, key: &Key) -> bool {
        let (mut shard, now) = self.shard(key);
        shard.quotas.at(now).remove(key).is_some()
    }

    fn prefixes(&self) -> std::sync::MutexGuard<'_, Quotas> {
        // One map operation per change: a poisoned lock still holds a consistent table.
        self.tables
            .quota_prefixes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The stored override of the longest prefix of `key`, if any.
    fn prefix_quota(&self, now: Duration, key: &Key) -> Option<String> {
        // Every check of every shard comes here: without a prefix override it takes no lock.
        if !self.tables.has_prefixes.load(Ordering::Acquire) {
            return None;
        }
        let mut prefixes = self.prefixes();
        let live = prefixes.at(now);
        let stored = live
            .keys()
            .filter(|prefix| key.as_str().starts_with(prefix))
            .max_by_key(|prefix| prefix.len())
            .and_then(|longest| live.get(&Key::stored(longest)).cloned());
        // The sweep may have dropped the last (expired) override.
        if prefixes.is_empty() {
            self.tables.has_prefixes.store(false, Ordering::Release);
        }
        stored
    }

    /// Sets or (`None`) removes the prefix override at `field`; whether one was there.
    pub(super) fn prefix_put(
        &self,
        field: &str,
        value: Option<&str>,
        ttl: Option<Duration>,
        max: usize,
    ) -> crate::error::Result<bool> {
        let now = self.clock.now();
        let mut prefixes = self.prefixes();
        let mut live = prefixes.at(now);
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
        // Under the lock, so the flag follows the last change.
        let has = !prefixes.is_empty();
        self.tables.has_prefixes.store(has, Ordering::Release);
        Ok(had)
    }

    /// The live prefix overrides, in the scripts' listing form.
    pub(super) fn prefix_list(&self) -> (Duration, Vec<(String, String)>) {
        let now = self.clock.now();
        let mut prefixes = self.prefixes();
        let live = prefixes.at(now);
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

    /// Writes `value` at `key`, for `ttl` or (none) for good.
    pub(super) fn quota_put(&self, key: &Key, value: &str, ttl: Option<Duration>) {
        let (mut shard, now) = self.shard(key);
        let at = ttl.map_or(PERMANENT, |ttl| now.saturating_add(ttl));
        shard.quotas.at(now).put(key, value.to_owned(), at);
    }
}
