//! Distributed locks: owned, leased, renewed, fenced, released on every exit path.
//!
//! [`lock`] (or [`Redguard::lock`]) starts a [`LockBuilder`]; [`LockBuilder::acquire`] returns
//! a [`LockGuard`], and [`LockBuilder::run`] runs a future under the lock (what
//! `#[dist_lock]` expands into). While a guard lives, a watchdog task renews its lease every
//! lease/3; the task is aborted with the guard on every path (release, drop, panic,
//! cancellation), and [`live_watchdogs`] counts the ones still alive.
//!
//! Waiting is woken by release notifications (Redis pub/sub on the key's own name, or an
//! in-process channel on the memory store) and falls back to polling, bounded by `wait`.

mod guard;
mod multi;
mod watchdog;

use std::future::Future;
use std::time::{Duration, Instant};

use crate::degrade::Degrade;
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, Key, KeyBody, KeyBuilder};
use crate::store::{LockAcquire, LockWatch};

pub use self::guard::LockGuard;
pub use self::multi::{MultiLockBuilder, MultiLockGuard, lock_all};
pub use self::watchdog::live_watchdogs;

/// Lease when none is given: how long a crashed holder blocks others.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Shortest lease: renewal every lease/3 must fit several store round trips.
pub const MIN_LEASE: Duration = Duration::from_secs(1);
/// Longest lease: a crashed holder must not block a key for longer.
pub const MAX_LEASE: Duration = Duration::from_secs(3600);
/// Longest `wait`: a lock is for short sections; a caller queueing longer is better told no.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// Longest `hold_at_least`.
pub const MAX_HOLD_AT_LEAST: Duration = Duration::from_secs(24 * 3600);
/// How deep one task may re-enter a lock it holds.
pub const DEFAULT_MAX_DEPTH: u32 = 5;
/// Scope of locks taken through [`lock`] when none is given.
pub const DEFAULT_LOCK_SCOPE: &str = "lock";

/// What a holder does when its lock is lost while the guarded work runs (see
/// [`LockBuilder::on_lost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnLost {
    /// Cancel the guarded future and return [`Error::LockLost`] (default).
    #[default]
    Cancel,
    /// Let the work finish and return its result; the loss is logged and counted.
    Continue,
}

/// Per-task context set while a locked future runs: its fencing token, and the locks the task
/// holds (for reentrancy).
#[derive(Debug, Clone)]
pub(crate) struct LockContext {
    fence: u64,
    held: std::sync::Arc<Vec<Level>>,
}

/// A level of a lock the current task holds.
#[derive(Debug, Clone)]
struct Level {
    key: String,
    owner: String,
    /// 1 for the lock itself, n for the n-th nested entry.
    level: u32,
}

tokio::task_local! {
    static CONTEXT: LockContext;
}

/// The fencing token of the innermost lock held by the current task, inside a
/// `#[dist_lock]` fn or [`LockBuilder::run`]; `None` outside, or when the store was down and
/// the lock failed open (no token was issued).
///
/// Pass it to storage that can reject stale writers (`UPDATE … WHERE fence < $token`): a
/// holder paused past its lease then carries a smaller token than the next holder.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// let rg = redguard::Redguard::memory();
/// assert_eq!(redguard::fence(), None);
/// let fence = rg.lock("stock:SK1").run(async { Ok::<_, redguard::Error>(redguard::fence()) }).await?;
/// assert!(fence.is_some());
/// # Ok(()) }
/// ```
pub fn fence() -> Option<u64> {
    CONTEXT
        .try_with(|cx| cx.fence)
        .ok()
        .filter(|fence| *fence > 0)
}

/// A lock key body: a template already rendered ([`KeyBody`], [`KeyBuilder`]) or plain text
/// (`&str`, `String`: `[A-Za-z0-9._@:-]`, validated as template text — render request values
/// with [`KeyBuilder::part`] instead, which also rejects `:`).
pub trait LockKey {
    /// The validated body.
    fn into_key_body(self) -> Result<KeyBody>;
}

