//! What a caller asks for: the lock's key, its kind, and how long to wait and hold.
//!
//! The kind is chosen by the builder's methods and carried in its type, so combinations that
//! mean nothing — a fair semaphore, a read lock held at least 10 s, a semaphore re-entered —
//! do not compile; only values (a wait over the maximum) are checked when the lock is taken.

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use super::guard::LockGuard;
use redguard_grammar::lock as grammar;

use super::{DEFAULT_LEASE, DEFAULT_LOCK_SCOPE, DEFAULT_MAX_DEPTH, OnLost, acquire};
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, KeyBody};
use crate::values::{LockKind, Replicas};
use metrics::SharedString;

mod sealed {
    pub trait Sealed {}
}

/// The kind of lock a [`LockBuilder`] takes, in its type: [`Exclusive`] (the default),
/// [`Fair`], [`Semaphore`], [`Read`] or [`Write`].
pub trait Kind: sealed::Sealed + Copy {
    /// The kind as a value.
    fn kind(self) -> LockKind;
}

/// The kinds one task may re-enter, and keep taken for `hold_at_least`.
pub trait Reentrant: Kind {}

/// An exclusive lock: one holder at a time (see [`LockBuilder`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Exclusive;

/// A fair lock (see [`LockBuilder::fair`]).
#[derive(Debug, Clone, Copy)]
pub struct Fair;

/// A semaphore (see [`LockBuilder::permits`]).
#[derive(Debug, Clone, Copy)]
pub struct Semaphore {
    permits: u32,
}

/// A read/write lock in read mode (see [`LockBuilder::read`]).
#[derive(Debug, Clone, Copy)]
pub struct Read;

/// A read/write lock in write mode (see [`LockBuilder::write`]).
#[derive(Debug, Clone, Copy)]
pub struct Write;

macro_rules! kinds {
    ($($kind:ty => |$k:ident| $value:expr),* $(,)?) => {$(
        impl sealed::Sealed for $kind {}
        impl Kind for $kind {
            fn kind(self) -> LockKind {
                let $k = self;
                $value
            }
        }
    )*};
}

kinds! {
    Exclusive => |_k| LockKind::Exclusive,
    Fair => |_k| LockKind::Fair,
    Semaphore => |k| LockKind::Semaphore { permits: k.permits },
    Read => |_k| LockKind::Read,
    Write => |_k| LockKind::Write,
}

impl Reentrant for Exclusive {}
impl Reentrant for Fair {}

/// A kind chosen at run time (see [`LockBuilder::kind`]).
impl sealed::Sealed for LockKind {}

impl Kind for LockKind {
    fn kind(self) -> LockKind {
        self
    }
}

/// How to take one lock. Built by [`lock`](crate::lock()) or [`Redguard::lock`]; finished by
/// [`acquire`](LockBuilder::acquire), [`try_acquire`](LockBuilder::try_acquire) or
/// [`run`](LockBuilder::run). An exclusive lock unless [`fair`](LockBuilder::fair),
/// [`permits`](LockBuilder::permits), [`read`](LockBuilder::read) or
/// [`write`](LockBuilder::write) makes it another kind.
#[derive(Debug)]
#[must_use = "a lock builder does nothing until `.acquire().await` or `.run(..).await`"]
pub struct LockBuilder<K = Exclusive> {
    handle: Option<Redguard>,
    body: Result<KeyBody>,
    settings: Settings,
    kind: K,
}

/// What every kind shares.
#[derive(Debug)]
struct Settings {
    /// Shared, not owned: every metric a lock records carries it as a label, and a clone of a
    /// `String` per label was an allocation per metric per call.
    scope: SharedString,
    wait: Duration,
    lease: Duration,
    skip_if_held: bool,
    hold_at_least: Duration,
    on_lost: OnLost,
    max_depth: u32,
    /// `(count, timeout)` as given, checked with the other values when the lock is taken.
    replicas: Option<(u32, Duration)>,
}

impl LockBuilder<Exclusive> {
    pub(crate) fn new(handle: Option<Redguard>, body: Result<KeyBody>) -> Self {
        LockBuilder {
            handle,
            body,
            settings: Settings {
                scope: SharedString::const_str(DEFAULT_LOCK_SCOPE),
                wait: Duration::ZERO,
                lease: DEFAULT_LEASE,
                skip_if_held: false,
                hold_at_least: Duration::ZERO,
                on_lost: OnLost::Cancel,
                max_depth: DEFAULT_MAX_DEPTH,
                replicas: None,
            },
            kind: Exclusive,
        }
    }

