//! [`LockGuard`]: a held lock, its watchdog, and its release on every path.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::acquire::Spec;
use super::context::with_context;
use super::watchdog::{Renewal, Tenure};
use super::{OnLost, ops};
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::Key;
use crate::store::LockRelease;

/// A held lock. Release it with [`release`](LockGuard::release), which reports whether the
/// lock was still ours; dropping it releases it too.
///
/// **Drop guarantee.** Dropping a guard (early return, `?`, panic, the owning future
/// cancelled) stops its watchdog at once and spawns the release on the current Tokio runtime,
/// so the key is normally free within one store round trip. When no runtime is available
/// (dropped outside one, or the runtime is shutting down) or the store is unreachable, the
/// key is freed when its lease runs out. Either way no renewal outlives the guard.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// let rg = redguard::Redguard::memory();
/// let guard = rg.lock("invoice:7").acquire().await?;
/// let token = guard.fence(); // pass to storage that rejects stale writers
/// assert!(token > 0);
/// guard.release().await?;
/// assert!(rg.lock("invoice:7").try_acquire().await?.is_some());
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a lock is released as soon as its guard is dropped"]
pub struct LockGuard {
    key: Key,
    fence: u64,
    held: Option<Held>,
}

#[derive(Debug)]
struct Held {
    handle: Redguard,
    owner: String,
    /// 1 for the lock itself, n for the n-th nested entry: the level this guard releases.
    level: u32,
    /// A release was sent and its reply not awaited (the caller gave up on `release`).
    released: bool,
    acquired_at: Instant,
    spec: Spec,
    lost: watch::Receiver<bool>,
    /// Only the outermost level of a lock renews it.
    renewal: Option<Renewal>,
}

impl LockGuard {
    pub(super) fn acquired(
        handle: Redguard,
        key: Key,
        owner: String,
        fence: u64,
        level: u32,
        acquired_at: Instant,
        spec: Spec,
    ) -> Self {
        // The lease is counted from before the acquiring call was sent, and so are its
        // renewals: counted from the reply, a reply that came late within the lease put the
        // first renewal past the lease's end (at once if the reply came after lease/3).
        let tenure = Tenure {
            acquired_at,
            valid_until: acquired_at + spec.lease,
            renew_at: acquired_at + spec.lease / 3,
        };
        Self::held(handle, key, owner, fence, level, tenure, spec)
    }

    /// A fair lock handed to this waiter by its previous holder, for
    /// [`FAIR_REGISTRATION`](crate::store::FAIR_REGISTRATION) from the hand-over, which came after the
    /// waiter's last attempt at `queued_at`: renewed to the full lease at once.
    pub(super) fn handed(
        handle: Redguard,
        key: Key,
        owner: String,
        fence: u64,
        queued_at: Instant,
        spec: Spec,
    ) -> Self {
        let now = Instant::now();
        let tenure = Tenure {
            acquired_at: now,
            valid_until: queued_at + crate::store::FAIR_REGISTRATION,
            renew_at: now,
        };
        Self::held(handle, key, owner, fence, 1, tenure, spec)
    }

    fn held(
        handle: Redguard,
        key: Key,
        owner: String,
        fence: u64,
        level: u32,
        tenure: Tenure,
        spec: Spec,
    ) -> Self {
        let acquired_at = tenure.acquired_at;
        let (renewal, lost) = if level == 1 {
            let (renewal, lost) = Renewal::new(tenure);
            (Some(renewal), lost)
        } else {
            // A nested level learns of a loss through the outer level, which cancels the
            // whole body; its own receiver never fires.
            (None, watch::channel(false).1)
        };
        LockGuard {
            key,
            fence,
            held: Some(Held {
                handle,
                owner,
                level,
                released: false,
                acquired_at,
                spec,
                lost,
                renewal,
            }),
        }
    }

    /// This guard with its renewal task running: a guard handed to a caller is held while
    /// code we do not drive runs, so its renewal cannot wait to be polled by us.
    pub(super) fn renewing(mut self) -> Self {
        if let Some(held) = self.held.as_mut()
            && let Some(renewal) = held.renewal.take()
        {
            held.renewal = Some(renewal.start(&held.handle, &self.key, &held.owner, &held.spec));
        }
        self
    }

    /// A guard for a lock that failed open (store down, locks configured to fail open): it
    /// protects nothing and has no fencing token.
    pub(super) fn degraded(key: Key) -> Self {
        LockGuard {
            key,
            fence: 0,
            held: None,
        }
    }

    /// The fencing token: greater than that of every earlier acquisition of this key. 0 on a
    /// degraded guard.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The full store key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// True when the store was down and the lock failed open: nothing is locked.
    pub fn is_degraded(&self) -> bool {
        self.held.is_none()
    }

    /// True once the watchdog found the lock lost (lease expired, or the key taken).
    pub fn is_lost(&self) -> bool {
        self.held.as_ref().is_some_and(|held| *held.lost.borrow())
    }

