//! Pacing for calls that may wait ([`Limiter::wait`](super::Limiter::wait)): a call waits
//! until the limits admit it or its wait runs out.
//!
//! **One GCRA limit** (the common case, and README's example): the call reserves its slot.
//! The store admits it now if its next free slot is within the call's wait
//! ([`RateMode::Reserve`]), charging it as a call arriving at that slot, and the call sleeps
//! until then; a slot beyond the wait is refused at once, with the store's `retry_after`. The
//! schedule is the store's: slot k is `k × interval` after the first, in the store's clock,
//! whenever its caller asked, so a call's lateness (a round trip, the timer's rounding, a
//! loaded machine) is its own and never moves the slots behind it. The store sees one call
//! per admission. A call runs at its slot plus the reply's one-way latency plus the timer's
//! rounding (never before it: the sleep starts when the reply arrives, after the store
//! decided). Slots go in the order the store receives the calls. A caller dropped while it
//! sleeps on its slot gives it up: the slot is not given to another (which could admit two
//! in one interval), so the limit admits one call fewer; a reservation whose reply never
//! came (a timeout) is the same.
//!
//! **Other algorithms and several limits**: within one handle, the callers of one set of
//! limit keys queue on one async mutex (FIFO, [`crate::state::LockQueues`]). Only the head
//! asks the store; when refused with a `retry_after` its wait still covers, it sleeps
//! exactly that and asks again, and on admission hands the queue to the next. No jitter:
//! one head per instance cannot stampede. So 1,000 waiters on one key hold one timer each
//! (their deadline, while queued; the head's sleep once it leads), and the store sees one
//! call per admission plus bounded retries, never a stampede. When every limit of the call
//! is GCRA, an admission says exactly when the next unit frees, and the head leaves that
//! instant in the queue for the next, which sleeps until then instead of asking to be
//! refused; each admission is then late by the round trip and the timer's rounding, and on
//! a burst of 1 that lateness adds up along the queue. Other algorithms' next head asks at
//! once, so a saturated limit costs about one refused call per admission. Nothing is
//! admitted that the store would not admit at that moment.
//!
//! A queued caller that is dropped leaves the queue and has reserved nothing. A caller whose
//! wait runs out while queued asks the store once more (it is admitted if the limit admits
//! it now, refused with the store's decision otherwise), so a refusal always carries a real
//! `retry_after`.

use std::time::Duration;

use tokio::time::Instant;

use super::decide::{Resolved, decide, most_restrictive};
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::store::RateMode;
use crate::values::{Algorithm, Decision};

/// The shortest sleep between two asks of one head: a `retry_after` of zero from a refusal
/// (a rounding edge) never makes the head spin, so retries are bounded by `wait / MIN_PAUSE`.
const MIN_PAUSE: Duration = Duration::from_millis(1);

