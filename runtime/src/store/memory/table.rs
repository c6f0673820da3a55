//! A map whose every entry expires, with expired entries dropped in time order.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use crate::key::Key;

/// Entries of one guard. Every entry has an expiry; an index ordered by expiry lets
/// [`Table::sweep`] drop expired entries as time passes, not only when they are touched.
#[derive(Debug)]
pub(crate) struct Table<V> {
    entries: HashMap<String, Entry<V>>,
    expiry: BTreeSet<(Duration, String)>,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    expires_at: Duration,
}

impl<V> Default for Table<V> {
    fn default() -> Self {
        Table {
            entries: HashMap::new(),
            expiry: BTreeSet::new(),
        }
    }
}

impl<V> Table<V> {
    /// Drops every entry whose time has come (`expires_at <= now`; Redis keeps a key through
    /// the millisecond of its expiry, so it may answer for it up to 1 ms longer).
    pub(crate) fn sweep(&mut self, now: Duration) {
        while let Some((at, _)) = self.expiry.first() {
            if *at > now {
                break;
            }
            if let Some((_, key)) = self.expiry.pop_first() {
                self.entries.remove(&key);
            }
        }
    }

    /// Every live key, in no particular order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    #[cfg(feature = "test-util")]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn get(&self, key: &Key) -> Option<&V> {
        self.entries.get(key.as_str()).map(|entry| &entry.value)
    }

    pub(crate) fn get_mut(&mut self, key: &Key) -> Option<&mut V> {
        self.entries
            .get_mut(key.as_str())
            .map(|entry| &mut entry.value)
    }

    /// When `key` expires, if present.
    pub(crate) fn expires_at(&self, key: &Key) -> Option<Duration> {
        self.entries.get(key.as_str()).map(|entry| entry.expires_at)
    }

    /// Inserts or replaces an entry; a TTL is not optional.
    pub(crate) fn put(&mut self, key: &Key, value: V, expires_at: Duration) {
        let key = key.as_str().to_owned();
        if let Some(old) = self.entries.get(&key) {
            self.expiry.remove(&(old.expires_at, key.clone()));
        }
        self.expiry.insert((expires_at, key.clone()));
        self.entries.insert(key, Entry { value, expires_at });
    }

    /// Moves the expiry of a present entry; false if absent.
    pub(crate) fn set_expiry(&mut self, key: &Key, expires_at: Duration) -> bool {
        let Some(entry) = self.entries.get_mut(key.as_str()) else {
            return false;
        };
        let owned = key.as_str().to_owned();
        self.expiry.remove(&(entry.expires_at, owned.clone()));
        entry.expires_at = expires_at;
        self.expiry.insert((expires_at, owned));
        true
    }

    /// Removes an entry, returning its value.
    pub(crate) fn remove(&mut self, key: &Key) -> Option<V> {
        let entry = self.entries.remove(key.as_str())?;
        self.expiry
            .remove(&(entry.expires_at, key.as_str().to_owned()));
        Some(entry.value)
    }
}