impl LockKey for KeyBody {
    fn into_key_body(self) -> Result<KeyBody> {
        Ok(self)
    }
}

impl LockKey for Result<KeyBody> {
    fn into_key_body(self) -> Result<KeyBody> {
        self
    }
}

impl LockKey for KeyBuilder {
    fn into_key_body(self) -> Result<KeyBody> {
        self.finish()
    }
}

impl LockKey for &str {
    fn into_key_body(self) -> Result<KeyBody> {
        KeyBuilder::new().text(self).finish()
    }
}

impl LockKey for String {
    fn into_key_body(self) -> Result<KeyBody> {
        KeyBuilder::new().text(&self).finish()
    }
}

impl LockKey for &String {
    fn into_key_body(self) -> Result<KeyBody> {
        KeyBuilder::new().text(self).finish()
    }
}

/// Starts a lock on the current handle (installed or scoped); see [`LockBuilder`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use std::time::Duration;
/// # redguard::Redguard::memory().scope(async {
/// let sku = "SK-1";
/// let key = redguard::KeyBuilder::new().text("stock:").part("sku", sku);
/// let guard = redguard::lock(key).wait(Duration::from_millis(300)).acquire().await?;
/// // ... the few lines that need exclusion, passing guard.fence() to storage ...
/// guard.release().await?;
/// # Ok(()) }).await }
/// ```
pub fn lock(key: impl LockKey) -> LockBuilder {
    LockBuilder::new(None, key.into_key_body())
}

/// How to take one lock. Built by [`lock`] or [`Redguard::lock`]; finished by
/// [`acquire`](LockBuilder::acquire), [`try_acquire`](LockBuilder::try_acquire) or
/// [`run`](LockBuilder::run).
#[derive(Debug)]
#[must_use = "a lock builder does nothing until `.acquire().await` or `.run(..).await`"]
pub struct LockBuilder {
    handle: Option<Redguard>,
    body: Result<KeyBody>,
    scope: String,
    wait: Duration,
    lease: Duration,
    skip_if_held: bool,
    hold_at_least: Duration,
    on_lost: OnLost,
    max_depth: u32,
    permits: Option<u32>,
    rw: Option<bool>,
    fair: bool,
}

impl LockBuilder {
    pub(crate) fn new(handle: Option<Redguard>, body: Result<KeyBody>) -> Self {
        LockBuilder {
            handle,
            body,
            scope: DEFAULT_LOCK_SCOPE.to_owned(),
            wait: Duration::ZERO,
            lease: DEFAULT_LEASE,
            skip_if_held: false,
            hold_at_least: Duration::ZERO,
            on_lost: OnLost::Cancel,
            max_depth: DEFAULT_MAX_DEPTH,
            permits: None,
            rw: None,
            fair: false,
        }
    }

