//! The local fallback of [`FailMode::Local`]: while the store cannot answer, each instance
//! decides rate limits in process at its share of every limit; once the store answers again,
//! the local limiter stays an extra gate for one window of the limit.
//!
//! **Share.** With `instances = n`, an instance admits at `rate ÷ n` (the emission interval
//! times `n`: exact, even below one call per period) up to a burst of `burst ÷ n` rounded
//! down, but never less than one call of the limit's cost: the instances together admit at
//! most the limit whenever `burst ≥ n × cost`; below that, each keeps one call's worth. The
//! local limiter counts with GCRA whatever the limit's algorithm (a window of `count` per
//! `period` becomes `count ÷ n` per `period` with that burst) and applies no `block`
//! penalty: it is a bound for an outage, not a second exact limiter.
//!
//! **Recovery.** The store did not see what was admitted locally (after a restart it has
//! forgotten everything): trusting it alone at once would admit a fresh burst on top of the
//! outage's admissions. So a key admitted locally during the outage is, for one window of
//! its limit (the time the full capacity takes to come back, [`Limit::window`]) from the
//! store's first answer for it, admitted only when the store *and* the local limiter admit
//! it. Calls the gate refuses were charged by the store (decided first, in the same round
//! trip as ever): the store is stricter than the exact count for that window, never looser.
//! After the window the store's state holds a full window of the admissions and decides
//! alone. Charging the store for the local admissions instead would need a charge that may
//! go negative; the gate needs nothing from the store.
//!
//! **Memory.** At most [`MAX_KEYS`] keys per handle: an entry lives while its local debt is
//! not paid (or its gate is open); beyond the bound, paid entries go first, then the half
//! closest to paid, so random keys cannot grow the table, and a flood of them evicts the
//! keys that hold least (a key evicted early regains at most its share's burst).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::decide::Resolved;
use crate::handle::{FailMode, Redguard};
use crate::key::Key;
use crate::store::{RateMode, RateOutcome};
use crate::values::{Decision, Limit};

/// Keys the local fallback keeps per handle.
pub(crate) const MAX_KEYS: usize = 10_000;

/// An instance's share of one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Share {
    /// Time one unit of cost takes to come back locally, ns.
    pub(crate) interval_ns: u128,
    /// Units the local bucket holds.
    pub(crate) burst: u64,
}

impl Share {
    /// `limit` split over `instances`.
    pub(crate) fn of(limit: &Limit, instances: NonZeroU32) -> Share {
        let n = u64::from(instances.get());
        Share {
            interval_ns: u128::from(limit.rate.interval_ns().max(1)) * u128::from(n),
            burst: (limit.burst / n).max(limit.cost).max(1),
        }
    }

    fn window(&self) -> Duration {
        nanos(self.interval_ns * u128::from(self.burst))
    }
}

