//! A map whose every entry expires. An expired entry is gone for every reader at once, and
//! dropped from memory a few at a time, so no call pays for a backlog of expiries; the map
//! grows a few entries at a time too, so no call pays for moving all of it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashTable;

use crate::key::Key;

/// Expiry records a call examines at most, per table it uses. Each call adds at most a few
/// entries, so a backlog (a burst of keys expiring together) drains in later calls.
const SWEEP: usize = 8;

/// Buckets of a draining map a call moves at most. Two per insertion would do (the new map
/// holds twice the old one's entries, so it fills after as many insertions as the old one
/// has entries, and an old map has at most 8/7 as many buckets as entries); four leave room.
const MOVE: usize = 4;

/// Entries of one guard in one shard. Read and written through [`Table::at`], which fixes the
/// time every expiry is judged against.
#[derive(Debug)]
pub(crate) struct Table<V> {
    /// The key is shared with its expiry record: a check on a live key allocates nothing.
    entries: Map<V>,
    /// One record per entry, due at or before the entry's expiry (an expiry moved later keeps
    /// its record, which is pushed again when due: a hot key does not grow the heap). Records
    /// left by an expiry moved earlier, or by a removed entry, are skipped when popped.
    expiry: BinaryHeap<Reverse<(Duration, Arc<str>)>>,
}

#[derive(Debug)]
struct Entry<V> {
    key: Arc<str>,
    /// The key's hash in [`Map::hasher`], kept so that moving the entry to a larger map
    /// reads neither the key nor the hasher.
    hash: u64,
    value: V,
    expires_at: Duration,
    /// When this entry's live record in `expiry` is due.
    indexed: Duration,
}

/// Entries by key, growing incrementally as Redis's dict does. A full map is not resized in
/// place: hashbrown would rehash and move every entry in the call that fills it, 1.3-2.6 ms
/// of CPU for a shard's 3,584 entries at a million keys on the bench machine (a third of it
/// faulting in the new table's pages, at 3 µs a page). It is replaced by an empty one twice
/// its size, read first, and the old one's entries move over [`MOVE`] buckets per call, so
/// the new table's pages fault in a few at a time too.
#[derive(Debug)]
struct Map<V> {
    /// Seeded per map: keys are user input, and a flood of colliding ones needs the seed.
    hasher: foldhash::fast::RandomState,
    table: HashTable<Entry<V>>,
    draining: Option<Draining<V>>,
}

impl<V> Default for Table<V> {
    fn default() -> Self {
        Table {
            entries: Map {
                hasher: foldhash::fast::RandomState::default(),
                table: HashTable::new(),
                draining: None,
            },
            expiry: BinaryHeap::new(),
        }
    }
}

/// A map's previous table while its entries move to the current one.
#[derive(Debug)]
struct Draining<V> {
    table: HashTable<Entry<V>>,
    /// The next bucket to move.
    next: usize,
}

impl<V> Map<V> {
    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Whether an entry is `key`'s; the hash compared first, as the key's bytes are behind
    /// a pointer, a cache miss away.
    fn is(hash: u64, key: &str) -> impl Fn(&Entry<V>) -> bool + Copy {
        move |entry| entry.hash == hash && *entry.key == *key
    }

    fn get(&self, hash: u64, key: &str) -> Option<&Entry<V>> {
        let is = Self::is(hash, key);
        self.table.find(hash, is).or_else(|| {
            let draining = self.draining.as_ref()?;
            draining.table.find(hash, is)
        })
    }

    fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut Entry<V>> {
        let is = Self::is(hash, key);
        // By index: returning the first table's borrow conditionally does not pass the
        // borrow checker.
        if let Some(index) = self.table.find_bucket_index(hash, is) {
            return self.table.get_bucket_mut(index);
        }
        self.draining.as_mut()?.table.find_mut(hash, is)
    }

    /// Adds an entry whose key is absent.
    fn insert(&mut self, entry: Entry<V>) {
        self.migrate();
        if self.draining.is_none() && self.table.len() == self.table.capacity() {
            let larger = HashTable::with_capacity((self.table.capacity() * 2).max(4));
            let table = std::mem::replace(&mut self.table, larger);
            self.draining = Some(Draining { table, next: 0 });
        }
        // Never full while draining (see `MOVE`); were it so, hashbrown would grow it.
        self.table
            .insert_unique(entry.hash, entry, |entry| entry.hash);
    }

    fn remove(&mut self, hash: u64, key: &str) -> Option<Entry<V>> {
        let is = Self::is(hash, key);
        if let Ok(found) = self.table.find_entry(hash, is) {
            return Some(found.remove().0);
        }
        let found = self.draining.as_mut()?.table.find_entry(hash, is).ok()?;
        Some(found.remove().0)
    }