    /// Resolves when the lock is found lost; never, on a degraded or nested guard.
    pub async fn lost(&self) {
        match &self.held {
            Some(held) => {
                let mut lost = held.lost.clone();
                if lost.wait_for(|lost| *lost).await.is_err() {
                    // The watchdog ended without finding a loss: it never will.
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }

    /// Releases the lock (its level, if re-entered: the outer levels stay held).
    /// Err([`Error::LockLost`]) when it was no longer ours (nothing was changed, someone else's
    /// lock was left alone); a store error means the lease will free it. Dropping the future
    /// of this call is safe: the release is sent again as on drop, and a level released twice
    /// is released once.
    pub async fn release(mut self) -> Result<()> {
        let Some(held) = self.held.as_mut() else {
            return Ok(());
        };
        // The watchdog must not renew what we are giving back.
        held.renewal.take();
        held.released = true;
        held.record_hold();
        let keep = held.keep();
        let store = held.handle.store().clone();
        let outcome = ops::release(
            held.spec.kind,
            store.as_ref(),
            &self.key,
            &held.owner,
            held.level,
            keep,
        )
        .await;
        // Done: nothing left for Drop.
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        match outcome {
            Ok(LockRelease::Released | LockRelease::Nested { .. }) => Ok(()),
            Ok(LockRelease::NotOwner) => {
                held.not_owner(&self.key);
                Err(Error::LockLost {
                    key: self.key.to_string(),
                })
            }
            Err(err) => {
                tracing::warn!(key = %self.key, error = %err, "lock release failed; the lease will free it");
                Err(err)
            }
        }
    }

    /// Runs `work` under this guard (see [`LockBuilder::run`](super::LockBuilder::run)),
    /// starting the renewal task when the first renewal is due, if `work` lasts that long.
    pub(crate) async fn run<T, E, F>(mut self, on_lost: OnLost, work: F) -> Result<T, E>
    where
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let Some(held) = self.held.as_mut() else {
            // Failed open: run unprotected, as configured.
            return work.await;
        };
        // Out of the guard while the work runs (which borrows the guard); dropped, so
        // stopped, before the release.
        let mut renewal = held.renewal.take();
        let held = &*held;
        let mut lost = held.lost.clone();
        let output = {
            let work = with_context(&self.key, &held.owner, held.level, self.fence, work);
            tokio::pin!(work);
            let mut watching = on_lost == OnLost::Cancel;
            loop {
                let due = renewal.as_ref().and_then(Renewal::due);
                tokio::select! {
                    biased;
                    seen = lost.wait_for(|lost| *lost), if watching => match seen {
                        Ok(_) => break None,
                        // The renewal ended without finding a loss: it never will.
                        Err(_) => watching = false,
                    },
                    // Before the renewal's timer: a body that finishes at its first poll never
                    // registers one (a timer entry costs about as much as the rest of `run`).
                    output = &mut work => break Some(output),
                    () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                        renewal = renewal
                            .take()
                            .map(|r| r.start(&held.handle, &self.key, &held.owner, &held.spec));
                    }
                }
            }
        };
        drop(renewal);
        let lost_while_running = self.is_lost();
        let key = self.key.to_string();
        let released = self.release().await;
        let Some(output) = output else {
            // The work was cancelled when the watchdog found the lock lost.
            return Err(E::from(Error::LockLost { key }));
        };
        match (released, on_lost) {
            (Err(Error::LockLost { .. }), OnLost::Cancel) => Err(E::from(Error::LockLost { key })),
            _ if lost_while_running && on_lost == OnLost::Cancel => {
                Err(E::from(Error::LockLost { key }))
            }
            _ => output,
        }
    }
}

impl Held {
    /// How long the key must stay taken after release, for `hold_at_least`.
    fn keep(&self) -> Duration {
        if self.level > 1 || !self.spec.kind.is_reentrant() || self.spec.hold_at_least.is_zero() {
            return Duration::ZERO;
        }
        self.spec
            .hold_at_least
            .saturating_sub(self.acquired_at.elapsed())
    }

    fn record_hold(&self) {
        crate::telemetry::histogram(
            "redguard_lock_held_seconds",
            [("scope", (&self.spec.scope).into())],
        )
        .record(self.acquired_at.elapsed().as_secs_f64());
    }

    fn not_owner(&self, key: &Key) {
        metrics::counter!(
            "redguard_lock_release_not_owner_total",
            "scope" => self.spec.scope.clone(),
        )
        .increment(1);
        if *self.lost.borrow() {
            tracing::debug!(%key, "released a lock already known lost");
        } else {
            tracing::warn!(%key, "released a lock that was no longer ours; nothing was changed");
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(mut held) = self.held.take() else {
            return;
        };
        held.renewal.take();
        if !held.released {
            held.record_hold();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(key = %self.key, "lock dropped outside a Tokio runtime; its lease will free it");
            return;
        };
        let key = self.key.clone();
        runtime.spawn(async move {
            let keep = held.keep();
            let store = held.handle.store().clone();
            let released = ops::release(
                held.spec.kind,
                store.as_ref(),
                &key,
                &held.owner,
                held.level,
                keep,
            )
            .await;
            match released {
                // The release the caller gave up on went through first: nothing to report.
                Ok(LockRelease::NotOwner) if held.released => {}
                Ok(LockRelease::NotOwner) => held.not_owner(&key),
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(%key, error = %err, "lock release failed; the lease will free it")
                }
            }
        });
    }
}