/// The local state of the keys decided in process.
#[derive(Debug)]
pub(crate) struct Table {
    /// What `now` counts from (ns), so that times never overflow an `Instant`.
    base: Instant,
    entries: Mutex<HashMap<String, Entry>>,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            base: Instant::now(),
            entries: Mutex::default(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Theoretical arrival time, ns since `base`: the local bucket is full again then.
    tat: u128,
    /// Set at the store's first answer after the outage: the gate is open until then (ns).
    gate_until: Option<u128>,
}

impl Entry {
    /// Until when the entry says anything.
    fn expires(&self) -> u128 {
        self.tat.max(self.gate_until.unwrap_or(0))
    }
}

impl Table {
    fn now(&self) -> u128 {
        Instant::now()
            .saturating_duration_since(self.base)
            .as_nanos()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // Every mutation below completes before any call that could panic.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of keys held (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// The share of each enforced limit, all-or-nothing: charged locally (`Consume`) only when
/// every one admits. A shadow limit is not decided locally (it would never be enforced).
fn decide_locally(
    table: &Table,
    limits: &[Resolved<'_>],
    instances: NonZeroU32,
    mode: RateMode,
    gate: Option<&[bool]>,
) -> Vec<Decision> {
    let now = table.now();
    let mut entries = table.lock();
    let decided = |i: usize, r: &Resolved<'_>| !r.shadow && gate.is_none_or(|g| g[i]);
    let decisions: Vec<Decision> = limits
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if !decided(i, r) {
                return Decision::degraded(r.limit.burst, r.limit.window());
            }
            let tat = entries.get(r.key.as_str()).map_or(now, |e| e.tat);
            gcra(Share::of(&r.limit, instances), r.limit.cost, tat, now).0
        })
        .collect();
    if mode.charges() && decisions.iter().all(|d| d.allowed) {
        for (i, r) in limits.iter().enumerate() {
            if !decided(i, r) {
                continue;
            }
            let share = Share::of(&r.limit, instances);
            let old = entries.get(r.key.as_str()).copied();
            let (_, tat) = gcra(share, r.limit.cost, old.map_or(now, |e| e.tat), now);
            let entry = Entry {
                tat,
                // Decided in process: the outage goes on, the gate opens at the next answer.
                gate_until: if gate.is_some() {
                    old.and_then(|e| e.gate_until)
                } else {
                    None
                },
            };
            if old.is_none() && entries.len() >= MAX_KEYS {
                evict(&mut entries, now);
            }
            entries.insert(r.key.as_str().to_owned(), entry);
        }
    }
    decisions
}

/// Makes room: drops what says nothing any more, then, if still full, the half of the entries
/// that expire first (amortised: one pass frees half the table).
fn evict(entries: &mut HashMap<String, Entry>, now: u128) {
    entries.retain(|_, e| e.expires() > now);
    if entries.len() < MAX_KEYS {
        return;
    }
    let mut expiries: Vec<u128> = entries.values().map(Entry::expires).collect();
    let middle = expiries.len() / 2;
    let (_, threshold, _) = expiries.select_nth_unstable(middle);
    let threshold = *threshold;
    entries.retain(|_, e| e.expires() > threshold);
}

/// GCRA on `share` for a call of `cost` at `now` against the key's `tat` (all ns): the
/// decision and the TAT once charged (unchanged when refused).
fn gcra(share: Share, cost: u64, tat: u128, now: u128) -> (Decision, u128) {
    let t = share.interval_ns;
    let tau = t * u128::from(share.burst);
    let tat = tat.max(now);
    let new_tat = tat + t * u128::from(cost);
    let window = share.window();
    if new_tat - now <= tau {
        let decision = Decision {
            allowed: true,
            limit: share.burst,
            remaining: units((tau - (new_tat - now)) / t),
            reset_after: nanos(new_tat - now),
            retry_after: Duration::ZERO,
            window,
        };
        return (decision, new_tat);
    }
    let decision = Decision {
        allowed: false,
        limit: share.burst,
        remaining: units(tau.saturating_sub(tat - now) / t),
        reset_after: nanos(tat - now),
        retry_after: nanos(new_tat - now - tau),
        window,
    };
    (decision, tat)
}

fn nanos(ns: u128) -> Duration {
    let secs = u64::try_from(ns / 1_000_000_000).unwrap_or(u64::MAX);
    Duration::new(secs, (ns % 1_000_000_000) as u32)
}

fn units(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The handle's instances when its rate limits fall back to a local limiter.
fn instances(handle: &Redguard) -> Option<NonZeroU32> {
    match handle.fail_mode(crate::key::GuardKind::RateLimit) {
        FailMode::Local { instances } => Some(instances),
        FailMode::Open | FailMode::Closed => None,
    }
}

/// While the store cannot answer: the local decisions, counted as `mode="local"`.
pub(super) fn outage(
    handle: &Redguard,
    limits: &[Resolved<'_>],
    mode: RateMode,
) -> Option<Vec<Decision>> {
    let instances = instances(handle)?;
    let decisions = decide_locally(&handle.state().fallback, limits, instances, mode, None);
    if mode.charges() {
        count(limits, &decisions);
    }
    tracing::Span::current().record("mode", "local");
    Some(decisions)
}

/// A charge after the call ([`Charge`](super::Charge)) the store could not take, while the
/// fallback decides: the key's local bucket takes the `units`, past its share if need be (a
/// debt the next local admissions wait out, as the store's charge would). `false` when the
/// handle has no local fallback (the error stands). A refund is not given back locally:
/// the share stays the stricter side.
pub(super) fn charge(handle: &Redguard, key: &Key, limit: &Limit, units: u64) -> bool {
    let Some(instances) = instances(handle) else {
        return false;
    };
    let table = &handle.state().fallback;
    let share = Share::of(limit, instances);
    let now = table.now();
    let mut entries = table.lock();
    let old = entries.get(key.as_str()).copied();
    let tat = old.map_or(now, |e| e.tat).max(now) + share.interval_ns * u128::from(units);
    if old.is_none() && entries.len() >= MAX_KEYS {
        evict(&mut entries, now);
    }
    entries.insert(
        key.as_str().to_owned(),
        Entry {
            tat,
            gate_until: old.and_then(|e| e.gate_until),
        },
    );
    true
}

/// The store answered `outcome`: for keys admitted locally during an outage, and within one
/// window of the store's first answer for them, the local limiter must admit the call too.
/// `Some` (the local refusals) when it does not; the store's outcome stands otherwise.
pub(super) fn gate(
    handle: &Redguard,
    limits: &[Resolved<'_>],
    mode: RateMode,
    outcome: &RateOutcome,
) -> Option<Vec<Decision>> {
    let instances = instances(handle)?;
    let table = &handle.state().fallback;
    if !mode.charges() || !outcome.allowed() || table.lock().is_empty() {
        return None;
    }
    let now = table.now();
    let gated: Vec<bool> = {
        let mut entries = table.lock();
        limits
            .iter()
            .map(|r| {
                let Some(entry) = entries.get_mut(r.key.as_str()) else {
                    return false;
                };
                let until = *entry
                    .gate_until
                    .get_or_insert(now + r.limit.window().as_nanos());
                if until <= now {
                    entries.remove(r.key.as_str());
                    return false;
                }
                !r.shadow
            })
            .collect()
    };
    if !gated.contains(&true) {
        return None;
    }
    let decisions = decide_locally(table, limits, instances, mode, Some(&gated));
    if decisions.iter().all(|d| d.allowed) {
        return None;
    }
    count(limits, &decisions);
    let span = tracing::Span::current();
    span.record("mode", "recovering");
    Some(decisions)
}

fn count(limits: &[Resolved<'_>], decisions: &[Decision]) {
    let allowed = decisions.iter().all(|d| d.allowed);
    for (i, (r, d)) in limits.iter().zip(decisions).enumerate() {
        let outcome = match (allowed, d.allowed) {
            (true, true) => "allowed",
            (_, false) => "rejected",
            (false, true) => "not_charged",
        };
        metrics::counter!(
            "redguard_rate_decisions_total",
            "scope" => r.scope.clone(),
            "limit" => crate::telemetry::limit_label(i),
            "outcome" => outcome,
            "mode" => "local",
        )
        .increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::{Algorithm, Rate};

    fn limit(algorithm: Algorithm, rate: Rate, burst: Option<u64>, cost: u64) -> Limit {
        Limit::new(algorithm, rate, burst, cost, Duration::ZERO).unwrap()
    }

    fn n(instances: u32) -> NonZeroU32 {
        NonZeroU32::new(instances).unwrap()
    }

    #[test]
    fn the_share_divides_rate_and_burst() {
        let l = limit(Algorithm::Gcra, Rate::per_second(100), Some(200), 1);
        let share = Share::of(&l, n(4));
        // 25/s: 40 ms a call; a burst of 50.
        assert_eq!(share.interval_ns, 40_000_000);
        assert_eq!(share.burst, 50);
        // One instance: the limit itself.
        let one = Share::of(&l, n(1));
        assert_eq!(
            (one.interval_ns, one.burst),
            (u128::from(l.rate.interval_ns()), 200)
        );
    }

    #[test]
    fn the_share_rounds_the_burst_down_but_never_to_zero_or_below_the_cost() {
        let l = limit(Algorithm::Gcra, Rate::per_second(10), None, 1);
        // 10 / 3 = 3 (the instances together: 9 ≤ 10).
        assert_eq!(Share::of(&l, n(3)).burst, 3);
        // Fewer units than instances: one each, never zero.
        assert_eq!(Share::of(&l, n(64)).burst, 1);
        // A call of cost 4 must stay admissible somewhere: the share holds one call.
        let costly = limit(Algorithm::Gcra, Rate::per_second(10), Some(10), 4);
        assert_eq!(Share::of(&costly, n(5)).burst, 4);
        // A slow rate split finely: 1/h over 1,000 instances is one call per 1,000 h.
        let slow = limit(Algorithm::Gcra, Rate::per_hour(1), None, 1);
        assert_eq!(
            Share::of(&slow, n(1000)).interval_ns,
            3_600_000_000_000u128 * 1000
        );
        // Windows count by the share too: 60/min over 7 = 8 per minute, a burst of 8.
        let window = limit(Algorithm::FixedWindow, Rate::per_minute(60), None, 1);
        let share = Share::of(&window, n(7));
        assert_eq!(share.burst, 8);
        assert_eq!(share.interval_ns, 7_000_000_000);
    }

    #[test]
    fn gcra_admits_the_burst_then_the_rate() {
        let share = Share {
            interval_ns: 100,
            burst: 3,
        };
        let mut tat = 0;
        let mut admitted = Vec::new();
        // Calls every 10 ns from 0 to 1,000: 3 at once, then one per 100 ns.
        for now in (0..=1000).step_by(10) {
            let (d, next) = gcra(share, 1, tat, now);
            tat = next;
            if d.allowed {
                admitted.push(now);
            }
        }
        assert_eq!(admitted.len(), 3 + 10, "{admitted:?}");
        let (refused, _) = gcra(share, 1, tat, 1000);
        assert!(!refused.allowed);
        assert!(refused.retry_after > Duration::ZERO);
        assert!(refused.retry_after <= Duration::from_nanos(100));
        // A call costlier than the bucket holds is refused, never an overflow.
        let (d, _) = gcra(share, 4, 0, 0);
        assert!(!d.allowed);
    }

    #[test]
    fn the_table_stays_bounded_under_random_keys() {
        let table = Table::default();
        let l = limit(Algorithm::Gcra, Rate::per_hour(10), None, 1);
        // A throttled key, deep in debt: it must outlive the flood of fresh keys.
        let hot = Key::stored("redguard:rate:{t:hot}");
        for _ in 0..10 {
            let r = resolved(&hot, &l);
            decide_locally(&table, &[r], n(1), RateMode::Consume, None);
        }
        for i in 0..(3 * MAX_KEYS) {
            let key = Key::stored(format!("redguard:rate:{{t:{i}}}"));
            decide_locally(&table, &[resolved(&key, &l)], n(1), RateMode::Consume, None);
            assert!(table.len() <= MAX_KEYS);
        }
        let r = resolved(&hot, &l);
        let d = decide_locally(&table, &[r], n(1), RateMode::Consume, None);
        assert!(!d[0].allowed, "the throttled key was evicted by the flood");
    }

    /// The gate after recovery, on paused time: a key admitted locally during the outage is
    /// admitted for one window of its limit only when the local share admits it too, then
    /// the store decides alone and the entry is gone.
    #[tokio::test(start_paused = true)]
    async fn the_gate_holds_for_one_window_after_the_store_answers() {
        let rg = crate::Redguard::memory_builder()
            .fail_mode(
                crate::key::GuardKind::RateLimit,
                FailMode::local(2).unwrap(),
            )
            .connect()
            .await
            .unwrap();
        // 10/s, burst 10 (window 1 s); the share: 5/s, burst 5.
        let l = limit(Algorithm::Gcra, Rate::per_second(10), None, 1);
        let key = Key::stored("redguard:rate:{t:gated}");
        let other = Key::stored("redguard:rate:{t:fresh}");
        let r = || [resolved(&key, &l)];
        let admitted = (0..8)
            .filter(|_| outage(&rg, &r(), RateMode::Consume).unwrap()[0].allowed)
            .count();
        assert_eq!(admitted, 5, "the share's burst");
        // The store answers and admits (restarted empty, it would admit its whole burst).
        let store_admits = RateOutcome {
            now: Duration::ZERO,
            decisions: vec![Decision::degraded(10, Duration::from_secs(1))],
        };
        let refused = gate(&rg, &r(), RateMode::Consume, &store_admits).unwrap();
        assert!(!refused[0].allowed && refused[0].retry_after > Duration::ZERO);
        // A key the fallback never admitted is not gated.
        assert!(
            gate(
                &rg,
                &[resolved(&other, &l)],
                RateMode::Consume,
                &store_admits
            )
            .is_none()
        );
        // Within the window the gate admits at the share's rate: 5/s, one per 200 ms.
        let mut admitted = 0;
        for _ in 0..9 {
            tokio::time::advance(Duration::from_millis(100)).await;
            if gate(&rg, &r(), RateMode::Consume, &store_admits).is_none() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 4, "0.9 s at 5/s");
        // One window after the store's first answer: the store alone decides.
        tokio::time::advance(Duration::from_millis(150)).await;
        for _ in 0..20 {
            assert!(gate(&rg, &r(), RateMode::Consume, &store_admits).is_none());
        }
        assert_eq!(rg.state().fallback.len(), 0);
    }

    fn resolved<'a>(key: &Key, limit: &Limit) -> Resolved<'a> {
        Resolved {
            key: key.clone(),
            limit: limit.clone(),
            scope: Box::leak(Box::new(metrics::SharedString::const_str("t"))),
            local: false,
            shadow: false,
            near_limit: 0,
        }
    }
}
