//! Rate limits as the guide describes them, in exact arithmetic.
//!
//! Every algorithm is a pure function of a key's state, a limit and the time (µs since the
//! epoch). The bucket algorithms and GCRA count one unit every emission interval (the guide,
//! "Precision"); their state is a debt, the time until the bucket is empty, exact in ns; a
//! change of rate keeps its units (the guide: "state is kept in units"). Windows are aligned on
//! the epoch. Reported durations are the exact ones rounded up to a whole µs, `remaining`
//! the whole units left.

use std::collections::BTreeMap;
use std::time::Duration;

use redguard::rate::Algorithm;

/// The emission interval in ns (the guide, "Precision"): `period / count` rounded up to a whole
/// µs when that is at least 1 ms, to a whole ns below.
pub fn interval_ns(count: u64, period: Duration) -> u128 {
    let (period, count) = (period.as_nanos(), u128::from(count));
    if period >= 1_000_000 * count {
        period.div_ceil(1000 * count) * 1000
    } else {
        period.div_ceil(count)
    }
}

/// Whether the guide accepts `count` per `period`: count 1..=1e9, period 1 ms..=30 days, and an
/// interval that makes the limit at most 0.1% stricter than asked.
pub fn rate_accepted(count: u64, period: Duration) -> bool {
    if count == 0 || count > 1_000_000_000 {
        return false;
    }
    if period < Duration::from_millis(1) || period > Duration::from_secs(30 * 86_400) {
        return false;
    }
    let counted = interval_ns(count, period) * u128::from(count);
    // Slower by at most a thousandth of the asked period.
    (counted - period.as_nanos()) * 1000 <= period.as_nanos()
}

/// One limit of a call, as the model reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimitSpec {
    pub algorithm: Algorithm,
    pub count: u64,
    pub period: Duration,
    /// `None`: the count (and always the count for window algorithms).
    pub burst: Option<u64>,
    pub cost: u64,
    pub block: Duration,
}

impl LimitSpec {
    /// The capacity: the burst, or the count per window.
    pub fn capacity(&self) -> u64 {
        self.burst.unwrap_or(self.count)
    }

    /// The emission interval, ns.
    pub fn interval(&self) -> u128 {
        interval_ns(self.count, self.period)
    }

    /// Whether the guide's rules accept this limit (rate accepted, burst ≥ 1 and only for bucket
    /// algorithms, 1 ≤ cost ≤ burst, a sliding window's count ≤ 10,000, the burst refilled
    /// within 2^50 µs, block ≤ 30 days).
    pub fn valid(&self) -> bool {
        let windowed = self.algorithm.is_window();
        rate_accepted(self.count, self.period)
            && !(self.algorithm == Algorithm::SlidingWindow && self.count > 10_000)
            && match self.burst {
                Some(burst) if windowed => burst == self.count,
                Some(burst) => (1..=1_000_000_000).contains(&burst),
                None => true,
            }
            && (1..=self.capacity()).contains(&self.cost)
            && u128::from(self.capacity()) * self.interval() <= 1000 << 50
            && self.block <= Duration::from_secs(30 * 86_400)
    }

    /// What `RateLimit-Policy`'s window is: the period for windows, the time the full burst
    /// takes to come back for the others.
    pub fn window(&self) -> Duration {
        if self.algorithm.is_window() {
            self.period
        } else {
            let ns = u128::from(self.capacity()) * self.interval();
            Duration::from_nanos(u64::try_from(ns).expect("below 2^50 µs"))
        }
    }

    fn period_us(&self) -> u64 {
        u64::try_from(self.period.as_micros()).expect("at most 30 days")
    }
}

/// What one limit decided: the fields of `redguard::Decision`, durations in µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub reset_us: u64,
    pub retry_us: u64,
    pub window: Duration,
}

/// What the model keeps per key: each algorithm's own state, so a change of algorithm finds
/// none of its own (the guide: "starts its state afresh").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// GCRA, a token bucket or a leaky bucket: when the bucket is empty again (the
    /// theoretical arrival time, ns since the epoch), and the interval it was counted in.
    Debt {
        algorithm: Algorithm,
        tat: u128,
        interval: u128,
    },
    /// The aligned window's index and the units admitted in it.
    FixedWindow { window: u64, used: u64 },
    /// The admitted calls as (time µs, cost), oldest first.
    SlidingWindow { log: Vec<(u64, u64)> },
    /// The current window's index, its units, and the previous window's.
    SlidingCounter {
        window: u64,
        current: u64,
        previous: u64,
    },
}

