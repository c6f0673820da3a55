//! [`Store`] in process memory: the embedded default for a single instance and for users'
//! own tests.
//!
//! Keys are spread over [`SHARDS`] shards, each behind its own mutex, by the hash of their
//! hash tag (the text inside `{}`, as Redis Cluster picks a slot): a guard's companion keys
//! (a lock's fencing counter, a fair lock's queue) share their key's shard, so every
//! operation but a check of several limits takes a single lock. Each guard keeps its entries
//! in its own [`Table`] of the shard (key spaces of the guards never overlap), and implements
//! its operations in its own file here.
//!
//! There are no replicas: a write asked to be confirmed by [`Replicas`](crate::store::Replicas)
//! counts as confirmed, as it is as durable as it will ever be (and code configured for a
//! replicated Redis runs unchanged in its tests).

mod admin;
mod deny;
mod idem;
mod lock;
mod quota;
mod rate;
mod table;
mod token;

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use self::table::Table;
use super::lock::Waiters;
use super::{Store, StoreKind};
use crate::clock::{Clock, SystemClock};
use crate::error::Result;
use crate::key::Key;

/// The in-process [`Store`]. Safe for one instance only: nothing is shared between processes.
///
/// Runs on the system clock, or on a [`ManualClock`](crate::clock::ManualClock) that tests advance:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use std::time::Duration;
/// use redguard::{clock::ManualClock, Redguard};
///
/// let clock = ManualClock::new();
/// let rg = Redguard::memory_builder().clock(clock.clone()).connect().await?;
/// let token = rg.tokens().issue("checkout", Duration::from_secs(60)).await?;
/// clock.advance(Duration::from_secs(61));
/// let expired = rg.tokens().consume("checkout", &token).await;
/// assert!(matches!(expired, Err(redguard::Error::TokenUnknown)));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    tables: Arc<Tables>,
    clock: Arc<dyn Clock>,
}

/// Shards of the store. Many small ones: a shard's maps hold a few thousand entries at a
/// million live keys, so growing one moves little, and callers on other shards never wait.
pub(super) const SHARDS: usize = 256;

struct Tables {
    shards: Box<[Mutex<Shard>]>,
    /// Seeds the shard pick per store: which keys share a shard differs between stores.
    seed: u64,
    lock_waiters: Waiters,
    /// Prefix overrides by state-key prefix (`quota.rs`): locked after a check's shards.
    quota_prefixes: Mutex<quota::Quotas>,
    /// Whether `quota_prefixes` holds an entry (live or expired), so that a check without
    /// one takes no lock shared by every shard.
    has_prefixes: AtomicBool,
    /// Prefix and network deny entries (`deny.rs`), every handle prefix's in one table, by field.
    deny: Mutex<quota::Quotas>,
    /// Whether `deny` holds an entry: a check without one takes no shared lock.
    has_deny: AtomicBool,
}

impl Default for Tables {
    fn default() -> Self {
        Tables {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            seed: RandomState::new().hash_one(SHARDS),
            lock_waiters: Waiters::default(),
            quota_prefixes: Mutex::default(),
            has_prefixes: AtomicBool::new(false),
            deny: Mutex::default(),
            has_deny: AtomicBool::new(false),
        }
    }
}

impl std::fmt::Debug for Tables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tables")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

/// The entries of every guard whose keys hash to one shard.
#[derive(Debug, Default)]
pub(super) struct Shard {
    tokens: Table<token::TokenState>,
    idem: Table<idem::Record>,
    rates: Table<rate::RateState>,
    /// Penalty ends (µs since the epoch) of rate-limit keys under `block`.
    rate_blocks: Table<f64>,
    /// Quota overrides of rate-limit keys (`quota.rs`).
    quotas: quota::Quotas,
    locks: Table<lock::LockState>,
    semaphores: Table<lock::Holders>,
    fair_queues: Table<lock::FairQueue>,
    /// Fencing counters of locks, kept apart so they outlive the locks.
    fences: Table<u64>,
    /// Rate-limit tallies (`rate/top.rs`): key -> calls, per scope, outcome and minute.
    tallies: Table<std::collections::HashMap<String, u64>>,
}