    /// Moves the entries of up to [`MOVE`] buckets of the draining table, dropping it once
    /// empty.
    fn migrate(&mut self) {
        let Some(draining) = &mut self.draining else {
            return;
        };
        let end = (draining.next + MOVE).min(draining.table.num_buckets());
        for index in draining.next..end {
            if let Ok(found) = draining.table.get_bucket_entry(index) {
                let entry = found.remove().0;
                self.table
                    .insert_unique(entry.hash, entry, |entry| entry.hash);
            }
        }
        draining.next = end;
        if draining.table.is_empty() {
            self.draining = None;
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Entry<V>> {
        let draining = self
            .draining
            .iter()
            .flat_map(|draining| draining.table.iter());
        self.table.iter().chain(draining)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.len()
            + self
                .draining
                .as_ref()
                .map_or(0, |draining| draining.table.len())
    }

    fn is_empty(&self) -> bool {
        self.table.is_empty()
            && self
                .draining
                .as_ref()
                .is_none_or(|draining| draining.table.is_empty())
    }
}

impl<V> Table<V> {
    /// Whether the table holds no entry, live or expired: a reader of an empty table (the
    /// quota overrides, almost always) need neither look its key up nor sweep it.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The table as it stands at `now`, after dropping a few of the entries whose time has
    /// come (`expires_at <= now`; Redis keeps a key through the millisecond of its expiry, so
    /// it may answer for it up to 1 ms longer).
    pub(crate) fn at(&mut self, now: Duration) -> Live<'_, V> {
        self.entries.migrate();
        for _ in 0..SWEEP {
            if self.expiry.peek().is_none_or(|Reverse((at, _))| *at > now) {
                break;
            }
            let Some(Reverse((at, key))) = self.expiry.pop() else {
                break;
            };
            let hash = self.entries.hash(&key);
            match self.entries.get_mut(hash, &key) {
                Some(entry) if entry.expires_at <= now => {
                    self.entries.remove(hash, &key);
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
        let entries = &self.table.entries;
        entries
            .get(entries.hash(key), key)
            .filter(|entry| entry.expires_at > self.now)
    }

    fn live_mut(&mut self, key: &str) -> Option<&mut Entry<V>> {
        let now = self.now;
        let entries = &mut self.table.entries;
        entries
            .get_mut(entries.hash(key), key)
            .filter(|entry| entry.expires_at > now)
    }

    /// Every live key, in no particular order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        let now = self.now;
        self.table
            .entries
            .iter()
            .filter(move |entry| entry.expires_at > now)
            .map(|entry| &*entry.key)
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
        let hash = self.table.entries.hash(key.as_str());
        if let Some(entry) = self.table.entries.get_mut(hash, key.as_str()) {
            entry.value = value;
            Self::move_expiry(&mut self.table.expiry, key, entry, expires_at);
            return;
        }
        let shared: Arc<str> = Arc::from(key.as_str());
        self.table
            .expiry
            .push(Reverse((expires_at, shared.clone())));
        self.table.entries.insert(Entry {
            key: shared,
            hash,
            value,
            expires_at,
            indexed: expires_at,
        });
    }

    /// Moves the expiry of a present entry; false if absent.
    pub(crate) fn set_expiry(&mut self, key: &Key, expires_at: Duration) -> bool {
        let now = self.now;
        let entries = &mut self.table.entries;
        let Some(entry) = entries
            .get_mut(entries.hash(key.as_str()), key.as_str())
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
        let entries = &mut self.table.entries;
        let entry = entries.remove(entries.hash(key.as_str()), key.as_str())?;
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

    #[test]
    fn a_growing_map_moves_a_few_entries_per_call() {
        let mut table = Table::default();
        let mut growths = 0;
        for i in 0..10_000 {
            let map = &table.entries.table;
            let (before, capacity) = (map.len(), map.capacity());
            table.at(at(0)).put(&key(i), i, at(10));
            let map = &table.entries.table;
            if map.capacity() == capacity {
                // `at` and the insertion each move at most `MOVE` buckets' entries.
                assert!(map.len() <= before + 2 * MOVE + 1, "call {i}");
            } else {
                // Grown by a new table, not in place: nothing was moved at once.
                assert_eq!(map.len(), 1, "call {i}");
                assert!(map.capacity() >= 2 * capacity);
                growths += 1;
            }
            if i % 997 == 0 {
                assert!((0..=i).all(|j| table.at(at(1)).get(&key(j)) == Some(&j)));
            }
        }
        assert!(growths >= 10, "{growths} growths");
        assert_eq!(table.entries.len(), 10_000);
    }

    #[test]
    fn entries_of_a_draining_map_are_read_replaced_and_removed() {
        let mut table = Table::default();
        let mut n = 0;
        while table
            .entries
            .draining
            .as_ref()
            .is_none_or(|d| d.table.len() < 100)
        {
            table.at(at(0)).put(&key(n), n, at(10));
            n += 1;
        }
        let draining = table.entries.draining.as_ref().expect("draining");
        let old = |i: &usize| draining.table.iter().any(|e| *e.key == *key(*i).as_str());
        let (a, b) = {
            let mut old_keys = (0..n).filter(old);
            (
                old_keys.next().expect("an old key"),
                old_keys.next().expect("two"),
            )
        };
        let mut live = table.at(at(1));
        assert!((0..n).all(|i| live.get(&key(i)) == Some(&i)));
        live.put(&key(a), 7, at(20));
        assert_eq!(live.get(&key(a)), Some(&7));
        assert_eq!(live.expires_at(&key(a)), Some(at(20)));
        assert_eq!(live.remove(&key(b)), Some(b));
        assert_eq!(live.get(&key(b)), None);
        let mut keys: Vec<_> = live.keys().map(str::to_owned).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), n - 1);
    }
}
