//! The renewal task of a held lock.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::acquire::Spec;
use super::ops;
use crate::handle::Redguard;
use crate::key::Key;

impl Redguard {
    /// Renewals of this handle alive right now: a task per lock, and each idempotency
    /// record kept alive (one per execution with a record, from its start to its end; one
    /// task per handle and runtime serves them all). A held lock has one from its first
    /// renewal on (at once for a guard from `acquire`; a section run by `LockBuilder::run`
    /// starts it only if it outlives a third of its lease); it ends with its guard, so this
    /// returns to its previous value shortly after every guard is gone (the task is dropped
    /// on the runtime's next turn). For tests and diagnostics: per handle,
    /// so tests running side by side in one process do not see each other's locks.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let guard = rg.lock("job").acquire().await?;
    /// assert_eq!(rg.live_watchdogs(), 1);
    /// guard.release().await?;
    /// tokio::task::yield_now().await;
    /// assert_eq!(rg.live_watchdogs(), 0);
    /// # Ok(()) }
    /// ```
    pub fn live_watchdogs(&self) -> usize {
        self.state().watchdogs.load(Ordering::SeqCst)
    }
}

/// Counts a task of `handle` from spawn until its future is dropped (finished or aborted).
pub(crate) struct Live {
    handle: Redguard,
}

impl Live {
    pub(crate) fn new(handle: Redguard) -> Self {
        handle.state().watchdogs.fetch_add(1, Ordering::SeqCst);
        Live { handle }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.handle.state().watchdogs.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a new holder knows of its lease.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tenure {
    /// When the lock became ours, for `hold_at_least`.
    pub(super) acquired_at: Instant,
    /// Until when the lock is surely ours without a renewal.
    pub(super) valid_until: Instant,
    /// The first renewal.
    pub(super) renew_at: Instant,
}

/// The renewal of a held lock's lease: pending until its first renewal is due, then a task of
/// its own. A section run by [`LockBuilder::run`](super::LockBuilder::run) that ends sooner
/// (most do: the first renewal is due after a third of the lease) never starts a task; a guard
/// from `acquire` starts it at once, since nothing of ours runs while its holder works.
#[derive(Debug)]
pub(super) enum Renewal {
    Pending {
        lost: watch::Sender<bool>,
        tenure: Tenure,
    },
    /// Aborted when dropped.
    Running { _task: Watchdog },
}

impl Renewal {
    /// The renewal of a lock held from `tenure`, and the receiver that turns true when the
    /// lock is lost: renewal found another owner or none, or no renewal succeeded while the
    /// lock was surely ours (the store unreachable: we cannot know we still hold it).
    pub(super) fn new(tenure: Tenure) -> (Renewal, watch::Receiver<bool>) {
        // An acquisition answered after its lease ran out (a call timeout longer than the
        // lease, a slow network) may hand over a key that is someone else's by now: lost
        // from the start, so `run` never starts the body.
        let (lost, lost_rx) = watch::channel(Instant::now() >= tenure.valid_until);
        (Renewal::Pending { lost, tenure }, lost_rx)
    }

    /// When the task must start: the first renewal; `None` once it runs.
    pub(super) fn due(&self) -> Option<Instant> {
        match self {
            Renewal::Pending { tenure, .. } => Some(tenure.renew_at),
            Renewal::Running { .. } => None,
        }
    }

    /// Starts renewing `key` for `owner` every lease/3 from the first renewal (at once if that
    /// is past).
    pub(super) fn start(self, handle: &Redguard, key: &Key, owner: &str, spec: &Spec) -> Self {
        let Renewal::Pending { lost, tenure } = self else {
            return self;
        };
        let handle = handle.clone();
        let (key, owner, spec) = (key.clone(), owner.to_owned(), spec.clone());
        let live = Live::new(handle.clone());
        let task = tokio::spawn(async move {
            let _live = live;
            renew_until_lost(&handle, &key, &owner, &spec, tenure).await;
            lost.send_replace(true);
            metrics::counter!("redguard_lock_lost_total", "scope" => spec.scope.clone())
                .increment(1);
        });
        Renewal::Running {
            _task: Watchdog { task },
        }
    }
}

/// Owns the renewal task; dropping it aborts the task.
#[derive(Debug)]
pub(super) struct Watchdog {
    task: JoinHandle<()>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Returns when the lock is lost.
async fn renew_until_lost(handle: &Redguard, key: &Key, owner: &str, spec: &Spec, tenure: Tenure) {
    let period = spec.lease / 3;
    // After a failed call, retry sooner: the lease keeps running out meanwhile.
    let retry = (spec.lease / 10).max(Duration::from_millis(50));
    let mut valid_until = tenure.valid_until;
    let mut next = tenure.renew_at;
    loop {
        tokio::time::sleep_until(next).await;
        let sent_at = Instant::now();
        if sent_at >= valid_until {
            tracing::warn!(%key, "lock lease ran out before it could be renewed; lock lost");
            return;
        }
        let renewed = ops::renew(spec.kind, handle.store().as_ref(), key, owner, spec.lease).await;
        let outcome = match &renewed {
            Ok(true) => "renewed",
            Ok(false) => "lost",
            Err(_) => "error",
        };
        metrics::counter!(
            "redguard_lock_renewals_total",
            "scope" => spec.scope.clone(),
            "outcome" => outcome,
        )
        .increment(1);
        match renewed {
            Ok(true) => {
                valid_until = sent_at + spec.lease;
                next = sent_at + period;
            }
            Ok(false) => {
                tracing::warn!(%key, "lock lost: renewal found it expired or taken by another owner");
                return;
            }
            Err(err) => {
                // Another attempt must be able to complete before the lease ends; if it
                // cannot, stop now rather than run on past the lease unknowingly.
                let retry_at = Instant::now() + retry;
                if retry_at + handle.timeout() >= valid_until {
                    tracing::warn!(%key, error = %err, "lock renewal failed and the lease is running out; lock lost");
                    return;
                }
                tracing::warn!(%key, error = %err, "lock renewal failed; retrying");
                next = retry_at;
            }
        }
    }
}
