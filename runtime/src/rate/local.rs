//! The optional in-process first tier (`local = true`): remembers, per key, until when the
//! store said it is exhausted, and rejects calls in that time without a round trip.
//!
//! It only ever *rejects*, and only what the store already rejected: a call of cost `c` is
//! refused locally only while an earlier call of cost ≤ `c` on the same key and store is
//! known to be refused (the store's `retry_after`, counted from when its answer arrived —
//! slightly later than the store's own moment, so the local tier never lets a call
//! through that the store would refuse, and at worst refuses for one round trip longer).
//! What is known is kept per handle ([`crate::state::Rejections`]).
//!
//! An operator's `reset` or `refund` reaches every instance's tier: the handle it goes
//! through forgets the key at once, the others when the store's notification arrives (on
//! Redis, pub/sub on the limit's key), and in any case a refusal is repeated for at most
//! [`RECHECK_AFTER`] before the store is asked again, even when the store's `retry_after` is
//! longer (a `block = "15m"` penalty), so a lost notification or a user who may not
//! subscribe delays a repair by a second at most.

use std::time::{Duration, Instant};

use crate::handle::Redguard;
use crate::key::Key;
use crate::state::Rejection;
use crate::values::Decision;

/// How long a refusal is repeated without asking the store: one store call per key, instance
/// and second is what a blocked key costs, and what bounds a repair's staleness.
pub(super) const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// A local rejection for `key` at `cost`, if the store recently refused it.
pub(super) fn rejected(handle: &Redguard, key: &Key, cost: u64) -> Option<Decision> {
    let now = Instant::now();
    let entry = handle.state().rejections.get(key)?;
    if entry.until <= now || entry.recheck <= now || cost < entry.cost {
        return None;
    }
    if handle
        .store()
        .rate_reset_after(key, entry.recheck - RECHECK_AFTER)
    {
        forget(handle, key);
        return None;
    }
    let mut decision = entry.decision;
    decision.retry_after = entry.until - now;
    decision.reset_after = decision.reset_after.max(decision.retry_after);
    Some(decision)
}

/// Records the store's rejection of `key` at `cost`.
pub(super) fn remember(handle: &Redguard, key: &Key, cost: u64, decision: Decision) {
    if decision.allowed || decision.retry_after.is_zero() {
        return;
    }
    let now = Instant::now();
    let rejection = Rejection {
        until: now + decision.retry_after,
        recheck: now + RECHECK_AFTER,
        cost,
        decision,
    };
    handle.state().rejections.insert(key, rejection);
    handle.store().listen_rate_resets();
}

/// Forgets what is known about `key` (the store admitted it again).
pub(super) fn forget(handle: &Redguard, key: &Key) {
    handle.state().rejections.remove(key);
}
