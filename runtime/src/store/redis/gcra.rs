//! GCRA checks of one limit without a penalty (the common rate check) through
//! `rate_gcra.lua`, and their group commit: concurrent checks on one connection are decided
//! by one script call.
//!
//! A check that finds fewer than [`DEPTH`] coalesced calls in flight is sent at once, alone,
//! from its own task (so a lightly loaded connection adds no latency); one that finds them
//! busy waits in a queue, and when a call returns, everything queued meanwhile goes out as
//! the next call. Under load a script call then decides tens of keys, which is what lets one
//! Redis core decide several times more checks per second than one call per check allows.
//! Only on a single node: a Cluster routes by key, and the keys of unrelated callers are in
//! different slots, so there each check is its own call.
//!
//! A coalesced call that Redis answered with an error reply (`LOADING`, `BUSY`, `READONLY`
//! during a failover, …) does not fail its checks: each is sent once more alone, within what
//! is left of its caller's time. Otherwise one transient error would admit up to
//! [`MAX_BATCH`] checks uncounted under fail-open. A call whose reply never came (a timeout,
//! a lost connection) is not sent again: Redis may have run it, and a check is charged at most
//! once (the guide, *Failure behaviour*).

use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

use super::RedisStore;
use super::lua::{Lua, lua};
use crate::error::{BackendError, Error, Result, StoreFailure};
use crate::key::Key;
use crate::store::{RateCheck, RateMode, RateOutcome};
use crate::values::{DENY_SUFFIX, QUOTA_SUFFIX};

lua!(GCRA = "rate_gcra.lua" after "expiry.lua", "quota.lua", "deny.lua");

pub(super) fn scripts() -> Vec<&'static Lua> {
    vec![&GCRA]
}

/// Coalesced script calls in flight at once on a connection: one executes on Redis while
/// the next is on its way, so the server never idles waiting for the client.
const DEPTH: usize = 2;

/// Checks one script call decides at most (bounding the time one call holds Redis: about
/// 3 µs each).
const MAX_BATCH: usize = 128;

/// What the script said about one check: `[allowed, remaining, reset_us, retry_us,
/// override burst, override interval_ns]` at `now_us`, or `None` when `rate_check.lua` must
/// decide it (a state of another interval or format, another type).
type Figures = Option<(i64, [i64; 6])>;

/// One check as the script takes it.
struct Item<'a> {
    key: &'a Key,
    interval_ns: u64,
    burst: u64,
    cost: u64,
}