impl State {
    fn algorithm(&self) -> Algorithm {
        match self {
            State::Debt { algorithm, .. } => *algorithm,
            State::FixedWindow { .. } => Algorithm::FixedWindow,
            State::SlidingWindow { .. } => Algorithm::SlidingWindow,
            State::SlidingCounter { .. } => Algorithm::SlidingCounter,
        }
    }
}

/// The state of every key, and the end (µs) of every key's penalty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateModel {
    pub states: BTreeMap<String, State>,
    pub blocked_until: BTreeMap<String, u64>,
}

/// Whether a check counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Consume,
    Peek,
}

impl RateModel {
    /// One call checking `limits` (each on its own key) together at `now` (µs): each limit
    /// decides as if it alone were charged; only when all admit, and not peeking, are they
    /// all charged. A limit that rejects starts its penalty, unless peeking or already
    /// blocked.
    pub fn check(&mut self, limits: &[(String, LimitSpec)], now: u64, mode: Mode) -> Vec<Verdict> {
        let mut verdicts = Vec::with_capacity(limits.len());
        let mut commits = Vec::new();
        let mut penalties = Vec::new();
        for (key, limit) in limits {
            let until = if limit.block.is_zero() {
                // A limit configured without a penalty ignores one left by another.
                0
            } else {
                self.blocked_until.get(key).copied().unwrap_or(0)
            };
            let own = self
                .states
                .get(key)
                .filter(|state| state.algorithm() == limit.algorithm);
            let mut verdict = if until > now {
                Verdict {
                    allowed: false,
                    limit: limit.capacity(),
                    remaining: 0,
                    reset_us: until - now,
                    retry_us: until - now,
                    window: limit.window(),
                }
            } else {
                let (verdict, commit) = decide(own, limit, now);
                if let Some(state) = commit {
                    commits.push((key.clone(), state));
                }
                verdict
            };
            if !verdict.allowed && mode == Mode::Consume && until <= now && !limit.block.is_zero() {
                let block = u64::try_from(limit.block.as_micros()).expect("≤ 30 days");
                penalties.push((key.clone(), now + block));
                verdict.retry_us = verdict.retry_us.max(block);
                verdict.reset_us = verdict.reset_us.max(block);
            }
            verdicts.push(verdict);
        }
        self.blocked_until.extend(penalties);
        if mode == Mode::Consume && verdicts.iter().all(|v| v.allowed) {
            self.states.extend(commits);
        }
        verdicts
    }
}

/// One limit's verdict at `now` from its algorithm's state at the key, and the state to write
/// if the call is charged.
fn decide(state: Option<&State>, limit: &LimitSpec, now: u64) -> (Verdict, Option<State>) {
    let base = Verdict {
        allowed: false,
        limit: limit.capacity(),
        remaining: 0,
        reset_us: 0,
        retry_us: 0,
        window: limit.window(),
    };
    match limit.algorithm {
        Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            debt(state, limit, now, base)
        }
        Algorithm::FixedWindow => fixed_window(state, limit, now, base),
        Algorithm::SlidingWindow => sliding_window(state, limit, now, base),
        Algorithm::SlidingCounter => sliding_counter(state, limit, now, base),
        other => panic!("the model has no {other}"),
    }
}