    /// The key's scope (default [`DEFAULT_LOCK_SCOPE`]; `#[dist_lock]` uses the fn's path).
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = scope.into();
        self
    }

    /// How long to wait for a held lock, at most [`MAX_WAIT`] (default: try once).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The lease, [`MIN_LEASE`] to [`MAX_LEASE`] (default [`DEFAULT_LEASE`]): the key's TTL,
    /// renewed every lease/3 while held; how long a crashed holder blocks the key.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Return [`Error::LockHeld`] at once when the lock is held, instead of waiting (for
    /// scheduled jobs: "another instance is running it").
    pub fn skip_if_held(mut self) -> Self {
        self.skip_if_held = true;
        self
    }

    /// Keep the key taken until at least this long after acquisition, even when the work
    /// finishes sooner, so a job is not run again by an instance whose schedule fires a
    /// little later. At most [`MAX_HOLD_AT_LEAST`].
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = hold;
        self
    }

    /// What [`run`](LockBuilder::run) does when the lock is lost (default [`OnLost::Cancel`]).
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
        self
    }

    /// How deep the same task may re-enter the lock (default [`DEFAULT_MAX_DEPTH`]).
    pub fn max_depth(mut self, depth: u32) -> Self {
        self.max_depth = depth.max(1);
        self
    }

    /// Makes this a semaphore: up to `permits` holders at once, each leased, renewed and
    /// fenced like a lock (not reentrant; `hold_at_least` does not apply). A semaphore's key
    /// is distinct from the lock of the same name.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let a = rg.lock("exports").permits(2).acquire().await?;
    /// let b = rg.lock("exports").permits(2).acquire().await?;
    /// assert!(rg.lock("exports").permits(2).try_acquire().await?.is_none());
    /// a.release().await?;
    /// assert!(rg.lock("exports").permits(2).try_acquire().await?.is_some());
    /// # drop(b); Ok(()) }
    /// ```
    pub fn permits(mut self, permits: u32) -> Self {
        self.permits = Some(permits);
        self
    }

    /// Takes the read/write lock of this key in read mode: many readers at once, no writer.
    /// Read/write locks are not reentrant and live at their own key (not the exclusive lock
    /// of the same name). A writer waiting for readers keeps new readers out, so readers
    /// cannot starve it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let r1 = rg.lock("catalog").read().acquire().await?;
    /// let r2 = rg.lock("catalog").read().acquire().await?;
    /// assert!(rg.lock("catalog").write().try_acquire().await?.is_none());
    /// r1.release().await?;
    /// r2.release().await?;
    /// let w = rg.lock("catalog").write().acquire().await?;
    /// assert!(rg.lock("catalog").read().try_acquire().await?.is_none());
    /// # drop(w); Ok(()) }
    /// ```
    pub fn read(mut self) -> Self {
        self.rw = Some(false);
        self
    }

    /// Takes the read/write lock of this key in write mode: no readers, one writer. See
    /// [`read`](LockBuilder::read).
    pub fn write(mut self) -> Self {
        self.rw = Some(true);
        self
    }

    /// Makes the lock fair: when it frees up, it goes to the waiter that has waited longest
    /// (across every process), not to whoever asks first. The release hands it over to that
    /// waiter and wakes it alone. Waiters hold their place while they keep retrying (each
    /// attempt renews it for [`FAIR_REGISTRATION`](crate::FAIR_REGISTRATION)); one that gives
    /// up or is cancelled leaves the queue. A fair lock lives at its own key, apart from the
    /// non-fair lock of the same name; it is reentrant and fenced like it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let guard = rg.lock("payout").fair().acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    fn check(&self) -> Result<()> {
        let problem = if self.wait > MAX_WAIT {
            format!(
                "lock wait must be at most {MAX_WAIT:?}, got {:?}",
                self.wait
            )
        } else if self.lease < MIN_LEASE || self.lease > MAX_LEASE {
            format!(
                "lock lease must be between {MIN_LEASE:?} and {MAX_LEASE:?}, got {:?}",
                self.lease
            )
        } else if self.hold_at_least > MAX_HOLD_AT_LEAST {
            format!(
                "lock hold_at_least must be at most {MAX_HOLD_AT_LEAST:?}, got {:?}",
                self.hold_at_least
            )
        } else if self.permits == Some(0) {
            "a semaphore needs at least 1 permit".to_owned()
        } else if (self.permits.is_some() || self.rw.is_some()) && !self.hold_at_least.is_zero() {
            "hold_at_least applies to exclusive locks, not semaphores or read/write locks"
                .to_owned()
        } else if self.fair && (self.permits.is_some() || self.rw.is_some()) {
            "a fair lock is exclusive: not a semaphore or a read/write lock".to_owned()
        } else if self.permits.is_some() && self.rw.is_some() {
            "a lock is a semaphore (`permits`) or a read/write lock, not both".to_owned()
        } else {
            return Ok(());
        };
        Err(Error::Config(problem))
    }

    /// Takes the lock, waiting up to `wait` for the current holder to release it.
    ///
    /// Errors: [`Error::LockTimeout`] when it stayed held, [`Error::LockHeld`] with
    /// `skip_if_held`, [`Error::LockTooDeep`] past the reentrancy limit, [`Error::Backend`]
    /// when the store is down and locks fail closed (the default). With locks configured to
    /// fail open, a down store yields a degraded guard ([`LockGuard::is_degraded`]) that
    /// protects nothing.
    ///
    /// Cancelling this future is safe: an acquisition that was in flight is released.
    pub async fn acquire(self) -> Result<LockGuard> {
        self.check()?;
        let handle = match self.handle {
            Some(handle) => handle,
            None => Redguard::current()?,
        };
        let body = self.body?;
        let mut key = handle.key(GuardKind::Lock, &self.scope, &body)?;
        let kind = match (self.permits, self.rw) {
            (Some(permits), _) => {
                key = key.companion("sem");
                Kind::Semaphore(permits)
            }
            (None, Some(write)) => {
                key = key.companion("rw");
                if write { Kind::Write } else { Kind::Read }
            }
            (None, None) if self.fair => {
                key = key.companion("fair");
                Kind::Fair
            }
            (None, None) => Kind::Exclusive,
        };
        let spec = Spec {
            scope: self.scope,
            wait: self.wait,
            lease: self.lease,
            skip_if_held: self.skip_if_held,
            hold_at_least: self.hold_at_least,
            max_depth: self.max_depth,
            kind,
        };
        acquire(handle, key, spec).await
    }

    /// Takes the lock if it is free, without waiting: `None` when someone else holds it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let first = rg.lock("report").try_acquire().await?;
    /// assert!(first.is_some());
    /// assert!(rg.lock("report").try_acquire().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(mut self) -> Result<Option<LockGuard>> {
        self.wait = Duration::ZERO;
        self.skip_if_held = true;
        match self.acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(Error::LockHeld { .. }) => Ok(None),
            Err(other) => Err(other),
        }
    }

    /// Runs `work` under the lock, then releases it. The work sees the fencing token through
    /// [`fence()`], and may re-enter the same lock (up to the depth limit).
    ///
    /// If the lock is lost while the work runs, the work is cancelled and
    /// [`Error::LockLost`] returned ([`OnLost::Cancel`]), or it finishes and the loss is only
    /// reported ([`OnLost::Continue`]). A refusal to lock is returned as `E::from(..)` without
    /// running the work.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let n = rg.lock("counter").run(async { Ok::<_, redguard::Error>(41 + 1) }).await?;
    /// assert_eq!(n, 42);
    /// # Ok(()) }
    /// ```
    pub async fn run<T, E, F>(self, work: F) -> Result<T, E>
    where
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let on_lost = self.on_lost;
        let guard = self.acquire().await.map_err(E::from)?;
        guard.run(on_lost, work).await
    }
}