impl<'a> Item<'a> {
    fn of(check: &RateCheck<'a>) -> Item<'a> {
        Item {
            key: check.key,
            interval_ns: check.limit.rate.interval_ns(),
            burst: check.limit.burst,
            cost: check.limit.cost,
        }
    }
}

/// A check waiting for the next coalesced call.
struct Waiting {
    key: Key,
    interval_ns: u64,
    burst: u64,
    cost: u64,
    reply: oneshot::Sender<Result<Figures>>,
}

/// The queue of one connection's coalesced checks.
#[derive(Default)]
pub(super) struct Coalescer {
    state: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    in_flight: usize,
    waiting: Vec<Waiting>,
}

impl Coalescer {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Up to [`MAX_BATCH`] queued checks, oldest first.
    fn take(queue: &mut Queue) -> Vec<Waiting> {
        let n = queue.waiting.len().min(MAX_BATCH);
        queue.waiting.drain(..n).collect()
    }
}

/// Whether `checks` is one GCRA limit without a penalty: what `rate_gcra.lua` decides.
pub(super) fn eligible(checks: &[RateCheck<'_>], mode: RateMode) -> bool {
    !matches!(mode, RateMode::Reserve(_))
        && matches!(checks, [check] if check.limit.algorithm == crate::values::Algorithm::Gcra
            && check.limit.block.is_zero())
}

impl RedisStore {
    /// Decides `check` (see [`eligible`]) with `rate_gcra.lua`, coalesced with concurrent
    /// checks when `mode` charges and the store is a single node; `None` when the script
    /// left the key to `rate_check.lua`; [`Error::Denied`] for a key on its deny list (in the
    /// same call: nothing read or written).
    pub(super) async fn gcra_check(
        &self,
        check: &RateCheck<'_>,
        mode: RateMode,
    ) -> Result<Option<RateOutcome>> {
        let figures = if mode == RateMode::Peek || self.is_cluster() {
            let (now, mut figures) = self.gcra_call(&[Item::of(check)], mode).await?;
            figures.pop().transpose()?.flatten().map(|d| (now, d))
        } else {
            self.coalesced(check).await?
        };
        figures
            .map(|(now, d)| {
                let reply = [now, d[0], d[1], d[2], d[3], d[4], d[5]];
                super::rate::parse(&reply, std::slice::from_ref(check), check.key)
            })
            .transpose()
    }

    /// `check` charged in the next coalesced call, or alone when one may go out now.
    async fn coalesced(&self, check: &RateCheck<'_>) -> Result<Figures> {
        let item = Item::of(check);
        let waiting = {
            let mut queue = self.gcra.lock();
            if queue.in_flight < DEPTH {
                queue.in_flight += 1;
                None
            } else {
                let (reply, answer) = oneshot::channel();
                queue.waiting.push(Waiting {
                    key: item.key.clone(),
                    interval_ns: item.interval_ns,
                    burst: item.burst,
                    cost: item.cost,
                    reply,
                });
                Some(answer)
            }
        };
        if let Some(answer) = waiting {
            // Bounded like any call: the queue waits for at most one call in flight.
            let deadline = tokio::time::Instant::now() + self.timeout;
            let timed_out = || {
                Error::from(BackendError::Timeout {
                    op: "rate_check",
                    after: self.timeout,
                })
            };
            return match tokio::time::timeout_at(deadline, answer).await {
                Ok(Ok(Err(Error::Backend(BackendError::Failed { source, .. }))))
                    if source.code().is_some() =>
                {
                    let alone = [item];
                    let call = self.gcra_call(&alone, RateMode::Consume);
                    let (now, mut figures) = tokio::time::timeout_at(deadline, call)
                        .await
                        .map_err(|_| timed_out())??;
                    Ok(figures.pop().transpose()?.flatten().map(|d| (now, d)))
                }
                Ok(Ok(figures)) => figures,
                Ok(Err(_)) => Err(dropped()),
                Err(_) => Err(timed_out()),
            };
        }
        // This task holds a slot: whatever queues while it waits goes out when it returns,
        // even if this caller gives up first.
        let _slot = Slot { store: self };
        let (now, mut figures) = self.gcra_call(&[item], RateMode::Consume).await?;
        Ok(figures.pop().transpose()?.flatten().map(|d| (now, d)))
    }

    /// One `rate_gcra.lua` call deciding `items`: Redis's time, and each item's figures.
    async fn gcra_call(
        &self,
        items: &[Item<'_>],
        mode: RateMode,
    ) -> Result<(i64, Vec<Result<Option<[i64; 6]>>>)> {
        let Some(first) = items.first() else {
            return Ok((0, Vec::new()));
        };
        // Off a Cluster, the prefix overrides too (one hash, in another slot on a Cluster,
        // where a check runs alone).
        let prefixes = if self.is_cluster() {
            None
        } else {
            crate::values::prefix_hash(first.key)
        };
        let mut cmd = super::evalsha(
            &GCRA,
            3 * items.len() + 2 * usize::from(prefixes.is_some()),
            1 + 3 * items.len(),
        );
        for item in items {
            cmd.arg(item.key.as_str())
                .arg(item.key.companion(QUOTA_SUFFIX).as_str())
                .arg(item.key.companion(DENY_SUFFIX).as_str());
        }
        if let Some(prefixes) = &prefixes {
            cmd.arg(prefixes.as_str());
            // The pattern deny hash beside the prefix overrides: the same handle prefix, off a
            // Cluster.
            match crate::values::deny_hash(first.key) {
                Some(patterns) => cmd.arg(patterns.as_str()),
                None => cmd.arg(""),
            };
        }
        cmd.arg(if mode == RateMode::Peek { "1" } else { "0" });
        for item in items {
            cmd.arg(item.interval_ns).arg(item.burst).arg(item.cost);
        }
        let reply: String = self
            .run_script("rate_check", &GCRA, cmd, Some(first.key))
            .await?;
        let corrupt = || Error::Corrupt {
            key: first.key.to_string(),
            detail: format!("rate script returned {reply:?}"),
        };
        let (numbers, reasons) = reply.split_once('\n').unwrap_or((&reply, ""));
        let mut reasons = reasons.split('\n');
        let mut numbers = numbers.split(' ').map(str::parse::<i64>);
        let now = numbers.next().and_then(Result::ok).ok_or_else(corrupt)?;
        let mut figures = Vec::with_capacity(items.len());
        for item in items {
            let mut d = [0; 6];
            for v in &mut d {
                *v = numbers.next().and_then(Result::ok).ok_or_else(corrupt)?;
            }
            figures.push(match d[0] {
                -2 => {
                    let reason = reasons.next().ok_or_else(corrupt)?;
                    Err(Error::Denied {
                        key: item.key.to_string(),
                        reason: (!reason.is_empty()).then(|| reason.to_owned()),
                    })
                }
                allowed => Ok((allowed >= 0).then_some(d)),
            });
        }
        if numbers.next().is_some() || reasons.next().is_some_and(|r| !r.is_empty()) {
            return Err(corrupt());
        }
        Ok((now, figures))
    }

    /// Sends queued checks until the queue is empty, then frees the slot.
    async fn drive(self, mut batch: Vec<Waiting>) {
        let mut abandon = Abandon {
            store: &self,
            armed: true,
        };
        loop {
            // A caller that gave up (timed out, dropped) before its check went out is not
            // charged.
            batch.retain(|w| !w.reply.is_closed());
            if !batch.is_empty() {
                let items: Vec<Item<'_>> = batch
                    .iter()
                    .map(|w| Item {
                        key: &w.key,
                        interval_ns: w.interval_ns,
                        burst: w.burst,
                        cost: w.cost,
                    })
                    .collect();
                let result = self.gcra_call(&items, RateMode::Consume).await;
                drop(items);
                match result {
                    Ok((now, figures)) => {
                        for (w, f) in batch.drain(..).zip(figures) {
                            let _ = w.reply.send(f.map(|f| f.map(|d| (now, d))));
                        }
                    }
                    Err(err) => {
                        for w in batch.drain(..) {
                            let _ = w.reply.send(Err(duplicate(&err)));
                        }
                    }
                }
            }
            // The callers just answered run on this thread once this task yields, and most
            // send their next check at once: let them queue for this slot rather than find
            // it free and go out alone, which would halve the next call's batch.
            if self.gcra.lock().waiting.is_empty() {
                tokio::task::yield_now().await;
            }
            let mut queue = self.gcra.lock();
            if queue.waiting.is_empty() {
                queue.in_flight -= 1;
                abandon.armed = false;
                return;
            }
            batch = Coalescer::take(&mut queue);
        }
    }
}

/// A coalescing slot held by a caller's own call: on release, hands what queued meanwhile
/// to a task of its own, or frees the slot.
struct Slot<'a> {
    store: &'a RedisStore,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut queue = self.store.gcra.lock();
        if queue.waiting.is_empty() {
            queue.in_flight -= 1;
            return;
        }
        let batch = Coalescer::take(&mut queue);
        drop(queue);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(self.store.clone().drive(batch));
            }
            Err(_) => {
                // No runtime to send them from (it is shutting down): the waiters fail now.
                let mut queue = self.store.gcra.lock();
                queue.in_flight -= 1;
                queue.waiting.clear();
            }
        }
    }
}

/// Frees a driving task's slot when the task is dropped unfinished (its runtime shut down):
/// the checks still queued fail at once instead of waiting for a call that will not come.
struct Abandon<'a> {
    store: &'a RedisStore,
    armed: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut queue = self.store.gcra.lock();
            queue.in_flight -= 1;
            queue.waiting.clear();
        }
    }
}

/// The error of a coalesced call, for each check it carried.
fn duplicate(err: &Error) -> Error {
    match err {
        Error::Backend(BackendError::Timeout { op, after }) => {
            BackendError::Timeout { op, after: *after }.into()
        }
        Error::Backend(BackendError::Failed { op, source }) => BackendError::Failed {
            op,
            source: source.duplicate(),
        }
        .into(),
        Error::Corrupt { key, detail } => Error::Corrupt {
            key: key.clone(),
            detail: detail.clone(),
        },
        other => BackendError::Failed {
            op: "rate_check",
            source: StoreFailure::new(other.to_string()),
        }
        .into(),
    }
}

/// The call carrying a queued check went away without an answer (its runtime shut down).
fn dropped() -> Error {
    BackendError::Failed {
        op: "rate_check",
        source: StoreFailure::new("the coalesced rate check was dropped before it was sent"),
    }
    .into()
}