    fn with_kind<N: Kind>(self, kind: N) -> LockBuilder<N> {
        LockBuilder {
            handle: self.handle,
            body: self.body,
            settings: self.settings,
            kind,
        }
    }

    /// The kind chosen at run time (from configuration, say): the same as calling
    /// [`fair`](LockBuilder::fair), [`permits`](LockBuilder::permits), [`read`](LockBuilder::read)
    /// or [`write`](LockBuilder::write), without `hold_at_least` and `max_depth`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use redguard::lock::LockKind;
    /// let rg = redguard::Redguard::memory();
    /// let kind = LockKind::Semaphore { permits: 2 };
    /// let guard = rg.lock("exports").kind(kind).acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn kind(self, kind: LockKind) -> LockBuilder<LockKind> {
        self.with_kind(kind)
    }

    /// Makes this a semaphore: up to `permits` holders at once (at least 1), each leased,
    /// renewed and fenced like a lock (not reentrant; `hold_at_least` does not apply). A
    /// semaphore's key is distinct from the lock of the same name.
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
    pub fn permits(self, permits: u32) -> LockBuilder<Semaphore> {
        self.with_kind(Semaphore { permits })
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
    pub fn read(self) -> LockBuilder<Read> {
        self.with_kind(Read)
    }

    /// Takes the read/write lock of this key in write mode: no readers, one writer. See
    /// [`read`](LockBuilder::read).
    pub fn write(self) -> LockBuilder<Write> {
        self.with_kind(Write)
    }

    /// Makes the lock fair: when it frees up, it goes to the waiter that has waited longest
    /// (across every process), not to whoever asks first. The release hands it over to that
    /// waiter and wakes it alone. Waiters hold their place while they keep retrying (each
    /// attempt renews it for [`FAIR_REGISTRATION`](crate::store::FAIR_REGISTRATION)); one that
    /// gives up or is cancelled leaves the queue. A fair lock lives at its own key, apart from
    /// the non-fair lock of the same name; it is reentrant and fenced like it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let guard = rg.lock("payout").fair().acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn fair(self) -> LockBuilder<Fair> {
        self.with_kind(Fair)
    }
}

impl<K: Reentrant> LockBuilder<K> {
    /// Keep the key taken until at least this long after acquisition, even when the work
    /// finishes sooner, so a job is not run again by an instance whose schedule fires a
    /// little later. At most [`MAX_HOLD_AT_LEAST`](super::MAX_HOLD_AT_LEAST).
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.settings.hold_at_least = hold;
        self
    }

    /// How deep the same task may re-enter the lock (default [`DEFAULT_MAX_DEPTH`]).
    pub fn max_depth(mut self, depth: u32) -> Self {
        self.settings.max_depth = depth.max(1);
        self
    }
}

impl<K: Kind> LockBuilder<K> {
    /// The key's scope: the operation it guards, so equal keys of unrelated operations do
    /// not meet. A `&'static str` or a `String`; default [`DEFAULT_LOCK_SCOPE`] (`#[dist_lock]`
    /// uses the fn's path).
    pub fn scope(mut self, scope: impl Into<Cow<'static, str>>) -> Self {
        self.settings.scope = crate::telemetry::shared(scope.into());
        self
    }

    /// Takes the lock on `handle` instead of the current one.
    pub fn on(mut self, handle: &Redguard) -> Self {
        self.handle = Some(handle.clone());
        self
    }

