//! Pacing for calls that may wait ([`Limiter::wait`](super::Limiter::wait)): a call waits in
//! arrival order until the limits admit it or its wait runs out.
//!
//! Within one handle, the callers of one set of limit keys queue on one async mutex (FIFO,
//! [`crate::state::LockQueues`]). Only the head asks the store; when refused with a
//! `retry_after` its wait still covers, it sleeps exactly that and asks again, and on
//! admission hands the queue to the next. No jitter: one head per instance cannot stampede,
//! and a delay added to each admission would add up along the queue (a GCRA slot not taken
//! on time is lost), refusing its tail.
//! So 1,000 waiters on one key hold one timer each (their deadline, while queued; the head's
//! sleep once it leads), and the store sees one call per admission plus, when the limit is
//! saturated, about one refused call per admission (the new head's first ask), never a
//! stampede. Works the same for every algorithm and for several limits decided together,
//! since the store alone decides: nothing is admitted that it would not admit at that moment.
//!
//! A caller dropped while queued or asleep leaves the queue and has reserved nothing: no slot
//! is lost and none is given twice. A caller whose wait runs out while queued asks the store
//! once more (it is admitted if the limit admits it now, refused with the store's decision
//! otherwise), so a refusal always carries a real `retry_after`.

use std::time::Duration;

use tokio::time::Instant;

use super::decide::{Resolved, decide, most_restrictive};
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::store::RateMode;
use crate::values::Decision;

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
    let start = Instant::now();
    let deadlines: Vec<Instant> = waits.iter().map(|wait| start + *wait).collect();
    let last = deadlines.iter().copied().max().unwrap_or(start);
    let queue = handle.state().rate_queues.queue_named(&queue_name(limits));
    // Out of time while queued: one last ask (below), and no more waiting.
    let turn = tokio::time::timeout_at(last, queue.lock()).await.ok();
    loop {
        let decisions = decide(handle, limits, RateMode::Consume).await?;
        let Some(rejected) = most_restrictive(&decisions) else {
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
