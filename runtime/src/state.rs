//! In-process state a handle keeps beside its store: the local queue of each lock key, the
//! local rate tier's recent rejections, recent denials, and a count of lock renewal tasks.
//!
//! It lives in the handle (not in process globals keyed by the store's address), so two
//! handles never interact and nothing outlives its handle. A handle's twin (the same handle on
//! the connection for replica-confirmed writes) shares it. The guards decide what to do with
//! it; here are only the containers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Instant;

use crate::key::Key;
use crate::values::Decision;

/// Per-handle state; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) lock_queues: LockQueues,
    pub(crate) rejections: Rejections,
    /// Paced rate-limit waiters, queued per set of limit keys, each queue holding when its
    /// next head may first be admitted (`rate/pace.rs`).
    pub(crate) rate_queues: LockQueues<Option<tokio::time::Instant>>,
    /// What the local fallback of `FailMode::Local` admitted (`rate/fallback.rs`).
    pub(crate) fallback: crate::rate::FallbackTable,
    /// Lock renewal tasks alive, and idempotency records kept alive.
    pub(crate) watchdogs: AtomicUsize,
    /// The idempotency records kept alive while their bodies run (`idempotency/keep_alive.rs`).
    pub(crate) keep_alives: Arc<crate::idempotency::KeepAlives>,
    /// The keys rate limits admitted and refused, on their way to the store (`rate/top.rs`).
    pub(crate) tally: crate::rate::Tally,
    /// Rate-limit keys the store recently refused as denied, kept for its outages.
    pub(crate) denials: Denials,
}

/// One async mutex per lock key (or set of rate-limit keys) that local waiters are queued on,
/// holding what a head hands to the next (`T`: nothing for locks, the earliest useful ask for
/// paced rate limits).
#[derive(Debug)]
pub(crate) struct LockQueues<T = ()> {
    queues: Mutex<HashMap<String, Weak<tokio::sync::Mutex<T>>>>,
}

impl<T> Default for LockQueues<T> {
    fn default() -> Self {
        LockQueues {
            queues: Mutex::default(),
        }
    }
}

/// A key's local queue: whoever holds it is the one local waiter asking the store.
pub(crate) type Queue<T = ()> = Arc<tokio::sync::Mutex<T>>;

/// Queues nobody waits in are dropped once this many are kept.
const SWEEP_QUEUES_AT: usize = 256;

impl<T: Default> LockQueues<T> {
    /// The queue of `key`, shared by every task of this handle waiting for it.
    pub(crate) fn queue(&self, key: &Key) -> Queue<T> {
        self.queue_named(key.as_str())
    }

    /// The queue of `name` (a key, or several keys joined), as [`queue`](Self::queue).
    pub(crate) fn queue_named(&self, name: &str) -> Queue<T> {
        let mut queues = lock(&self.queues);
        if let Some(queue) = queues.get(name).and_then(Weak::upgrade) {
            return queue;
        }
        if queues.len() >= SWEEP_QUEUES_AT {
            queues.retain(|_, queue| queue.strong_count() > 0);
        }
        let queue = Queue::default();
        queues.insert(name.to_owned(), Arc::downgrade(&queue));
        queue
    }
}

/// Recent rejections of rate-limit keys by the store: until when, at which cost, and the
/// decision to repeat.
#[derive(Debug, Default)]
pub(crate) struct Rejections {
    table: Mutex<HashMap<String, Rejection>>,
}

/// A key the store refused, and until when that holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rejection {
    pub(crate) until: Instant,
    /// When the store is asked again although `until` is later: a repair (`reset`,
    /// `refund`) on another instance reaches this tier by then.
    pub(crate) recheck: Instant,
    pub(crate) cost: u64,
    pub(crate) decision: Decision,
}

/// Entries kept before expired ones are swept.
const SWEEP_REJECTIONS_AT: usize = 10_000;

impl Rejections {
    pub(crate) fn get(&self, key: &Key) -> Option<Rejection> {
        lock(&self.table).get(key.as_str()).copied()
    }

    pub(crate) fn insert(&self, key: &Key, rejection: Rejection) {
        let mut table = lock(&self.table);
        if table.len() >= SWEEP_REJECTIONS_AT {
            let now = Instant::now();
            table.retain(|_, entry| entry.until > now);
        }
        table.insert(key.as_str().to_owned(), rejection);
    }

    pub(crate) fn remove(&self, key: &Key) {
        lock(&self.table).remove(key.as_str());
    }
}

/// Rate-limit keys the store refused as denied (`Error::Denied`) in the last
/// [`DENIAL_MEMORY`], with the reason: what the guard repeats while the store cannot answer,
/// so an outage does not lift an operator's deny entry. A key the store decides again is
/// dropped (its entry was removed).
#[derive(Debug, Default)]
pub(crate) struct Denials {
    table: Mutex<HashMap<String, (Option<String>, Instant)>>,
    /// Entries held: read without the lock on every decision the store answered.
    held: AtomicUsize,
}

/// How long a denial is repeated through an outage of the store.
pub(crate) const DENIAL_MEMORY: std::time::Duration = std::time::Duration::from_secs(600);

/// Denials kept at most (beyond, the oldest go first).
pub(crate) const MAX_DENIALS: usize = 1024;

impl Denials {
    pub(crate) fn insert(&self, key: &str, reason: Option<String>) {
        let mut table = lock(&self.table);
        let now = Instant::now();
        if table.len() >= MAX_DENIALS && !table.contains_key(key) {
            table.retain(|_, (_, at)| now.duration_since(*at) < DENIAL_MEMORY);
            if table.len() >= MAX_DENIALS
                && let Some(oldest) = table
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| k.clone())
            {
                table.remove(&oldest);
            }
        }
        table.insert(key.to_owned(), (reason, now));
        self.held.store(table.len(), Ordering::Relaxed);
    }

    /// The reason `key` was denied, when it was within [`DENIAL_MEMORY`].
    pub(crate) fn get(&self, key: &Key) -> Option<Option<String>> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let table = lock(&self.table);
        let (reason, at) = table.get(key.as_str())?;
        (at.elapsed() < DENIAL_MEMORY).then(|| reason.clone())
    }

    /// An operator lifted a deny entry through this handle: no key is known denied now.
    pub(crate) fn clear(&self) {
        let mut table = lock(&self.table);
        table.clear();
        self.held.store(0, Ordering::Relaxed);
    }

    /// The store decided `key`: it is not denied now.
    pub(crate) fn forget(&self, key: &Key) {
        if self.held.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut table = lock(&self.table);
        table.remove(key.as_str());
        self.held.store(table.len(), Ordering::Relaxed);
    }
}

/// Every mutation here is a single map operation, so a panic elsewhere while a map was locked
/// cannot have left it torn: a poisoned map is still consistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