    /// How long to wait for a held lock, at most [`MAX_WAIT`](super::MAX_WAIT) (default: try once).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.settings.wait = wait;
        self
    }

    /// The lease, [`MIN_LEASE`](super::MIN_LEASE) to [`MAX_LEASE`](super::MAX_LEASE) (default [`DEFAULT_LEASE`]): the key's TTL,
    /// renewed every lease/3 while held; how long a crashed holder blocks the key.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// Return [`Error::LockHeld`] at once when the lock is held, instead of waiting (for
    /// scheduled jobs: "another instance is running it").
    pub fn skip_if_held(mut self) -> Self {
        self.settings.skip_if_held = true;
        self
    }

    /// What [`run`](LockBuilder::run) does when the lock is lost (default [`OnLost::Cancel`]).
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.settings.on_lost = on_lost;
        self
    }

    /// Counts an acquisition only once `count` replicas have it, waiting up to `timeout` for
    /// them (Redis `WAIT`, on the connection and node that took the lock; see
    /// [`Replicas`](crate::store::Replicas)). Without it a master that fails right after granting
    /// the lock can be replaced by a replica that never saw it, and a second holder gets it.
    ///
    /// When fewer confirm in time, the acquisition is released again (acknowledged before this
    /// returns, so a retry right after finds the lock free) and the lock's
    /// [`FailMode`](crate::handle::FailMode) applies as for a store that cannot answer: closed (the
    /// default) is [`Error::Backend`] with
    /// [`BackendError::Unconfirmed`](crate::BackendError::Unconfirmed), open is a degraded
    /// guard. `count` is 1 to 16; `timeout` 1 ms to 10 s and at most half the handle's
    /// [`timeout`](crate::handle::Builder::timeout), so `WAIT` ends before the call's own bound. Nested
    /// entries wait too; a fair lock handed over by the previous holder's release, renewals
    /// and releases do not (a lost renewal shortens the lease, a
    /// lost release frees the lock at the end of the lease). The memory store has no replicas
    /// and counts every acquisition as confirmed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// let rg = redguard::Redguard::memory();
    /// let guard = rg.lock("payout").replicas(1, Duration::from_millis(50)).acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn replicas(mut self, count: u32, timeout: Duration) -> Self {
        self.settings.replicas = Some((count, timeout));
        self
    }

    /// The values no type can rule out.
    fn check(&self) -> Result<()> {
        let s = &self.settings;
        if let Some((count, timeout)) = s.replicas {
            Replicas::new(count, timeout)?;
        }
        grammar::wait(s.wait)
            .and_then(|()| grammar::lease(s.lease))
            .and_then(|()| grammar::hold_at_least(s.hold_at_least))
            .and_then(|()| match self.kind.kind() {
                LockKind::Semaphore { permits } => grammar::permits(permits.into()).map(drop),
                _ => Ok(()),
            })
            .map_err(Error::Config)
    }

    /// Takes the lock, waiting up to `wait` for the current holder to release it.
    ///
    /// Errors: [`Error::LockTimeout`] when it stayed held, [`Error::LockHeld`] with
    /// `skip_if_held`, [`Error::LockTooDeep`] past the reentrancy limit, [`Error::Backend`]
    /// when the store is down and locks fail closed (the default). With locks configured to
    /// fail open, a down store yields a degraded guard ([`LockGuard::is_degraded`]) that
    /// protects nothing.
    ///
    /// Cancelling this future is safe: an acquisition that was in flight is undone, as is one
    /// whose store call failed (it may still run when a stalled store resumes).
    pub async fn acquire(self) -> Result<LockGuard> {
        self.take().await.map(LockGuard::renewing)
    }

    /// [`acquire`](LockBuilder::acquire), its renewal not started yet (for [`run`](LockBuilder::run),
    /// which starts it when it falls due).
    async fn take(self) -> Result<LockGuard> {
        self.check()?;
        crate::handle::need_runtime()?;
        let mut handle = match self.handle {
            Some(handle) => handle,
            None => Redguard::current()?,
        };
        if self.settings.replicas.is_some() {
            handle = handle.for_replicas().await;
        }
        let body = self.body?;
        let kind = self.kind.kind();
        let mut key = handle.key(GuardKind::Lock, &self.settings.scope, &body)?;
        if let Some(suffix) = kind.suffix() {
            key = key.companion(suffix);
        }
        let s = self.settings;
        let spec = acquire::Spec {
            scope: s.scope,
            wait: s.wait,
            lease: s.lease,
            skip_if_held: s.skip_if_held,
            hold_at_least: s.hold_at_least,
            max_depth: s.max_depth,
            kind,
            replicas: s
                .replicas
                .map(|(count, timeout)| Replicas::new(count, timeout))
                .transpose()?,
        };
        acquire::acquire(handle, key, spec).await
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
        self.settings.wait = Duration::ZERO;
        self.settings.skip_if_held = true;
        match self.acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(Error::LockHeld { .. }) => Ok(None),
            Err(other) => Err(other),
        }
    }

    /// Runs `work` under the lock, then releases it. The work sees the fencing token through
    /// [`fence()`](super::fence), and may re-enter the same lock (up to the depth limit).
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
        let on_lost = self.settings.on_lost;
        let guard = self.take().await.map_err(E::from)?;
        guard.run(on_lost, work).await
    }
}
