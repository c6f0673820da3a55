//! Store operations of distributed locks, and the release notifications waiters sleep on.
//!
//! A lock is one entry at its key: the owner's token, a reentrancy depth and the fencing token
//! of the acquisition, living as long as the lease. Next to it (same hash tag, so the same
//! Redis Cluster slot) a counter hands out fencing tokens.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::error::Result;
use crate::key::Key;
use crate::values::Replicas;

/// How long the fencing counter of a key outlives its last acquisition.
///
/// Tokens never fall below the store's clock in microseconds (see [`LockOps::lock_acquire`]),
/// so when the counter expires after this long unused, tokens still keep increasing as long
/// as the store's clock does not step back by more than the gap.
pub const FENCE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a writer blocked by readers keeps new readers out after its last attempt. A
/// writer that gives up leaves its announcement to expire.
pub const WRITER_INTENT: Duration = Duration::from_secs(2);

/// How long a fair-lock waiter keeps its place after its last attempt.
pub const FAIR_REGISTRATION: Duration = Duration::from_secs(2);

/// The readers' set of the read/write lock at `key`.
pub fn rw_readers(key: &Key) -> Key {
    key.companion("readers")
}

/// Lock operations of a [`Store`](super::Store).
#[async_trait]
pub trait LockOps {
    /// At `level` 1, takes the lock at `key` for `owner` if it is free (see [`Acquire`] for
    /// the names). At `level` n > 1,
    /// enters the n-th nested level of a lock `owner` already holds: the depth becomes at
    /// least n, so an entry sent twice is still one level, and [`LockAcquire::Lost`] when
    /// `owner` no longer holds it. The lease (the key's TTL) becomes `lease`; a nested entry
    /// only ever extends it.
    ///
    /// An acquisition returns a fencing token greater than every token handed out for this
    /// key before and never below the store's clock in microseconds: the larger of the
    /// counter plus one and the clock. The clock keeps tokens increasing when the counter is
    /// gone (expired after [`FENCE_TTL`] unused, or lost with the last writes in a failover),
    /// as long as the new clock is not behind the old one. A nested entry returns the token of
    /// the acquisition it nests in.
    async fn lock_acquire(&self, acquire: Acquire<'_>) -> Result<LockAcquire>;

    /// Extends the lease of `key` to `lease` from now if `owner` still holds it; false when
    /// the lock is gone or held by someone else (nothing is changed then).
    async fn lock_renew(&self, key: &Key, owner: &str, lease: Duration) -> Result<bool>;

    /// Leaves `level` of the lock if `owner` holds it (see [`Release`] for the names), with
    /// every level above it: the depth
    /// becomes at most `level - 1`, so a release sent twice never leaves an outer level.
    /// Leaving level 1 frees the key, whatever the depth, and notifies waiters, unless `keep`
    /// is non-zero: then the key stays taken (by nobody: no owner can renew or re-enter it)
    /// for `keep` more, which is how `hold_at_least` stops another instance from running a job
    /// again right away. Someone else's lock is never touched.
    async fn lock_release(&self, release: Release<'_>) -> Result<LockRelease>;

    /// Takes one of `permits` slots of the semaphore at `key` for `owner`, leased for
    /// `lease` (each holder has its own lease; expired holders are dropped first). Returns a
    /// fencing token as [`lock_acquire`](LockOps::lock_acquire) does, or `Held` with the time
    /// until the earliest holder's lease ends. Not reentrant.
    async fn semaphore_acquire(&self, acquire: Acquire<'_>, permits: u32) -> Result<LockAcquire>;

    /// Extends `owner`'s lease on its slot; false when the slot is gone.
    async fn semaphore_renew(&self, key: &Key, owner: &str, lease: Duration) -> Result<bool>;

    /// Gives `owner`'s slot back and notifies waiters; `NotOwner` when it had none (a slot
    /// whose lease ran out is lost, as a lock is, whether or not it was dropped yet).
    async fn semaphore_release(&self, key: &Key, owner: &str) -> Result<LockRelease>;

    /// Takes the read/write lock at `key` in write mode (`write`: no readers, no writer) or
    /// read mode (no writer, and no writer waiting: a writer blocked by readers announces
    /// itself for [`WRITER_INTENT`] when it is [`waiting`](Acquire::waiting) — it will retry —
    /// so a stream of readers cannot starve it). Fenced like
    /// [`lock_acquire`](LockOps::lock_acquire); not reentrant. A writer is renewed and
    /// released with [`lock_renew`](LockOps::lock_renew) and
    /// [`lock_release`](LockOps::lock_release) on `key`; a reader is renewed with
    /// [`semaphore_renew`](LockOps::semaphore_renew) on [`rw_readers`].
    async fn rw_acquire(&self, acquire: Acquire<'_>, write: bool) -> Result<LockAcquire>;

    /// Leaves the read/write lock at `key` as reader `owner`, notifying waiters; `NotOwner`
    /// when it was not a reader, or its lease ran out.
    async fn rw_release_read(&self, key: &Key, owner: &str) -> Result<LockRelease>;

    /// Like [`lock_acquire`](LockOps::lock_acquire), but a free lock goes to the waiter that
    /// queued first: a [`waiting`](Acquire::waiting) caller that does not get the lock takes a place in the
    /// queue at `key` (kept for [`FAIR_REGISTRATION`] after each attempt, so a waiter that
    /// vanishes loses its place). At `level` 1, finding itself the owner means the lock was
    /// handed to the caller (see [`fair_release`](LockOps::fair_release)), and it takes it up;
    /// levels above 1 are nested entries, as in `lock_acquire`. Renewed as an exclusive lock.
    async fn fair_acquire(&self, acquire: Acquire<'_>) -> Result<LockAcquire>;

    /// Leaves `level` of the fair lock at `key`, as [`lock_release`](LockOps::lock_release)
    /// does. Freeing it hands it over at once to the first waiter still registered, with a
    /// new fencing token and a TTL of [`FAIR_REGISTRATION`] (the new holder extends it to its
    /// lease), and notifies that waiter alone, with its token (see
    /// [`fair_watch`](LockOps::fair_watch)). A late release that finds the lock already free
    /// hands it over too.
    async fn fair_release(&self, release: Release<'_>) -> Result<LockRelease>;

    /// Gives up `owner`'s place in the fair queue at `key`. If the lock was handed to `owner`
    /// meanwhile, or is free, it is handed to the next waiter.
    async fn fair_leave(&self, key: &Key, owner: &str) -> Result<()>;

    /// A subscription to release notifications of `key`. Take it *before* trying to acquire,
    /// so a release between a failed attempt and the wait is not missed. A release is
    /// announced when an attempt with [`waiting`](Acquire::waiting) found the lock held (a
    /// store may skip announcing releases nobody waits for). Never fails: when
    /// notifications are unavailable the watch says so and waiters poll.
    async fn lock_watch(&self, key: &Key) -> LockWatch;

    /// A subscription to hand-overs of the fair lock `key` to `owner`: it fires when the lock
    /// is handed to `owner`, and [`LockWatch::handed`] then gives the fencing token. Waking
    /// every waiter of a fair lock on each release would have all of them ask the store for
    /// a lock only one may take; the others keep their place by retrying on their own
    /// schedule. Same guarantees as [`lock_watch`](LockOps::lock_watch).
    async fn fair_watch(&self, key: &Key, owner: &str) -> LockWatch;
}

/// Who asks for which lock, for how long: what every acquire operation of [`LockOps`] takes.
#[derive(Debug, Clone, Copy)]
pub struct Acquire<'a> {
    /// The lock's key.
    pub key: &'a Key,
    /// The owner token: random per acquisition, the same for its nested levels.
    pub owner: &'a str,
    /// The lease: the key's TTL from now.
    pub lease: Duration,
    /// 1 for an acquisition, n > 1 for the n-th nested level of a lock `owner` holds
    /// (exclusive and fair locks; the other kinds take 1).
    pub level: u32,
    /// The caller will wait and retry if it does not get the lock: a fair waiter takes a
    /// place in the queue, a writer blocked by readers announces itself, an exclusive
    /// waiter asks for the release to be published (a release nobody waits for is not).
    pub waiting: bool,
    /// Replicas that must have the acquisition before it counts (see [`Replicas`]): one
    /// acquired but not confirmed in time is
    /// [`BackendError::Unconfirmed`](crate::BackendError::Unconfirmed), and the caller
    /// releases it. A store without replicas treats it as confirmed.
    pub replicas: Option<Replicas>,
}

/// Which level of whose lock to leave: what the release operations of [`LockOps`] take.
#[derive(Debug, Clone, Copy)]
pub struct Release<'a> {
    /// The lock's key.
    pub key: &'a Key,
    /// The owner token it was acquired with.
    pub owner: &'a str,
    /// The level left (with every level above it); 1 frees the lock.
    pub level: u32,
    /// How long the key stays taken by nobody after level 1 is left (`hold_at_least`).
    pub keep: Duration,
}

/// What [`LockOps::lock_acquire`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockAcquire {
    /// The caller holds the lock now, `depth` levels deep (1 for an acquisition).
    Acquired {
        /// The fencing token of this acquisition.
        fence: u64,
        /// Nesting depth after this entry.
        depth: u32,
    },
    /// Someone else holds it; their lease ends in `ttl` unless renewed.
    Held {
        /// Time left on the holder's lease.
        ttl: Duration,
    },
    /// A nested entry (level above 1) whose owner no longer holds the lock: its lease ran
    /// out, or it was freed and perhaps taken by another owner. Nothing was changed.
    Lost,
}

/// What [`LockOps::lock_release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockRelease {
    /// The last level was left; the key is free (or kept for `keep`, with no owner).
    Released,
    /// One nested level was left; the caller still holds the lock `depth` levels deep.
    Nested {
        /// Depth left.
        depth: u32,
    },
    /// The caller did not hold the lock (its lease ran out, or the key was deleted and
    /// perhaps taken by another owner). Nothing was changed.
    NotOwner,
}

/// Release notifications of one key: see [`LockOps::lock_watch`].
#[derive(Debug)]
pub struct LockWatch {
    /// The fencing token of a fair lock handed to the waiter; 0 until then (and for other
    /// locks). Every notification marks the channel changed, whatever its value.
    rx: Option<watch::Receiver<u64>>,
    live: bool,
}

impl LockWatch {
    /// A watch that never fires: the waiter polls.
    pub fn polling() -> Self {
        LockWatch {
            rx: None,
            live: false,
        }
    }

    /// True when releases are delivered; false means the waiter relies on polling alone.
    pub fn is_live(&self) -> bool {
        self.live && self.rx.is_some()
    }

    /// The fencing token of the fair lock handed to this waiter, once it was (see
    /// [`LockOps::fair_watch`]).
    pub fn handed(&self) -> Option<u64> {
        self.rx
            .as_ref()
            .map(|rx| *rx.borrow())
            .filter(|fence| *fence > 0)
    }

    /// Resolves at the next release notification after this watch was taken (or after the
    /// previous `changed`); never resolves on a polling-only watch.
    pub async fn changed(&mut self) {
        if let Some(rx) = &mut self.rx
            && rx.changed().await.is_ok()
        {
            return;
        }
        // No channel, or its sender went away (the store was dropped): from now on, poll.
        self.rx = None;
        std::future::pending::<()>().await
    }
}

/// Release notifications fanned out to the waiters of each key, shared by both stores.
///
/// Each key with waiters has a `watch` channel; a waiter's receiver remembers the version it
/// saw, so a release that happens between its subscription and its wait still wakes it. A
/// fair-lock waiter has a channel of its own, which carries the fencing token handed to it.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    keys: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Waiters {
    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        // Each operation is a single map call: a panic elsewhere cannot leave it torn.
        self.keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Subscribes to releases of `key`; `live` says whether releases will be delivered.
    pub(crate) fn watch(&self, key: &str, live: bool) -> LockWatch {
        let mut keys = self.keys();
        // Keys whose waiters all left are dropped here rather than on every notification.
        if keys.len() >= 64 {
            keys.retain(|_, tx| tx.receiver_count() > 0);
        }
        let rx = keys
            .entry(key.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        LockWatch { rx: Some(rx), live }
    }

    /// Subscribes to hand-overs of the fair lock `key` to `owner`.
    pub(crate) fn watch_handed(&self, key: &str, owner: &str, live: bool) -> LockWatch {
        self.watch(&handed(key, owner), live)
    }

    /// Wakes the waiters of `key`.
    pub(crate) fn notify(&self, key: &str) {
        let keys = self.keys();
        if let Some(tx) = keys.get(key) {
            tx.send_modify(|_| ());
        }
    }

    /// Tells `owner` that the fair lock `key` was handed to it with fencing token `fence`.
    pub(crate) fn hand_over(&self, key: &str, owner: &str, fence: u64) {
        let keys = self.keys();
        if let Some(tx) = keys.get(&handed(key, owner)) {
            tx.send_replace(fence);
        }
    }

    /// Wakes every waiter: notifications may have been lost (the subscription dropped).
    pub(crate) fn notify_all(&self) {
        for tx in self.keys().values() {
            tx.send_modify(|_| ());
        }
    }
}

/// The entry of `owner`'s hand-overs at the fair lock `key`: a space is in neither a key nor
/// an owner token, so it cannot be any key's own entry.
fn handed(key: &str, owner: &str) -> String {
    format!("{key} {owner}")
}
