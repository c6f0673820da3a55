//! The optional in-process first tier (`local = true`): remembers, per key, until when the
//! store said it is exhausted, and rejects calls in that time without a round trip.
//!
//! It only ever *rejects*, and only what the store already rejected: a call of cost `c` is
//! refused locally only while an earlier call of cost ≤ `c` on the same key and store is
//! known to be refused (the store's `retry_after`, counted from when its answer arrived —
//! slightly later than the store's own moment, so the local tier never lets a call
//! through that the store would refuse, and at worst refuses for one round trip longer).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use once_cell::sync::Lazy;

use super::Decision;
use crate::handle::Redguard;
use crate::key::Key;

/// Entries kept before expired ones are swept.
const SWEEP_AT: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Exhausted {
    until: Instant,
    cost: u64,
    decision: Decision,
}

static EXHAUSTED: Lazy<Mutex<HashMap<(usize, String), Exhausted>>> = Lazy::new(Default::default);

/// The store behind `handle`, told apart from other stores with the same key prefix.
fn store_id(handle: &Redguard) -> usize {
    Arc::as_ptr(handle.store()).cast::<()>() as usize
}

fn table() -> std::sync::MutexGuard<'static, HashMap<(usize, String), Exhausted>> {
    // Entries are plain values inserted whole: a poisoned map is still consistent.
    EXHAUSTED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A local rejection for `key` at `cost`, if the store recently refused it.
pub(super) fn rejected(handle: &Redguard, key: &Key, cost: u64) -> Option<Decision> {
    let now = Instant::now();
    let table = table();
    let entry = table.get(&(store_id(handle), key.as_str().to_owned()))?;
    if entry.until <= now || cost < entry.cost {
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
    let mut table = table();
    if table.len() >= SWEEP_AT {
        table.retain(|_, entry| entry.until > now);
    }
    table.insert(
        (store_id(handle), key.as_str().to_owned()),
        Exhausted {
            until: now + decision.retry_after,
            cost,
            decision,
        },
    );
}

/// Forgets what is known about `key` (the store admitted it again).
pub(super) fn forget(handle: &Redguard, key: &Key) {
    table().remove(&(store_id(handle), key.as_str().to_owned()));
}
