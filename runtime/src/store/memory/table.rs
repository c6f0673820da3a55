//! A map whose every entry expires. An expired entry is gone for every reader at once, and
//! dropped from memory a few at a time, so no call pays for a backlog of expiries.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::key::Key;

/// Expiry records a call examines at most, per table it uses. Each call adds at most a few
/// entries, so a backlog (a burst of keys expiring together) drains in later calls.
const SWEEP: usize = 8;

/// Entries of one guard in one shard. Read and written through [`Table::at`], which fixes the
/// time every expiry is judged against.
#[derive(Debug)]
pub(crate) struct Table<V> {
    /// The key is shared with its expiry record: a check on a live key allocates nothing.
    entries: HashMap<Arc<str>, Entry<V>>,
    /// One record per entry, due at or before the entry's expiry (an expiry moved later keeps
    /// its record, which is pushed again when due: a hot key does not grow the heap). Records
    /// left by an expiry moved earlier, or by a removed entry, are skipped when popped.
    expiry: BinaryHeap<Reverse<(Duration, Arc<str>)>>,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    expires_at: Duration,
    /// When this entry's live record in `expiry` is due.
    indexed: Duration,
}

impl<V> Default for Table<V> {
    fn default() -> Self {
        Table {
            entries: HashMap::new(),
            expiry: BinaryHeap::new(),
        }
    }
}

impl<V> Table<V> {
    /// The table as it stands at `now`, after dropping a few of the entries whose time has
    /// come (`expires_at <= now`; Redis keeps a key through the millisecond of its expiry, so
    /// it may answer for it up to 1 ms longer).
    pub(crate) fn at(&mut self, now: Duration) -> Live<'_, V> {
        for _ in 0..SWEEP {
            if self.expiry.peek().is_none_or(|Reverse((at, _))| *at > now) {
                break;
            }
            let Some(Reverse((at, key))) = self.expiry.pop() else {
                break;
            };
            match self.entries.get_mut(&*key) {
                Some(entry) if entry.expires_at <= now => {
                    self.entries.remove(&*key);
                }
                Some(entry) if entry.indexed == at => {
                    entry.indexed = entry.expires_at;
                    self.expiry.push(Reverse((entry.expires_at, key)));
                }
                // A record left behind: its entry is gone or has a record of its own.
                _ => {}
            }
        }
        Live { table: self, now }
    }
}

/// A [`Table`] at one instant: entries whose expiry has come are absent.
pub(crate) struct Live<'a, V> {
    table: &'a mut Table<V>,
    now: Duration,
}

