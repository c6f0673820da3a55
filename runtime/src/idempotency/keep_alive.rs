//! The renewal of a PROCESSING record while its body runs.
//!
//! A task of its own rather than a branch of the body's `select!`: a body that blocks its
//! thread (a synchronous driver, a CPU-bound step) would starve a branch polled with it, its
//! record would expire mid-body and a retry would run the intent a second time. Spawning it
//! is not enough on a multi-thread runtime: spawned from the worker that then blocks, it
//! waits in that worker's LIFO slot (which no other worker steals) and wakes no idle worker,
//! and while every other worker sleeps on its condition variable none drives the timers, so
//! its first renewal never comes. It is spawned from a blocking-pool thread instead: that
//! puts it in the runtime's shared queue and wakes an idle worker, which runs it up to its
//! first sleep before the body starts and, idle again, parks on the runtime's driver (free
//! while the body's worker runs), so the timers keep firing. Starving it needs every worker
//! blocked.

use std::time::Duration;

use tokio::runtime::RuntimeFlavor;
use tokio::sync::oneshot;
// Tokio's, so a test on paused Tokio time sees renewals at expire/3 of its clock.
use tokio::time::Instant;
use tracing::Instrument;

use crate::handle::Redguard;
use crate::key::Key;
use crate::lock::Live;

/// Renews a record every `expire`/3 until dropped; dropping it ends the task (the execution
/// ended, panicked or was dropped) on the runtime's next turn.
///
/// Counted in [`Redguard::live_watchdogs`] by this value rather than by the task: dropped,
/// the renewals stop there and then, whenever a loaded machine gets round to the task (the
/// blocking-pool thread that spawns it may not even have run), which at its next poll ends
/// without a call.
pub(super) struct KeepAlive {
    _stop: oneshot::Sender<std::convert::Infallible>,
    _live: Live,
}

impl KeepAlive {
    /// Starts renewing `key` for `owner`, whose begin was sent at `sent`; returns once the
    /// task has run up to its first sleep. Dropped meanwhile, it leaves nothing renewing.
    pub(super) async fn start(
        handle: &Redguard,
        scope: &str,
        key: &Key,
        owner: &str,
        sent: Instant,
        expire: Duration,
    ) -> KeepAlive {
        let (stop, stopped) = oneshot::channel();
        let (armed, armed_rx) = oneshot::channel();
        // Made before the await, so a caller dropped meanwhile stops the task.
        let keep_alive = KeepAlive {
            _stop: stop,
            _live: Live::new(handle.clone()),
        };
        let (handle, scope, key, owner) = (
            handle.clone(),
            scope.to_owned(),
            key.clone(),
            owner.to_owned(),
        );
        let task = async move {
            // From the begin's send, not its reply: a reply late within the expire would put
            // the first renewal past the record's end (at once if it came after expire/3).
            let first = sent + expire / 3;
            let _ = armed.send(());
            // Stopped first: a task that runs after its execution ended (or was dropped while
            // it started) must not renew a record finished, undone or begun anew meanwhile.
            tokio::select! {
                biased;
                _ = stopped => {}
                () = renew(&handle, &scope, &key, &owner, expire, first) => {}
            }
        }
        .in_current_span();
        let runtime = tokio::runtime::Handle::current();
        match runtime.runtime_flavor() {
            // One thread: nothing else runs while the body blocks it anyway.
            RuntimeFlavor::CurrentThread => drop(runtime.spawn(task)),
            _ => drop(tokio::task::spawn_blocking(move || {
                drop(runtime.spawn(task))
            })),
        }
        // An error is a task dropped unstarted (its runtime shutting down): nothing to wait for.
        let _ = armed_rx.await;
        keep_alive
    }
}

/// Returns when the record is no longer `owner`'s PROCESSING one.
async fn renew(
    handle: &Redguard,
    scope: &str,
    key: &Key,
    owner: &str,
    expire: Duration,
    first: Instant,
) {
    let period = expire / 3;
    // After a failed call, retry sooner: the record keeps running out meanwhile.
    let retry = (expire / 10).max(Duration::from_millis(50));
    let mut next = first;
    loop {
        tokio::time::sleep_until(next).await;
        // Each renewal's expire counts from its own send.
        let sent = Instant::now();
        match handle.store().idem_renew(key, owner, expire).await {
            Ok(true) => next = sent + period,
            Ok(false) => {
                metrics::counter!("redguard_idempotency_lost_total", "scope" => scope.to_owned())
                    .increment(1);
                tracing::warn!(guard = "idem", %key, "record expired or was taken over while the body ran; a retry may run the intent again");
                return;
            }
            Err(err) => {
                tracing::warn!(guard = "idem", %key, error = %err, "could not renew the record; retrying");
                next = Instant::now() + retry;
            }
        }
    }
}