/// Validated settings of one acquisition.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) scope: String,
    pub(crate) wait: Duration,
    pub(crate) lease: Duration,
    pub(crate) skip_if_held: bool,
    pub(crate) hold_at_least: Duration,
    pub(crate) max_depth: u32,
    pub(crate) kind: Kind,
}

/// An exclusive (reentrant) lock, or a semaphore of N permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Exclusive,
    Semaphore(u32),
    /// The read/write lock at the guard's key, held in read mode.
    Read,
    /// The read/write lock at the guard's key, held in write mode.
    Write,
    /// An exclusive lock handed over in arrival order.
    Fair,
}

impl Kind {
    pub(crate) async fn renew(
        self,
        store: &dyn crate::store::Store,
        key: &Key,
        owner: &str,
        lease: Duration,
    ) -> Result<bool> {
        match self {
            Kind::Exclusive | Kind::Write | Kind::Fair => store.lock_renew(key, owner, lease).await,
            Kind::Semaphore(_) => store.semaphore_renew(key, owner, lease).await,
            Kind::Read => {
                let readers = crate::store::rw_readers(key);
                store.semaphore_renew(&readers, owner, lease).await
            }
        }
    }

    /// Leaves `level` of the lock (and every level above it: leaving a level twice changes
    /// nothing). Semaphores and read/write locks have one level.
    pub(crate) async fn release(
        self,
        store: &dyn crate::store::Store,
        key: &Key,
        owner: &str,
        level: u32,
        keep: Duration,
    ) -> Result<crate::store::LockRelease> {
        match self {
            Kind::Exclusive | Kind::Write => store.lock_release(key, owner, level, keep).await,
            Kind::Fair => store.fair_release(key, owner, level, keep).await,
            Kind::Semaphore(_) => store.semaphore_release(key, owner).await,
            Kind::Read => store.rw_release_read(key, owner).await,
        }
    }

