//! Deny lists in memory: the entries `redguard::admin` writes to a handle's two deny hashes
//! on Redis, kept in one table of the store (fields are whole state-key prefixes, so one
//! table serves every handle prefix; a pattern's field ends in `*` or holds a `/`, an exact
//! key's never), read by `rate_check` before any limit as deny.lua is.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::MemoryStore;
use super::quota::Quotas;
use crate::error::{Error, Result};
use crate::key::Key;

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
        // Every check comes here: without a deny list it takes no lock.
        if !self.tables.has_deny.load(Ordering::Acquire) {
            return Ok(());
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
        match hit {
            Some(reason) => Err(Error::Denied {
                key: key.to_string(),
                reason: (!reason.is_empty()).then_some(reason),
            }),
            None => Ok(()),
        }
    }

    /// Sets or (`None`) removes the entry at `field` (of the patterns' hash, or of the exact
    /// keys'); whether one was there.
    pub(super) fn deny_put(
        &self,
        patterns: bool,
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
                if !had && live.keys().filter(|f| is_pattern(f) == patterns).count() >= max {
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

    /// The live entries of one hash, in the scripts' listing form.
    pub(super) fn deny_entries(&self, patterns: bool) -> (Duration, Vec<(String, String)>) {
        let now = self.clock.now();
        let mut table = self.deny_table();
        let live = table.at(now);
        let fields = live
            .keys()
            .filter(|field| is_pattern(field) == patterns)
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

/// Whether a field is a prefix's or a network's: a key never holds `*` or `/`.
fn is_pattern(field: &str) -> bool {
    field.ends_with('*') || field.contains('/')
}