/// Decides `limits`, waiting in this handle's queue for their keys as long as `waits` (one
/// per limit) allow: each refusing limit must still be able to admit within its own wait.
pub(super) async fn paced(
    handle: &Redguard,
    limits: &[Resolved<'_>],
    waits: &[Duration],
) -> Result<Vec<Decision>> {
    // The memory store's checks need no runtime; waiting for one does.
    crate::handle::need_runtime()?;
    if let ([limit], [wait]) = (limits, waits)
        && reservable(limit)
    {
        return reserved(handle, limits, *wait).await;
    }
    let start = Instant::now();
    let deadlines: Vec<Instant> = waits.iter().map(|wait| start + *wait).collect();
    let last = deadlines.iter().copied().max().unwrap_or(start);
    let queue = handle.state().rate_queues.queue_named(&queue_name(limits));
    // Out of time while queued: one last ask (below), and no more waiting.
    let mut turn = tokio::time::timeout_at(last, queue.lock()).await.ok();
    // The previous head's admission said when the limits could next admit: asking earlier
    // would only be refused. Past our deadline, ask now for a real refusal.
    if let Some(not_before) = turn.as_deref().copied().flatten()
        && not_before <= last
    {
        tokio::time::sleep_until(not_before).await;
    }
    loop {
        let decisions = decide(handle, limits, RateMode::Consume).await?;
        let Some(rejected) = most_restrictive(&decisions) else {
            if let Some(next) = turn.as_deref_mut() {
                *next = next_admission(limits, &decisions);
            }
            return Ok(decisions);
        };
        let now = Instant::now();
        let pause = rejected.retry_after.max(MIN_PAUSE);
        let fits = decisions
            .iter()
            .zip(&deadlines)
            .all(|(d, deadline)| d.allowed || now + d.retry_after.max(MIN_PAUSE) <= *deadline);
        if turn.is_none() || !fits {
            return Err(Error::RateLimited(rejected));
        }
        tokio::time::sleep_until(now + pause).await;
    }
}

/// Whether a limit's slot can be reserved: GCRA, enforced, without a penalty (a blocked key
/// has no slot to reserve).
fn reservable(r: &Resolved<'_>) -> bool {
    r.limit.algorithm == Algorithm::Gcra && !r.shadow && r.limit.block.is_zero()
}

/// One GCRA limit: its slot reserved within `wait`, then slept until. The store refuses only
/// a slot beyond the wait; the local fallback of an outage (`FailMode::Local`) reserves
/// nothing, and a refusal of its that the wait covers is waited out and asked again.
async fn reserved(
    handle: &Redguard,
    limits: &[Resolved<'_>],
    wait: Duration,
) -> Result<Vec<Decision>> {
    let deadline = Instant::now() + wait;
    loop {
        let ahead = deadline.saturating_duration_since(Instant::now());
        let mut decisions = decide(handle, limits, RateMode::Reserve(ahead)).await?;
        if let Some(rejected) = most_restrictive(&decisions) {
            let pause = rejected.retry_after.max(MIN_PAUSE);
            if Instant::now() + pause > deadline {
                return Err(Error::RateLimited(rejected));
            }
            tokio::time::sleep(pause).await;
            continue;
        }
        let slot = decisions
            .iter()
            .map(|d| d.retry_after)
            .max()
            .unwrap_or_default();
        if !slot.is_zero() {
            tokio::time::sleep(slot).await;
        }
        // Admitted now: nothing left to wait for.
        for decision in &mut decisions {
            decision.retry_after = Duration::ZERO;
        }
        return Ok(decisions);
    }
}

/// After an admission, the earliest instant the same limits could admit a call of one unit:
/// exact for GCRA, whose state says when its next unit frees (its reset less the burst's
/// other units), so the next head sleeps until its slot instead of asking to be refused.
/// Counted from the reply, which came after the store decided: never early. Other
/// algorithms, shadow limits and blocking limits say nothing here (the next head asks at
/// once, as it would without the hint). Late by at most one slot when the limit changed
/// meanwhile (an override, a refund): then the next ask admits at once. Kept only while
/// someone waits in the queue: a caller arriving at an empty queue asks at once.
fn next_admission(limits: &[Resolved<'_>], decisions: &[Decision]) -> Option<Instant> {
    let wait = limits
        .iter()
        .zip(decisions)
        .filter(|(r, d)| {
            r.limit.algorithm == Algorithm::Gcra
                && !r.shadow
                && r.limit.block.is_zero()
                && d.limit > 0
        })
        .map(|(_, d)| {
            let unit = u64::try_from(d.window.as_nanos() / u128::from(d.limit))
                .map_or(Duration::MAX, Duration::from_nanos);
            d.reset_after.saturating_sub(d.window.saturating_sub(unit))
        })
        .max()?;
    Some(Instant::now() + wait)
}

/// The queue of a call: its limit keys in order, so calls of the same limits queue together
/// (two sets whose names joined alike would only share a queue: ordered, decided apart).
fn queue_name(limits: &[Resolved<'_>]) -> String {
    let mut name = String::new();
    for (i, r) in limits.iter().enumerate() {
        if i > 0 {
            name.push('\n');
        }
        name.push_str(r.key.as_str());
    }
    name
}