    /// Undoes an acquisition whose outcome is unknown (its future was dropped in flight, or
    /// the store call failed): it may have run, or may still run when a stalled store
    /// resumes. Sent after it on the same connection, so the store applies it after the
    /// acquisition; an acquisition that never happened makes it a no-op. A fair waiter also
    /// gives up its place (passing on a lock it was handed meanwhile).
    pub(crate) async fn undo(
        self,
        store: &dyn crate::store::Store,
        key: &Key,
        owner: &str,
        level: u32,
    ) -> Result<()> {
        match self {
            Kind::Fair if level == 1 => store.fair_leave(key, owner).await,
            _ => self
                .release(store, key, owner, level, Duration::ZERO)
                .await
                .map(drop),
        }
    }
}

/// The owner token to present for `key` and the level to take: the token this task already
/// holds the lock with and the level above its innermost one (a nested acquisition), else a
/// fresh random token at level 1.
fn owner_for(key: &Key) -> (String, u32) {
    let held = CONTEXT
        .try_with(|cx| {
            cx.held
                .iter()
                .rev()
                .find(|held| held.key == key.as_str())
                .map(|held| (held.owner.clone(), held.level + 1))
        })
        .ok()
        .flatten();
    held.unwrap_or_else(|| (uuid::Uuid::new_v4().simple().to_string(), 1))
}

/// Undoes an acquisition whose outcome is unknown, unless disarmed by a definite reply: when
/// dropped armed (the caller's future was dropped in flight, or the store call failed), it
/// spawns [`Kind::undo`].
struct InFlight {
    undo: Option<(Redguard, Key, String, Kind, u32)>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some((handle, key, owner, kind, level)) = self.undo.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(%key, "acquisition abandoned outside a Tokio runtime; its lease will free it");
            return;
        };
        runtime.spawn(async move {
            if let Err(err) = kind.undo(handle.store().as_ref(), &key, &owner, level).await {
                tracing::warn!(%key, error = %err, "could not undo an acquisition whose outcome is unknown; its lease will free it");
            }
        });
    }
}

/// A fair waiter's place in the queue, left when dropped before acquiring.
struct FairPlace {
    release: Option<(Redguard, Key, String)>,
}

impl Drop for FairPlace {
    fn drop(&mut self) {
        let Some((handle, key, owner)) = self.release.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(err) = handle.store().fair_leave(&key, &owner).await {
                    tracing::debug!(%key, error = %err, "fair waiter could not leave; its place lapses");
                }
            });
        }
    }
}