impl<V> Live<'_, V> {
    fn live(&self, key: &str) -> Option<&Entry<V>> {
        self.table
            .entries
            .get(key)
            .filter(|entry| entry.expires_at > self.now)
    }

    fn live_mut(&mut self, key: &str) -> Option<&mut Entry<V>> {
        let now = self.now;
        self.table
            .entries
            .get_mut(key)
            .filter(|entry| entry.expires_at > now)
    }

    /// Every live key, in no particular order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        let now = self.now;
        self.table
            .entries
            .iter()
            .filter(move |(_, entry)| entry.expires_at > now)
            .map(|(key, _)| &**key)
    }

    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn len(&self) -> usize {
        self.keys().count()
    }

    pub(crate) fn get(&self, key: &Key) -> Option<&V> {
        self.live(key.as_str()).map(|entry| &entry.value)
    }

    pub(crate) fn get_mut(&mut self, key: &Key) -> Option<&mut V> {
        self.live_mut(key.as_str()).map(|entry| &mut entry.value)
    }

    /// When `key` expires, if present.
    pub(crate) fn expires_at(&self, key: &Key) -> Option<Duration> {
        self.live(key.as_str()).map(|entry| entry.expires_at)
    }

    /// Inserts or replaces an entry; a TTL is not optional.
    pub(crate) fn put(&mut self, key: &Key, value: V, expires_at: Duration) {
        // An expired entry not yet swept is replaced in place too: its record still stands.
        if let Some(entry) = self.table.entries.get_mut(key.as_str()) {
            entry.value = value;
            Self::move_expiry(&mut self.table.expiry, key, entry, expires_at);
            return;
        }
        let shared: Arc<str> = Arc::from(key.as_str());
        self.table
            .expiry
            .push(Reverse((expires_at, shared.clone())));
        let entry = Entry {
            value,
            expires_at,
            indexed: expires_at,
        };
        self.table.entries.insert(shared, entry);
    }

    /// Moves the expiry of a present entry; false if absent.
    pub(crate) fn set_expiry(&mut self, key: &Key, expires_at: Duration) -> bool {
        let now = self.now;
        let Some(entry) = self
            .table
            .entries
            .get_mut(key.as_str())
            .filter(|entry| entry.expires_at > now)
        else {
            return false;
        };
        Self::move_expiry(&mut self.table.expiry, key, entry, expires_at);
        true
    }

    fn move_expiry(
        expiry: &mut BinaryHeap<Reverse<(Duration, Arc<str>)>>,
        key: &Key,
        entry: &mut Entry<V>,
        expires_at: Duration,
    ) {
        entry.expires_at = expires_at;
        if expires_at < entry.indexed {
            // Earlier than its record: a new one, the old one is skipped when popped.
            entry.indexed = expires_at;
            expiry.push(Reverse((expires_at, Arc::from(key.as_str()))));
        }
    }

    /// Removes an entry, returning its value. Its expiry record is skipped when popped.
    pub(crate) fn remove(&mut self, key: &Key) -> Option<V> {
        let entry = self.table.entries.remove(key.as_str())?;
        (entry.expires_at > self.now).then_some(entry.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> Key {
        Key::stored(format!("k{i}"))
    }

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn an_entry_is_absent_from_its_expiry_on() {
        let mut table = Table::default();
        table.at(at(0)).put(&key(1), 1, at(10));
        assert_eq!(table.at(at(9)).get(&key(1)), Some(&1));
        assert_eq!(table.at(at(10)).get(&key(1)), None);
        assert!(!table.at(at(10)).set_expiry(&key(1), at(20)));
        assert_eq!(table.at(at(10)).remove(&key(1)), None);
    }

    #[test]
    fn a_moved_expiry_is_kept_both_ways() {
        let mut table = Table::default();
        table.at(at(0)).put(&key(1), 1, at(10));
        assert!(table.at(at(1)).set_expiry(&key(1), at(30)));
        // Its first record comes due at 10 and must not drop it.
        assert_eq!(table.at(at(20)).get(&key(1)), Some(&1));
        assert!(table.at(at(21)).set_expiry(&key(1), at(25)));
        assert_eq!(table.at(at(24)).expires_at(&key(1)), Some(at(25)));
        assert_eq!(table.at(at(25)).len(), 0);
        // Every record was popped: none outlives the entries.
        for ms in 25..40 {
            table.at(at(ms));
        }
        assert!(table.entries.is_empty() && table.expiry.is_empty());
    }

    #[test]
    fn a_backlog_of_expiries_drains_a_few_per_call() {
        let mut table = Table::default();
        for i in 0..1000 {
            table.at(at(0)).put(&key(i), i, at(10));
        }
        // A call does bounded work however many entries expired together...
        assert_eq!(table.at(at(10)).len(), 0);
        assert_eq!(table.entries.len(), 1000 - SWEEP);
        // ...and later calls free them all.
        for _ in 0..1000 / SWEEP {
            table.at(at(11));
        }
        assert!(table.entries.is_empty() && table.expiry.is_empty());
    }

    #[test]
    fn a_hot_key_keeps_one_record() {
        let mut table = Table::default();
        for ms in 0..1000 {
            table.at(at(ms)).put(&key(1), ms, at(ms + 5));
        }
        assert!(table.expiry.len() <= 2, "{} records", table.expiry.len());
        assert_eq!(table.at(at(1003)).get(&key(1)), Some(&999));
    }
}
