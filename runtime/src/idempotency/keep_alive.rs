//! The renewal of PROCESSING records while their bodies run: one renewal task per handle and
//! runtime, serving every execution in progress.
//!
//! A task rather than a branch of the body's `select!`: a body that blocks its thread (a
//! synchronous driver, a CPU-bound step) would starve a branch polled with it, its record
//! would expire mid-body and a retry would run the intent a second time. The task must be
//! asleep on its timer before a body starts: a task woken or spawned from a worker that then
//! blocks waits in that worker's LIFO slot (which no other worker steals) and wakes no idle
//! worker, and while every other worker sleeps on its condition variable none drives the
//! timers. So it is only ever started from a blocking-pool thread, which puts it in the
//! runtime's shared queue and wakes an idle worker; it runs up to its sleep before the body
//! starts and, idle again, parks on the runtime's driver (free while the body's worker runs),
//! so the timers keep firing. Starving it needs every worker blocked.
//!
//! One task for all executions, not one each: starting a task that way is a hand-off to
//! another thread and back (most of a first execution's client CPU when each had its own).
//! An execution registers its record. If the task sleeps until no later than the record's
//! first renewal (it does whenever another execution of the same expire is in progress, or
//! finished within the last `expire`/3), nothing else happens. Otherwise the task is started,
//! or woken to sleep less, from a blocking-pool thread as above, and the registration waits
//! until it sleeps again. Nothing wakes it from a worker: it keeps the time it went to sleep
//! with, and when that comes it renews what is due and sleeps until the next renewal, or ends
//! when nothing is registered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::{Notify, oneshot};
// Tokio's, so a test on paused Tokio time sees renewals at expire/3 of its clock.
use tokio::time::Instant;
use tracing::Instrument;

use crate::handle::Redguard;
use crate::key::Key;
use crate::lock::Live;

/// A handle's registered records, per runtime (each runtime has its own task: a task
/// lives on one runtime and ends with it).
#[derive(Debug, Default)]
pub(crate) struct KeepAlives {
    runtimes: Mutex<HashMap<tokio::runtime::Id, Wheel>>,
}

/// The records of one runtime, and its task.
#[derive(Debug)]
struct Wheel {
    records: HashMap<u64, Record>,
    next_id: u64,
    /// The task's number, unique in the process (a runtime's next wheel never takes it).
    task: u64,
    /// When the task wakes next (`None`: it is running, or waits for its renewals only).
    wakes_at: Option<Instant>,
    /// Wakes the task to sleep less; notified from a blocking-pool thread only.
    wake: Arc<Notify>,
    /// Registrations waiting for the task to sleep with their first renewal counted.
    waiting: Vec<oneshot::Sender<()>>,
}

#[derive(Debug)]
struct Record {
    handle: Redguard,
    scope: Arc<str>,
    key: Key,
    owner: Arc<str>,
    expire: Duration,
    renewal: Renewal,
    span: tracing::Span,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    Due(Instant),
    /// On its way.
    Sent,
    /// The record is no longer this owner's PROCESSING one.
    Lost,
}

/// How long a task with nothing due sleeps before it looks again.
const IDLE: Duration = Duration::from_secs(60);

/// Task numbers (see [`Wheel::task`]).
static TASKS: AtomicU64 = AtomicU64::new(1);