async fn acquire(handle: Redguard, key: Key, spec: Spec) -> Result<LockGuard> {
    let started = Instant::now();
    let deadline = started + spec.wait;
    let (owner, level) = match spec.kind {
        Kind::Exclusive | Kind::Fair => owner_for(&key),
        Kind::Semaphore(_) | Kind::Read | Kind::Write => {
            (uuid::Uuid::new_v4().simple().to_string(), 1)
        }
    };
    if level > spec.max_depth {
        record(&spec.scope, "too_deep", started);
        return Err(Error::LockTooDeep {
            key: key.to_string(),
            depth: level - 1,
        });
    }
    let nested = level > 1;
    let store = handle.store().clone();
    // Subscribed before the first attempt, so a release between a failed attempt and the wait
    // wakes us.
    // A nested entry never waits: the lock is ours already.
    let mut watch = if spec.wait.is_zero() || spec.skip_if_held || nested {
        None
    } else if spec.kind == Kind::Fair {
        Some(store.fair_watch(&key, &owner).await)
    } else {
        Some(store.lock_watch(&key).await)
    };
    // One waiter per key and store in this process asks the store at a time; the others queue
    // here in arrival order. Without it, every release would wake every local waiter into a
    // store round trip that all but one lose.
    // Not for fair locks: the store's queue orders their waiters, all of them, and a release
    // hands the lock to its head alone.
    let _turn = match &watch {
        Some(_) if spec.kind != Kind::Fair => {
            let queue = local_queue(&store, &key);
            match tokio::time::timeout_at(deadline.into(), queue.lock_owned()).await {
                Ok(turn) => Some(turn),
                Err(_) => {
                    record(&spec.scope, "timeout", started);
                    return Err(Error::LockTimeout {
                        key: key.to_string(),
                        waited: started.elapsed(),
                    });
                }
            }
        }
        _ => None,
    };
    // A fair waiter that stops waiting (timeout, error, cancellation) gives up its place, or
    // the waiters behind it would wait for its registration to lapse.
    let mut place = FairPlace {
        release: (spec.kind == Kind::Fair && watch.is_some())
            .then(|| (handle.clone(), key.clone(), owner.clone())),
    };
    // The start of the last attempt: a fair lock handed to us after it is ours from then.
    let mut attempt_at = started;
    loop {
        if let Some(fence) = watch.as_ref().and_then(LockWatch::handed) {
            place.release = None;
            record(&spec.scope, "acquired", started);
            tracing::debug!(%key, fence, "fair lock handed over");
            return Ok(LockGuard::handed(
                handle, key, owner, fence, attempt_at, spec,
            ));
        }
        attempt_at = Instant::now();
        // A nested level is undone by name, so its undo never leaves the outer level.
        let mut in_flight = InFlight {
            undo: Some((handle.clone(), key.clone(), owner.clone(), spec.kind, level)),
        };
        let outcome = match spec.kind {
            Kind::Exclusive => store.lock_acquire(&key, &owner, spec.lease, level).await,
            Kind::Semaphore(permits) => {
                store
                    .semaphore_acquire(&key, &owner, permits, spec.lease)
                    .await
            }
            Kind::Fair => {
                let join = watch.is_some();
                store
                    .fair_acquire(&key, &owner, spec.lease, level, join)
                    .await
            }
            Kind::Read | Kind::Write => {
                let write = spec.kind == Kind::Write;
                let announce = watch.is_some();
                store
                    .rw_acquire(&key, &owner, write, spec.lease, announce)
                    .await
            }
        };
        // Only a reply says what happened; after an error (a timeout above all) the script
        // may have run, or may still run when the store resumes: `in_flight` undoes it.
        if outcome.is_ok() {
            in_flight.undo = None;
        }
        let outcome = outcome.or_degrade(&handle, GuardKind::Lock, "lock_acquire", &key);
        let ttl = match outcome? {
            None => return Ok(LockGuard::degraded(key)),
            Some(LockAcquire::Acquired { fence, depth }) => {
                place.release = None;
                record(&spec.scope, "acquired", started);
                tracing::debug!(%key, fence, depth, "lock acquired");
                return Ok(LockGuard::acquired(
                    handle, key, owner, fence, level, attempt_at, spec,
                ));
            }
            Some(LockAcquire::Lost) => {
                record(&spec.scope, "lost", started);
                return Err(Error::LockLost {
                    key: key.to_string(),
                });
            }
            Some(LockAcquire::Held { ttl }) => ttl,
        };
        if spec.skip_if_held {
            record(&spec.scope, "held", started);
            return Err(Error::LockHeld {
                key: key.to_string(),
            });
        }
        let now = Instant::now();
        if now >= deadline {
            record(&spec.scope, "timeout", started);
            return Err(Error::LockTimeout {
                key: key.to_string(),
                waited: now - started,
            });
        }
        // Polling is the fallback: a holder's lease running out publishes nothing, so wake
        // when it ends at the latest; without a live subscription also poll often.
        let live = watch.as_ref().is_some_and(|w| w.is_live());
        let poll = if live {
            Duration::from_millis(500)
        } else {
            (spec.lease / 10).min(Duration::from_millis(100))
        };
        let nap = poll.min(ttl + Duration::from_millis(1));
        let wake = (now + nap).min(deadline);
        match &mut watch {
            Some(watch) => {
                tokio::select! {
                    () = watch.changed() => {}
                    () = tokio::time::sleep_until(wake.into()) => {}
                }
            }
            None => tokio::time::sleep_until(wake.into()).await,
        }
    }
}