/// A seeded hash of `bytes`, a word at a time: the shard pick needs spread, not the flood
/// resistance of the maps' SipHash (keys aimed at one shard would only make it a larger map).
fn spread(seed: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = seed ^ (bytes.len() as u64).wrapping_mul(K);
    let mut mix = |word: u64| h = (h ^ word).wrapping_mul(K).rotate_left(31);
    // Whole words straight from the bytes, and no copy of the tail (a copy of unknown length
    // is a `memcpy` call).
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        mix(u64::from_le_bytes(word.try_into().expect("8 bytes")));
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        // The tail zero-padded, read little-endian.
        mix(tail
            .iter()
            .rev()
            .fold(0, |word, b| word << 8 | u64::from(*b)));
    }
    // splitmix64's finish: every input bit reaches the low bits the modulo keeps.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// An empty store on `clock`.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self {
            tables: Arc::default(),
            clock: Arc::new(clock),
        }
    }

    /// Which shard holds `key`.
    fn shard_of(&self, key: &Key) -> usize {
        (spread(self.tables.seed, key.hash_tag().as_bytes()) % SHARDS as u64) as usize
    }

    /// Locks shard `index`.
    fn lock_shard(&self, index: usize) -> MutexGuard<'_, Shard> {
        // Every mutation is a single map operation, so a panic elsewhere while the lock was
        // held cannot have left an entry half-written: a poisoned shard is still consistent.
        self.tables.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Locks the shard of `key` (and its companions); returns the time, read once locked so
    /// that time never runs backwards for the callers of one shard.
    fn shard(&self, key: &Key) -> (MutexGuard<'_, Shard>, Duration) {
        let shard = self.lock_shard(self.shard_of(key));
        (shard, self.clock.now())
    }

    /// Number of live entries across all guards; for tests.
    #[cfg(feature = "test-util")]
    pub fn len(&self) -> usize {
        (0..SHARDS)
            .map(|index| {
                let mut shard = self.lock_shard(index);
                let now = self.clock.now();
                shard.tokens.at(now).len()
                    + shard.idem.at(now).len()
                    + shard.rates.at(now).len()
                    + shard.rate_blocks.at(now).len()
                    + shard.quotas.at(now).len()
                    + shard.locks.at(now).len()
                    + shard.semaphores.at(now).len()
                    + shard.fair_queues.at(now).len()
                    + shard.fences.at(now).len()
            })
            .sum()
    }

    /// True when no entry is live.
    #[cfg(feature = "test-util")]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Memory
    }

    async fn time(&self) -> Result<Duration> {
        Ok(self.clock.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn companions_share_their_keys_shard() {
        let store = MemoryStore::new();
        let lock = Key::stored("redguard:lock:{app:order=7}");
        for suffix in ["fence", "queue", "intent", "readers", "block"] {
            let companion = lock.companion(suffix);
            assert_eq!(
                store.shard_of(&companion),
                store.shard_of(&lock),
                "{companion}"
            );
        }
    }

    #[test]
    fn keys_spread_over_every_shard() {
        let store = MemoryStore::new();
        let mut counts = vec![0usize; SHARDS];
        for i in 0..SHARDS * 100 {
            let key = Key::stored(format!(
                "redguard:rate:{{app:ip=10.0.{}.{}}}",
                i / 256,
                i % 256
            ));
            counts[store.shard_of(&key)] += 1;
        }
        // 100 a shard on average: none empty, none holding a crowd.
        let (min, max) = (counts.iter().min(), counts.iter().max());
        assert!(min > Some(&40) && max < Some(&200), "{min:?}..{max:?}");
    }
}