/// GCRA and the buckets are one algorithm (the guide: each admits at most burst + rate·t in any
/// interval t): the debt is the time until the bucket is empty (a token bucket's tokens are
/// burst − debt/interval, a leaky bucket's level is debt/interval); a call of cost c adds c
/// intervals and is admitted while the debt stays within burst intervals. A debt counted at
/// another interval keeps its units, rounded up to the resolution the new interval counts in
/// (a whole µs when the interval is whole µs, else a ns), and at most 2^52 of that
/// resolution (more than any burst spans).
fn debt(
    state: Option<&State>,
    limit: &LimitSpec,
    now: u64,
    base: Verdict,
) -> (Verdict, Option<State>) {
    let t = limit.interval();
    let now_ns = u128::from(now) * 1000;
    let resolution = if t.is_multiple_of(1000) { 1000 } else { 1 };
    let debt = match state {
        Some(State::Debt { tat, interval, .. }) if *tat > now_ns => {
            let d = tat - now_ns;
            if *interval == t {
                d
            } else {
                // Capped at 2^52 of the unit: past any burst, and exact in the scripts.
                ((d * t).div_ceil(interval * resolution) * resolution).min(resolution << 52)
            }
        }
        _ => 0,
    };
    let tau = u128::from(limit.capacity()) * t;
    let after = debt + u128::from(limit.cost) * t;
    let us = |ns: u128| u64::try_from(ns.div_ceil(1000)).expect("fits");
    if after <= tau {
        let verdict = Verdict {
            allowed: true,
            remaining: u64::try_from((tau - after) / t).expect("≤ burst"),
            reset_us: us(after),
            ..base
        };
        let state = State::Debt {
            algorithm: limit.algorithm,
            tat: now_ns + after,
            interval: t,
        };
        (verdict, Some(state))
    } else {
        let verdict = Verdict {
            remaining: u64::try_from(tau.saturating_sub(debt) / t).expect("≤ burst"),
            reset_us: us(debt),
            retry_us: us(after - tau),
            ..base
        };
        (verdict, None)
    }
}

/// Fixed window: windows of one period aligned on the epoch, each admitting `count` units.
fn fixed_window(
    state: Option<&State>,
    limit: &LimitSpec,
    now: u64,
    base: Verdict,
) -> (Verdict, Option<State>) {
    let period = limit.period_us();
    let window = now / period;
    let used = match state {
        Some(State::FixedWindow { window: w, used }) if *w == window => *used,
        _ => 0,
    };
    let left = (window + 1) * period - now;
    let count = limit.capacity();
    if used + limit.cost <= count {
        let verdict = Verdict {
            allowed: true,
            remaining: count - used - limit.cost,
            reset_us: left,
            ..base
        };
        let used = used + limit.cost;
        (verdict, Some(State::FixedWindow { window, used }))
    } else {
        let verdict = Verdict {
            remaining: count.saturating_sub(used),
            reset_us: left,
            retry_us: left,
            ..base
        };
        (verdict, None)
    }
}

/// Sliding window log: an admitted call is logged at its time, a µs after the newest entry
/// when the clock has not passed it (calls keep their order); the window is (now − period,
/// now]. Rejected: the call fits once the oldest entries holding the excess have left.
fn sliding_window(
    state: Option<&State>,
    limit: &LimitSpec,
    now: u64,
    base: Verdict,
) -> (Verdict, Option<State>) {
    let period = limit.period_us();
    let lo = now.saturating_sub(period);
    let log: Vec<(u64, u64)> = match state {
        Some(State::SlidingWindow { log }) => {
            log.iter().copied().filter(|(at, _)| *at > lo).collect()
        }
        _ => Vec::new(),
    };
    let used: u64 = log.iter().map(|(_, cost)| cost).sum();
    let count = limit.capacity();
    let newest = log.last().map(|(at, _)| *at);
    if used + limit.cost <= count {
        let at = newest.map_or(now, |newest| now.max(newest + 1));
        let verdict = Verdict {
            allowed: true,
            remaining: count - used - limit.cost,
            reset_us: at + period - now,
            ..base
        };
        let mut log = log;
        log.push((at, limit.cost));
        (verdict, Some(State::SlidingWindow { log }))
    } else {
        let excess = used + limit.cost - count;
        let mut freed = 0;
        let leaving = log
            .iter()
            .find(|(_, cost)| {
                freed += cost;
                freed >= excess
            })
            .expect("the excess is within the window's units");
        let verdict = Verdict {
            remaining: count.saturating_sub(used),
            reset_us: newest.expect("a full window has entries") + period - now,
            retry_us: leaving.0 + period - now,
            ..base
        };
        (verdict, None)
    }
}