type Queue = std::sync::Arc<tokio::sync::Mutex<()>>;

/// The local queue of `key` on `store`, shared by every task of the process waiting for it.
fn local_queue(store: &std::sync::Arc<dyn crate::store::Store>, key: &Key) -> Queue {
    use std::collections::HashMap;
    use std::sync::{Mutex, PoisonError, Weak};
    type Queues = HashMap<(usize, String), Weak<tokio::sync::Mutex<()>>>;
    static QUEUES: Mutex<Option<Queues>> = Mutex::new(None);
    // The store's address tells stores apart; the Arc held by the caller keeps it stable.
    let id = std::sync::Arc::as_ptr(store).cast::<()>() as usize;
    let mut queues = QUEUES.lock().unwrap_or_else(PoisonError::into_inner);
    let queues = queues.get_or_insert_with(HashMap::new);
    let slot = (id, key.as_str().to_owned());
    if let Some(queue) = queues.get(&slot).and_then(Weak::upgrade) {
        return queue;
    }
    // Queues nobody waits in any more are dropped as new ones are made.
    if queues.len() >= 256 {
        queues.retain(|_, queue| queue.strong_count() > 0);
    }
    let queue = Queue::default();
    queues.insert(slot, std::sync::Arc::downgrade(&queue));
    queue
}

fn record(scope: &str, outcome: &'static str, started: Instant) {
    metrics::counter!(
        "redguard_lock_acquire_total",
        "scope" => scope.to_owned(),
        "outcome" => outcome,
    )
    .increment(1);
    metrics::histogram!("redguard_lock_wait_seconds", "scope" => scope.to_owned())
        .record(started.elapsed().as_secs_f64());
}

/// Runs a locked future with its task context (fence, held locks) in place.
pub(crate) async fn with_context<F: Future>(
    key: &Key,
    owner: &str,
    level: u32,
    fence: u64,
    work: F,
) -> F::Output {
    let mut held: Vec<Level> = CONTEXT
        .try_with(|cx| cx.held.as_ref().clone())
        .unwrap_or_default();
    held.push(Level {
        key: key.as_str().to_owned(),
        owner: owner.to_owned(),
        level,
    });
    let cx = LockContext {
        fence,
        held: std::sync::Arc::new(held),
    };
    CONTEXT.scope(cx, work).await
}

impl Redguard {
    /// Starts a lock on this handle; see [`LockBuilder`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let guard = rg.lock("stock:SK1").acquire().await?;
    /// let again = rg.lock("stock:SK1").acquire().await;
    /// assert!(matches!(again, Err(redguard::Error::LockTimeout { .. })));
    /// drop(guard); // released in the background; `guard.release().await` waits for it
    /// # Ok(()) }
    /// ```
    pub fn lock(&self, key: impl LockKey) -> LockBuilder {
        LockBuilder::new(Some(self.clone()), key.into_key_body())
    }
}
