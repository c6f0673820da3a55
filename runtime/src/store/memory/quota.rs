//! Quota overrides in memory: the `:quota` companion keys `redguard::admin` writes, kept in
//! their own table, applied by `rate_check` as the scripts apply them (quota.lua).

use std::time::Duration;

use super::MemoryStore;
use super::table::Table;
use crate::key::Key;
use crate::store::admin::Raw;
use crate::values::{Limit, QUOTA_SUFFIX, Quota};

/// Overrides by their `:quota` key, as stored: the text and its expiry.
pub(super) type Quotas = Table<String>;

/// The expiry a permanent override is kept at: never reached.
const PERMANENT: Duration = Duration::MAX;

impl MemoryStore {
    /// `limit` with the override of the state at `key` applied, if one is set; an override
    /// that is not one is ignored (warned, counted), as the scripts ignore it.
    pub(super) fn with_quota(&self, key: &Key, limit: &Limit) -> Option<Limit> {
        let stored = {
            let (quotas, _) = self.lock(&self.tables.quotas);
            quotas.get(&key.companion(QUOTA_SUFFIX))?.clone()
        };
        let applied = Quota::decode(&stored)
            .ok()
            .and_then(|quota| quota.apply(limit));
        if applied.is_none() {
            crate::store::rate::quota_ignored(key);
        }
        applied
    }

    /// The override at `key` (a `:quota` key) as Redis holds it, with its expiry.
    pub(super) fn quota_raw(&self, key: &Key) -> Option<(Raw, Option<Duration>)> {
        let (quotas, _) = self.lock(&self.tables.quotas);
        let value = quotas.get(key)?.clone();
        let at = quotas.expires_at(key).filter(|at| *at != PERMANENT);
        Some((Raw::Text(value), at))
    }

    /// Every override key starting with `prefix`.
    pub(super) fn quota_keys(&self, prefix: &str) -> Vec<String> {
        let (quotas, _) = self.lock(&self.tables.quotas);
        quotas
            .keys()
            .filter(|k| k.starts_with(prefix))
            .map(str::to_owned)
            .collect()
    }

    /// Removes the override at `key`; whether there was one.
    pub(super) fn quota_remove(&self, key: &Key) -> bool {
        self.lock(&self.tables.quotas).0.remove(key).is_some()
    }

    /// Writes `value` at `key`, for `ttl` or (none) for good.
    pub(super) fn quota_put(&self, key: &Key, value: &str, ttl: Option<Duration>) {
        let (mut quotas, now) = self.lock(&self.tables.quotas);
        let at = ttl.map_or(PERMANENT, |ttl| now.saturating_add(ttl));
        quotas.put(key, value.to_owned(), at);
    }
}
