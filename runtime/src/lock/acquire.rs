//! The acquire loop: try, wait for a release notification (or poll), try again, until the
//! lock is taken or `wait` runs out; and what undoes an acquisition whose outcome is unknown.

use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::context::{new_owner, owner_for};
use super::guard::LockGuard;
use super::ops;
use crate::degrade::Degrade;
use crate::error::{BackendError, Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, Key};
use crate::store::{Acquire, LockAcquire, LockWatch};
use crate::values::{LockKind, Replicas};

/// Validated settings of one acquisition.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) scope: String,
    pub(crate) wait: Duration,
    pub(crate) lease: Duration,
    pub(crate) skip_if_held: bool,
    pub(crate) hold_at_least: Duration,
    pub(crate) max_depth: u32,
    pub(crate) kind: LockKind,
    pub(crate) replicas: Option<Replicas>,
}

/// Undoes an acquisition whose outcome is unknown, unless disarmed by a definite reply: when
/// dropped armed (the caller's future was dropped in flight, or the store call failed), it
/// spawns [`ops::undo`].
struct InFlight {
    undo: Option<(Redguard, Key, String, LockKind, u32)>,
}

impl InFlight {
    /// Undoes now, by `deadline`, and disarms once the store acknowledged it; still armed
    /// (so undone again from `Drop`) if it failed or ran out of time.
    async fn undo_by(&mut self, deadline: Instant) {
        let Some((handle, key, owner, kind, level)) = &self.undo else {
            return;
        };
        let undo = ops::undo(*kind, handle.store().as_ref(), key, owner, *level);
        match tokio::time::timeout_at(deadline, undo).await {
            Ok(Ok(())) => self.undo = None,
            Ok(Err(err)) => {
                tracing::debug!(%key, error = %err, "could not undo an unconfirmed acquisition; sent again");
            }
            Err(_) => {
                tracing::debug!(%key, "undoing an unconfirmed acquisition ran out of time; sent again")
            }
        }
    }
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
            if let Err(err) = ops::undo(kind, handle.store().as_ref(), &key, &owner, level).await {
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

pub(super) async fn acquire(handle: Redguard, key: Key, spec: Spec) -> Result<LockGuard> {
    let span = crate::trace::lock(&spec.scope, spec.kind, handle.store().kind().as_str());
    let started = Instant::now();
    let result = acquire_traced(handle, key, spec)
        .instrument(span.clone())
        .await;
    let done = match &result {
        Ok(guard) if guard.is_degraded() => Ok(None),
        Ok(guard) => Ok(Some(guard.fence())),
        Err(err) => Err(err),
    };
    crate::trace::lock_done(&span, started.elapsed(), done);
    result
}

async fn acquire_traced(handle: Redguard, key: Key, spec: Spec) -> Result<LockGuard> {
    let started = Instant::now();
    let deadline = started + spec.wait;
    let (owner, level) = if spec.kind.is_reentrant() {
        owner_for(&key)
    } else {
        (new_owner(), 1)
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
    } else if spec.kind == LockKind::Fair {
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
        Some(_) if spec.kind != LockKind::Fair => {
            let queue = handle.state().lock_queues.queue(&key);
            match tokio::time::timeout_at(deadline, queue.lock_owned()).await {
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
        release: (spec.kind == LockKind::Fair && watch.is_some())
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
        let acquire = Acquire {
            key: &key,
            owner: &owner,
            lease: spec.lease,
            level,
            waiting: watch.is_some(),
            replicas: spec.replicas,
        };
        let outcome = match spec.kind {
            LockKind::Exclusive => store.lock_acquire(acquire).await,
            LockKind::Semaphore { permits } => store.semaphore_acquire(acquire, permits).await,
            LockKind::Fair => store.fair_acquire(acquire).await,
            LockKind::Read => store.rw_acquire(acquire, false).await,
            LockKind::Write => store.rw_acquire(acquire, true).await,
        };
        // Only a reply says what happened; after an error (a timeout above all) the script
        // may have run, or may still run when the store resumes: `in_flight` undoes it.
        match &outcome {
            Ok(_) => in_flight.undo = None,
            // The lock is ours on the master, but too few replicas have it: undone before the
            // refusal (or the degraded guard) is returned, within the call's bound, so a retry
            // right after it finds the lock free.
            Err(Error::Backend(BackendError::Unconfirmed { .. })) => {
                in_flight.undo_by(attempt_at + handle.timeout()).await;
            }
            Err(_) => {}
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
                    () = tokio::time::sleep_until(wake) => {}
                }
            }
            None => tokio::time::sleep_until(wake).await,
        }
    }
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
