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
use crate::telemetry::Value;
use crate::undo::{Compensate, Undo};
use crate::values::{LockKind, Replicas};

/// Validated settings of one acquisition.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) scope: metrics::SharedString,
    pub(crate) wait: Duration,
    pub(crate) lease: Duration,
    pub(crate) skip_if_held: bool,
    pub(crate) hold_at_least: Duration,
    pub(crate) max_depth: u32,
    pub(crate) kind: LockKind,
    pub(crate) replicas: Option<Replicas>,
}

/// An acquisition whose outcome is unknown (the caller's future was dropped in flight, or the
/// store call failed), undone by [`ops::undo`] unless a definite reply disarms it.
struct Acquisition {
    handle: Redguard,
    key: Key,
    owner: String,
    kind: LockKind,
    level: u32,
}

impl Compensate for Acquisition {
    const ABANDONED: &'static str =
        "lock acquisition abandoned outside a Tokio runtime; its lease will free it";

    async fn undo(self) {
        let store = self.handle.store().as_ref();
        if let Err(err) = ops::undo(self.kind, store, &self.key, &self.owner, self.level).await {
            tracing::warn!(key = %self.key, error = %err, "could not undo an acquisition whose outcome is unknown; its lease will free it");
        }
    }
}

/// Undoes now, by `deadline`, and disarms once the store acknowledged it; still armed (so
/// undone again from `Drop`) if it failed or ran out of time.
async fn undo_by(in_flight: &mut Undo<Acquisition>, deadline: Instant) {
    let Some(a) = in_flight.get() else {
        return;
    };
    let undo = ops::undo(a.kind, a.handle.store().as_ref(), &a.key, &a.owner, a.level);
    match tokio::time::timeout_at(deadline, undo).await {
        Ok(Ok(())) => {
            in_flight.disarm();
        }
        Ok(Err(err)) => {
            tracing::debug!(key = %a.key, error = %err, "could not undo an unconfirmed acquisition; sent again");
        }
        Err(_) => {
            tracing::debug!(key = %a.key, "undoing an unconfirmed acquisition ran out of time; sent again")
        }
    }
}

/// A fair waiter's place in the queue, left unless it acquired.
struct FairPlace {
    handle: Redguard,
    key: Key,
    owner: String,
}

impl Compensate for FairPlace {
    const ABANDONED: &'static str =
        "fair waiter abandoned outside a Tokio runtime; its place lapses";

    async fn undo(self) {
        if let Err(err) = self.handle.store().fair_leave(&self.key, &self.owner).await {
            tracing::debug!(key = %self.key, error = %err, "fair waiter could not leave; its place lapses");
        }
    }
}

pub(super) async fn acquire(handle: Redguard, key: Key, spec: Spec) -> Result<LockGuard> {
    let span = crate::trace::lock(&spec.scope, spec.kind, handle.store().kind().as_str());
    let scope = spec.scope.clone();
    let started = Instant::now();
    let result = acquire_traced(handle, key, spec, started)
        .instrument(span.clone())
        .await;
    // One reading of the clock for the metric and the span: under Tokio's `test-util` clock
    // each reading takes a lock.
    let waited = started.elapsed();
    let done = match &result {
        Ok(guard) if guard.is_degraded() => Ok(None),
        Ok(guard) => Ok(Some(guard.fence())),
        Err(err) => Err(err),
    };
    if let Some(outcome) = outcome(&done) {
        record(&scope, outcome, waited);
    }
    crate::trace::lock_done(&span, waited, done);
    result
}

/// The `outcome` label of `redguard_lock_acquire_total` for an acquisition's result; none
/// for a degraded guard or a store error (counted as backend errors).
fn outcome(done: &Result<Option<u64>, &Error>) -> Option<&'static str> {
    match done {
        Ok(Some(_)) => Some("acquired"),
        Ok(None) => None,
        Err(Error::LockTooDeep { .. }) => Some("too_deep"),
        Err(Error::LockTimeout { .. }) => Some("timeout"),
        Err(Error::LockLost { .. }) => Some("lost"),
        Err(Error::LockHeld { .. }) => Some("held"),
        Err(_) => None,
    }
}

async fn acquire_traced(
    handle: Redguard,
    key: Key,
    spec: Spec,
    started: Instant,
) -> Result<LockGuard> {
    let deadline = started + spec.wait;
    let (owner, level) = if spec.kind.is_reentrant() {
        owner_for(&key)
    } else {
        (new_owner(), 1)
    };
    if level > spec.max_depth {
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
    let mut place = Undo::disarmed();
    if spec.kind == LockKind::Fair && watch.is_some() {
        place.arm(FairPlace {
            handle: handle.clone(),
            key: key.clone(),
            owner: owner.clone(),
        });
    }
    // The start of the last attempt: a fair lock handed to us after it is ours from then.
    let mut attempt_at = started;
    // Without a subscription or a local queue nothing came between `started` and the first
    // attempt: it starts then, and the clock is not read again.
    let mut first_at_start = watch.is_none();
    loop {
        if let Some(fence) = watch.as_ref().and_then(LockWatch::handed) {
            place.disarm();
            tracing::debug!(%key, fence, "fair lock handed over");
            return Ok(LockGuard::handed(
                handle, key, owner, fence, attempt_at, spec,
            ));
        }
        if !std::mem::take(&mut first_at_start) {
            attempt_at = Instant::now();
        }
        // A nested level is undone by name, so its undo never leaves the outer level.
        let mut in_flight = Undo::armed(Acquisition {
            handle: handle.clone(),
            key: key.clone(),
            owner: owner.clone(),
            kind: spec.kind,
            level,
        });
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
            Ok(_) => {
                in_flight.disarm();
            }
            // The lock is ours on the master, but too few replicas have it: undone before the
            // refusal (or the degraded guard) is returned, within the call's bound, so a retry
            // right after it finds the lock free.
            Err(Error::Backend(BackendError::Unconfirmed { .. })) => {
                undo_by(&mut in_flight, attempt_at + handle.timeout()).await;
            }
            Err(_) => {}
        }
        let outcome = outcome.or_degrade(&handle, GuardKind::Lock, "lock_acquire", &key);
        let ttl = match outcome? {
            None => return Ok(LockGuard::degraded(key)),
            Some(LockAcquire::Acquired { fence, depth }) => {
                place.disarm();
                tracing::debug!(%key, fence, depth, "lock acquired");
                return Ok(LockGuard::acquired(
                    handle, key, owner, fence, level, attempt_at, spec,
                ));
            }
            Some(LockAcquire::Lost) => {
                return Err(Error::LockLost {
                    key: key.to_string(),
                });
            }
            Some(LockAcquire::Held { ttl }) => ttl,
        };
        if spec.skip_if_held {
            return Err(Error::LockHeld {
                key: key.to_string(),
            });
        }
        let now = Instant::now();
        if now >= deadline {
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

fn record(scope: &metrics::SharedString, outcome: &'static str, waited: Duration) {
    crate::telemetry::counter(
        "redguard_lock_acquire_total",
        [("scope", scope.into()), ("outcome", Value::Static(outcome))],
    )
    .increment(1);
    crate::telemetry::histogram("redguard_lock_wait_seconds", [("scope", scope.into())])
        .record(waited.as_secs_f64());
}