impl KeepAlives {
    fn lock(&self) -> MutexGuard<'_, HashMap<tokio::runtime::Id, Wheel>> {
        self.runtimes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Renews a record every `expire`/3 until dropped; dropping it unregisters the record (the
/// execution ended, panicked or was dropped): no renewal is sent for it after that.
///
/// Counted in [`Redguard::live_watchdogs`] while registered.
pub(super) struct KeepAlive {
    keep_alives: Arc<KeepAlives>,
    runtime: tokio::runtime::Id,
    id: u64,
    _live: Live,
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        if let Some(wheel) = self.keep_alives.lock().get_mut(&self.runtime) {
            wheel.records.remove(&self.id);
        }
    }
}

/// How a registration gets the task to count its record.
enum Start {
    /// It sleeps until no later than the record's first renewal.
    Asleep,
    Spawn(u64, Arc<Notify>),
    Wake(Arc<Notify>),
}

impl KeepAlive {
    /// Starts renewing `key` for `owner`, whose begin was sent at `sent`; returns once the
    /// renewal task sleeps until no later than the first renewal. Dropped meanwhile, it
    /// leaves nothing renewing.
    pub(super) async fn start(
        handle: &Redguard,
        scope: &str,
        key: &Key,
        owner: &str,
        sent: Instant,
        expire: Duration,
    ) -> KeepAlive {
        let runtime = Handle::current();
        let keep_alives = handle.state().keep_alives.clone();
        // From the begin's send, not its reply: a reply late within the expire would put
        // the first renewal past the record's end (at once if it came after expire/3).
        let first = sent + expire / 3;
        let (asleep, asleep_rx) = oneshot::channel();
        let (keep_alive, start) = {
            let mut runtimes = keep_alives.lock();
            let wheel = runtimes.entry(runtime.id()).or_insert_with(|| Wheel {
                records: HashMap::new(),
                next_id: 0,
                task: 0,
                wakes_at: None,
                wake: Arc::new(Notify::new()),
                waiting: Vec::new(),
            });
            wheel.next_id += 1;
            let id = wheel.next_id;
            wheel.records.insert(
                id,
                Record {
                    handle: handle.clone(),
                    scope: scope.into(),
                    key: key.clone(),
                    owner: owner.into(),
                    expire,
                    renewal: Renewal::Due(first),
                    span: tracing::Span::current(),
                },
            );
            let start = if wheel.task == 0 {
                wheel.task = TASKS.fetch_add(1, Ordering::Relaxed);
                Start::Spawn(wheel.task, wheel.wake.clone())
            } else if wheel.wakes_at.is_some_and(|at| at <= first) {
                Start::Asleep
            } else {
                Start::Wake(wheel.wake.clone())
            };
            if !matches!(start, Start::Asleep) {
                wheel.waiting.push(asleep);
            }
            // Made before any await, so a caller dropped meanwhile unregisters the record.
            let keep_alive = KeepAlive {
                keep_alives: keep_alives.clone(),
                runtime: runtime.id(),
                id,
                _live: Live::new(handle.clone()),
            };
            (keep_alive, start)
        };
        let from_blocking_thread = match start {
            Start::Asleep => return keep_alive,
            Start::Spawn(task, wake) => {
                // Made here, not in the task: dropped unstarted (its runtime shutting down),
                // the task forgets its wheel, and the registrations waiting on it go on.
                let ending = Ending {
                    keep_alives,
                    runtime: runtime.id(),
                    task,
                };
                let serving = serve(ending, wake);
                let runtime = runtime.clone();
                Box::new(move || drop(runtime.spawn(serving))) as Box<dyn FnOnce() + Send>
            }
            Start::Wake(wake) => Box::new(move || wake.notify_one()),
        };
        match runtime.runtime_flavor() {
            // One thread: nothing else runs while the body blocks it anyway.
            RuntimeFlavor::CurrentThread => from_blocking_thread(),
            _ => drop(tokio::task::spawn_blocking(from_blocking_thread)),
        }
        // An error is a task dropped unstarted (its runtime shutting down): nothing to wait
        // for.
        let _ = asleep_rx.await;
        keep_alive
    }
}

/// Forgets a runtime's records when its task is dropped with its runtime.
struct Ending {
    keep_alives: Arc<KeepAlives>,
    runtime: tokio::runtime::Id,
    task: u64,
}

impl Drop for Ending {
    fn drop(&mut self) {
        let mut runtimes = self.keep_alives.lock();
        if runtimes
            .get(&self.runtime)
            .is_some_and(|wheel| wheel.task == self.task)
        {
            runtimes.remove(&self.runtime);
        }
    }
}

/// What a renewal found.
enum Renewed {
    Yes(Instant),
    Lost,
    Failed,
}

/// The renewal task of `runtime`'s records: renews each when due, sleeps until the next.
async fn serve(ending: Ending, wake: Arc<Notify>) {
    let runtime = ending.runtime;
    let mut renewals = FuturesUnordered::new();
    loop {
        let wakes_at = {
            let mut runtimes = ending.keep_alives.lock();
            let Some(wheel) = runtimes.get_mut(&runtime) else {
                return;
            };
            let now = Instant::now();
            for (&id, record) in &mut wheel.records {
                if matches!(record.renewal, Renewal::Due(due) if due <= now) {
                    record.renewal = Renewal::Sent;
                    renewals.push(renew(id, record).instrument(record.span.clone()));
                }
            }
            if wheel.records.is_empty() && renewals.is_empty() {
                // Under the lock: the next registration starts a task of its own.
                runtimes.remove(&runtime);
                return;
            }
            let next = wheel
                .records
                .values()
                .filter_map(|r| match r.renewal {
                    Renewal::Due(due) => Some(due),
                    Renewal::Sent | Renewal::Lost => None,
                })
                .min();
            wheel.wakes_at = next;
            for asleep in wheel.waiting.drain(..) {
                let _ = asleep.send(());
            }
            next
        };
        // With nothing due (only lost records, or renewals on their way), it looks again
        // after a while, so it ends once those are unregistered.
        let sleep = tokio::time::sleep_until(wakes_at.unwrap_or_else(|| Instant::now() + IDLE));
        tokio::select! {
            () = sleep => {}
            () = wake.notified() => {}
            Some((id, renewed)) = renewals.next(), if !renewals.is_empty() => {
                let mut runtimes = ending.keep_alives.lock();
                // A record unregistered meanwhile is not renewed again, whatever came back.
                if let Some(record) = runtimes
                    .get_mut(&runtime)
                    .and_then(|wheel| wheel.records.get_mut(&id))
                {
                    record.renewal = match renewed {
                        Renewed::Yes(next) => Renewal::Due(next),
                        Renewed::Lost => Renewal::Lost,
                        // After a failed call, retry sooner: the record keeps running out.
                        Renewed::Failed => Renewal::Due(
                            Instant::now() + (record.expire / 10).max(Duration::from_millis(50)),
                        ),
                    };
                }
            }
        }
    }
}
/// Renews `record` once (each renewal's expire counts from its own send).
fn renew(id: u64, record: &Record) -> impl Future<Output = (u64, Renewed)> + use<> {
    let (handle, scope, key, owner, expire) = (
        record.handle.clone(),
        record.scope.clone(),
        record.key.clone(),
        record.owner.clone(),
        record.expire,
    );
    async move {
        let sent = Instant::now();
        let renewed = match handle.store().idem_renew(&key, &owner, expire).await {
            Ok(true) => Renewed::Yes(sent + expire / 3),
            Ok(false) => {
                metrics::counter!("redguard_idempotency_lost_total", "scope" => scope.to_string())
                    .increment(1);
                tracing::warn!(guard = "idem", %key, "record expired or was taken over while the body ran; a retry may run the intent again");
                Renewed::Lost
            }
            Err(err) => {
                tracing::warn!(guard = "idem", %key, error = %err, "could not renew the record; retrying");
                Renewed::Failed
            }
        };
        (id, renewed)
    }
}
