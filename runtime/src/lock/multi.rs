//! Several locks taken all-or-nothing, without deadlock.

use std::time::Duration;

use tokio::time::Instant;

use std::borrow::Cow;

use super::{DEFAULT_LEASE, DEFAULT_LOCK_SCOPE, LockGuard};
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, IntoKey, KeyBody};

/// Starts an all-or-nothing lock of several keys on the current handle; see
/// [`MultiLockBuilder`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// # redguard::Redguard::memory().scope(async {
/// use std::time::Duration;
/// // An order touching two SKUs locks both, in whatever order they are listed.
/// let guard = redguard::lock::lock_all(["stock:SK2", "stock:SK1"])
///     .wait(Duration::from_millis(300))
///     .acquire()
///     .await?;
/// assert_eq!(guard.fences().len(), 2);
/// guard.release().await?;
/// # Ok(()) }).await }
/// ```
pub fn lock_all<K: IntoKey>(keys: impl IntoIterator<Item = K>) -> MultiLockBuilder {
    MultiLockBuilder::new(None, keys)
}

impl Redguard {
    /// Starts an all-or-nothing lock of several keys on this handle; see [`MultiLockBuilder`].
    pub fn lock_all<K: IntoKey>(&self, keys: impl IntoIterator<Item = K>) -> MultiLockBuilder {
        MultiLockBuilder::new(Some(self.clone()), keys)
    }
}

/// How to take several locks at once: all of them, or none.
///
/// Keys are taken one by one in sorted order of their full key, so two callers locking
/// `{A, B}` and `{B, A}` queue on the same first key instead of each holding one and waiting
/// for the other. When any key stays held past `wait` (shared by all keys), the ones already
/// taken are released and [`Error::LockTimeout`] is returned. Each key is leased, renewed and
/// fenced like a single lock.
#[derive(Debug)]
#[must_use = "a lock builder does nothing until `.acquire().await`"]
pub struct MultiLockBuilder {
    handle: Option<Redguard>,
    bodies: Result<Vec<KeyBody>>,
    scope: String,
    wait: Duration,
    lease: Duration,
}

impl MultiLockBuilder {
    fn new<K: IntoKey>(handle: Option<Redguard>, keys: impl IntoIterator<Item = K>) -> Self {
        MultiLockBuilder {
            handle,
            bodies: keys.into_iter().map(IntoKey::into_key).collect(),
            scope: DEFAULT_LOCK_SCOPE.to_owned(),
            wait: Duration::ZERO,
            lease: DEFAULT_LEASE,
        }
    }

    /// The scope of every key (default [`DEFAULT_LOCK_SCOPE`]).
    pub fn scope(mut self, scope: impl Into<Cow<'static, str>>) -> Self {
        self.scope = scope.into().into_owned();
        self
    }

    /// Takes the locks on `handle` instead of the current one.
    pub fn on(mut self, handle: &Redguard) -> Self {
        self.handle = Some(handle.clone());
        self
    }

    /// How long to wait for all keys together, at most [`MAX_WAIT`](super::MAX_WAIT).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The lease of each key (see [`LockBuilder::lease`](super::LockBuilder::lease)).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Takes every key or none.
    pub async fn acquire(self) -> Result<MultiLockGuard> {
        crate::handle::need_runtime()?;
        let handle = match self.handle {
            Some(handle) => handle,
            None => Redguard::current()?,
        };
        let mut keys = Vec::new();
        for body in self.bodies? {
            keys.push((handle.key(GuardKind::Lock, &self.scope, &body)?, body));
        }
        if keys.is_empty() {
            return Err(Error::Config("lock_all needs at least one key".to_owned()));
        }
        // The global order that makes the set deadlock-free.
        keys.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        keys.dedup_by(|a, b| a.0 == b.0);
        let deadline = Instant::now() + self.wait;
        let mut guards = Vec::with_capacity(keys.len());
        for (_, body) in keys {
            let wait = deadline.saturating_duration_since(Instant::now());
            let taken = handle
                .lock(body)
                .scope(self.scope.clone())
                .wait(wait)
                .lease(self.lease)
                .acquire()
                .await;
            match taken {
                Ok(guard) => guards.push(guard),
                Err(err) => {
                    // Roll back: none of the set stays held.
                    for guard in guards {
                        let _ = guard.release().await;
                    }
                    return Err(err);
                }
            }
        }
        Ok(MultiLockGuard { guards })
    }
}

/// Several held locks; released together by [`release`](MultiLockGuard::release) or on drop.
#[derive(Debug)]
#[must_use = "the locks are released as soon as the guard is dropped"]
pub struct MultiLockGuard {
    guards: Vec<LockGuard>,
}

impl MultiLockGuard {
    /// The fencing token of each key, in sorted key order.
    pub fn fences(&self) -> Vec<u64> {
        self.guards.iter().map(LockGuard::fence).collect()
    }

    /// The guards, in sorted key order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// True once any of the locks was found lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Releases every lock; [`Error::LockLost`] if any was no longer ours (the others are
    /// released regardless).
    pub async fn release(self) -> Result<()> {
        let mut first_error = None;
        // Reverse order of acquisition, as nested locks unwind.
        for guard in self.guards.into_iter().rev() {
            if let Err(err) = guard.release().await {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