/// Sliding counter: the current aligned window's units plus the previous window's, weighted by
/// the part of the previous window still inside the sliding one.
fn sliding_counter(
    state: Option<&State>,
    limit: &LimitSpec,
    now: u64,
    base: Verdict,
) -> (Verdict, Option<State>) {
    let period = limit.period_us();
    let window = now / period;
    let (current, previous) = match state {
        Some(State::SlidingCounter {
            window: w,
            current,
            previous,
        }) if *w == window => (*current, *previous),
        Some(State::SlidingCounter {
            window: w, current, ..
        }) if *w + 1 == window => (0, *current),
        _ => (0, 0),
    };
    let count = limit.capacity();
    let cost = limit.cost;
    let (p, c, prev) = (u128::from(period), u128::from(count), u128::from(previous));
    // The estimate × period, exact: previous·(period − elapsed) + current·period.
    let elapsed = u128::from(now - window * period);
    let est = prev * (p - elapsed) + u128::from(current) * p;
    let floor_units = |x: u128| u64::try_from(x / p).expect("fits");
    let edge = |w: u64| w * period - now;
    if est + u128::from(cost) * p <= c * p {
        let verdict = Verdict {
            allowed: true,
            remaining: floor_units(c * p - est - u128::from(cost) * p),
            reset_us: edge(window + 2),
            ..base
        };
        let state = State::SlidingCounter {
            window,
            current: current + cost,
            previous,
        };
        (verdict, Some(state))
    } else {
        let reset_us = if current > 0 {
            edge(window + 2)
        } else if previous > 0 {
            edge(window + 1)
        } else {
            0
        };
        let retry_us = if current + cost <= count && previous > 0 {
            // Later in this window, once previous·(period − e)/period ≤ room.
            let room = u128::from(count - cost - current);
            edge(window + 1) - u64::try_from(p * room / prev).expect("< period")
        } else {
            // In the next window, once current·(period − e)/period + cost ≤ count.
            let cur = u128::from(current);
            let e = p - (p * (c - u128::from(cost)) / cur).min(p);
            edge(window + 1) + u64::try_from(e).expect("≤ period")
        };
        let verdict = Verdict {
            remaining: u64::try_from(c.saturating_mul(p).saturating_sub(est) / p).expect("fits"),
            reset_us,
            retry_us: retry_us.max(1),
            ..base
        };
        (verdict, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(
        algorithm: Algorithm,
        count: u64,
        period_ms: u64,
        burst: Option<u64>,
        cost: u64,
    ) -> LimitSpec {
        LimitSpec {
            algorithm,
            count,
            period: Duration::from_millis(period_ms),
            burst,
            cost,
            block: Duration::ZERO,
        }
    }

    #[test]
    fn intervals_follow_readme() {
        assert_eq!(interval_ns(3, Duration::from_secs(1)), 333_334_000);
        assert_eq!(interval_ns(600_000, Duration::from_secs(1)), 1667);
        assert_eq!(interval_ns(1_000_000_000, Duration::from_secs(1)), 1);
        assert!(rate_accepted(1_000_000, Duration::from_secs(1)));
        assert!(!rate_accepted(3_000_000, Duration::from_secs(1)));
        assert!(rate_accepted(500_000_000, Duration::from_secs(1)));
    }

    #[test]
    fn a_drained_bucket_refills_one_unit_per_interval() {
        let mut model = RateModel::default();
        let limit = spec(Algorithm::TokenBucket, 2, 1000, None, 2);
        let key = || vec![("k".to_owned(), limit)];
        let t0 = 1_000_000_000;
        assert!(model.check(&key(), t0, Mode::Consume)[0].allowed);
        let v = model.check(&key(), t0, Mode::Consume)[0];
        assert_eq!(
            (v.allowed, v.remaining, v.retry_us, v.reset_us),
            (false, 0, 1_000_000, 1_000_000)
        );
        assert!(model.check(&key(), t0 + 1_000_000, Mode::Consume)[0].allowed);
    }

    #[test]
    fn a_sliding_counter_weighs_the_previous_window() {
        let mut model = RateModel::default();
        let one = spec(Algorithm::SlidingCounter, 4, 1000, None, 1);
        let key = |l| vec![("k".to_owned(), l)];
        let t0 = 1_000_000_000; // a window's start
        for _ in 0..4 {
            assert!(model.check(&key(one), t0, Mode::Consume)[0].allowed);
        }
        // A quarter into the next window, the previous 4 weigh 3: one more fits.
        let quarter = t0 + 1_250_000;
        assert!(model.check(&key(one), quarter, Mode::Consume)[0].allowed);
        let v = model.check(&key(one), quarter, Mode::Consume)[0];
        // 4·(1 − e) + 1 + 1 ≤ 4 from e = 0.5: 250 ms later.
        assert_eq!((v.allowed, v.retry_us), (false, 250_000));
    }
}
