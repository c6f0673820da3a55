//! Rate-limit operations in memory: the same arithmetic as `rate_check.lua`, on the
//! store's clock, under one lock so several limits are decided all-or-nothing.

use std::collections::VecDeque;
use std::sync::MutexGuard;
use std::time::Duration;

use async_trait::async_trait;

use super::{MemoryStore, Shard};
use crate::error::Result;
use crate::key::Key;
use crate::store::admin::{Raw, SNAPSHOT_MEMBERS};
use crate::store::{RateAdjust, RateCheck, RateMode, RateOps, RateOutcome};
use crate::values::{Algorithm, Decision, Limit, micros};

/// A limit's state. Window numbers are `f64` microseconds/units, as in the Lua script, so
/// both stores round identically; GCRA's and the buckets' are exact integers in ns (the
/// script counts them in µs or ns relative to now, exactly).
#[derive(Debug, Clone)]
pub(super) enum RateState {
    /// GCRA, or a token or leaky bucket (the same algorithm, see the script).
    Debt {
        algorithm: Algorithm,
        /// Theoretical arrival time (when the bucket is empty again), ns since the epoch.
        tat: u128,
        /// The emission interval it was computed with, ns.
        interval: u64,
    },
    FixedWindow {
        win: f64,
        used: f64,
    },
    /// One entry per admitted call, oldest first.
    SlidingWindow {
        log: VecDeque<LogEntry>,
    },
    SlidingCounter {
        win: f64,
        cur: f64,
        prev: f64,
    },
}

impl RateState {
    /// The state as `rate_check.lua` stores it, with its `PEXPIRETIME` when the format keeps
    /// part of the state there (GCRA's TAT). `now` in ns since the epoch.
    pub(super) fn raw(&self, now: u128) -> (Raw, Option<u64>) {
        let hash = |fields: Vec<(&str, String)>| Raw::Hash {
            fields: fields.into_iter().map(|(f, v)| (f.to_owned(), v)).collect(),
            result_len: None,
        };
        match self {
            RateState::Debt {
                algorithm: Algorithm::Gcra,
                tat,
                interval,
            } => {
                // The ns format: "-<T><rrrrrr>", the TAT being PEXPIRETIME less the rest.
                let up = tat.div_ceil(1_000_000);
                let rest = up * 1_000_000 - tat;
                let value = format!("-{}{rest:06}", interval.max(&1));
                (Raw::Text(value), u64::try_from(up).ok())
            }
            RateState::Debt {
                algorithm,
                tat,
                interval,
            } => {
                let tag = if *algorithm == Algorithm::TokenBucket {
                    "tb"
                } else {
                    "lb"
                };
                let level = tat.saturating_sub(now) as f64 / (*interval).max(1) as f64;
                let fields = vec![
                    ("a", tag.to_owned()),
                    ("v", format!("{level}")),
                    ("u", (now / 1000).to_string()),
                    ("t", interval.to_string()),
                ];
                (hash(fields), None)
            }
            RateState::FixedWindow { win, used } => (
                hash(vec![
                    ("a", "fw".to_owned()),
                    ("w", format!("{win}")),
                    ("n", format!("{used}")),
                ]),
                None,
            ),
            RateState::SlidingCounter { win, cur, prev } => (
                hash(vec![
                    ("a", "sc".to_owned()),
                    ("w", format!("{win}")),
                    ("c", format!("{cur}")),
                    ("p", format!("{prev}")),
                ]),
                None,
            ),
            RateState::SlidingWindow { log } => {
                let members = log
                    .iter()
                    .take(SNAPSHOT_MEMBERS)
                    .map(|e| (format!("{}:{}", e.cum, e.cost), e.at as f64))
                    .collect();
                let card = log.len() as u64;
                (Raw::ZSet { card, members }, None)
            }
        }
    }

    /// Gives back up to `units` charged units, as `admin_refund.lua` does; returns how many.
    /// `now` in ns since the epoch.
    pub(super) fn refund(&mut self, units: u64, now: u128) -> u64 {
        match self {
            RateState::Debt { tat, interval, .. } => {
                let t = u128::from((*interval).max(1));
                let owed = tat.saturating_sub(now).div_ceil(t);
                let back = owed.min(u128::from(units));
                *tat = tat.saturating_sub(back * t).max(now);
                u64::try_from(back).unwrap_or(u64::MAX)
            }
            RateState::FixedWindow { used: level, .. }
            | RateState::SlidingCounter { cur: level, .. } => {
                let back = (units as f64).min(level.ceil());
                *level = (*level - back).max(0.0);
                back as u64
            }
            RateState::SlidingWindow { log } => {
                let mut back = 0;
                while let Some(newest) = log.back() {
                    if back + newest.cost > units {
                        break;
                    }
                    back += newest.cost;
                    log.pop_back();
                }
                back
            }
        }
    }
}

/// An admitted call in a sliding log, as the script's "<cum>:<cost>" member at score `at`.
#[derive(Debug, Clone, Copy)]
pub(super) struct LogEntry {
    /// The call's time (µs), later than every earlier entry's.
    at: u64,
    /// Units admitted up to and including this call since the log was last empty.
    cum: u64,
    cost: u64,
}

/// What an admitted call writes.
enum Commit {
    /// The key's new state.
    Put(RateState),
    /// An entry for the key's sliding log, which drops its entries at or before `lo` (µs).
    Append { lo: u64, entry: LogEntry },
}

/// The sliding log's decision, as the script makes it.
struct Sliding {
    remaining: u64,
    reset_us: u64,
    retry_us: u64,
    commit: Option<Commit>,
}

/// The sliding log's decision at `now` (µs) for `limit`, from the key's `log` if it has one.
fn sliding(log: Option<&VecDeque<LogEntry>>, limit: &Limit, now: u64) -> Sliding {
    let (count, cost) = (limit.burst, limit.cost);
    let period = micros(limit.rate.period());
    let lo = now.saturating_sub(period);
    let empty = VecDeque::new();
    let log = log.unwrap_or(&empty);
    let start = log.partition_point(|e| e.at <= lo);
    let last = log.back().map(|e| e.at);
    // Units in the window and the newest entry's cum; a log with nothing in the window
    // starts its cum afresh.
    let (used, top) = match (log.get(start), log.back()) {
        (Some(first), Some(newest)) => (newest.cum - first.cum + first.cost, newest.cum),
        _ => (0, 0),
    };
    if used + cost <= count {
        let at = last.map_or(now, |last| now.max(last + 1));
        let entry = LogEntry {
            at,
            cum: top + cost,
            cost,
        };
        return Sliding {
            remaining: count - used - cost,
            reset_us: at + period - now,
            retry_us: 0,
            commit: Some(Commit::Append { lo, entry }),
        };
    }
    // The call fits once the entry holding unit `top - (count - cost)` has left.
    let target = top - (count - cost);
    // Cums increase along the log (a log restarts them only when all of it is stale).
    let leaving = log.get(log.partition_point(|e| e.cum < target));
    Sliding {
        remaining: count.saturating_sub(used),
        reset_us: last.map_or(0, |last| last + period - now),
        retry_us: leaving.map_or(0, |e| e.at + period - now),
        commit: None,
    }
}

/// `n` in a `u64`, saturated: a decision's durations are whole µs in a `u64`, so a larger
/// value (a debt of more than 584,000 years) reads the same, and a `u64` converts to `f64`
/// in a few instructions where a `u128` takes a call of ~40.
fn saturated(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn ceil_ms_us(us: f64) -> f64 {
    // The Redis store's TTLs are whole milliseconds, rounded up; mirror that.
    ((us / 1000.0).ceil().max(1.0)) * 1000.0
}

/// GCRA's decision, in ns.
struct Gcra {
    remaining: u128,
    reset_ns: u128,
    retry_ns: u128,
    /// When admitted: the new state and the time until its debt is paid.
    commit: Option<(RateState, u128)>,
}

/// GCRA (and the buckets) in exact integers: the script's arithmetic, counted in ns
/// throughout. An interval of whole µs keeps every value whole µs, as the script's µs
/// counting does; a changed interval rescales the debt in units, rounded up to the script's
/// unit.
/// `reserve_ns`: how far ahead of its slot a call is admitted ([`RateMode::Reserve`]), its
/// wait then in `retry_ns`.
fn gcra(state: Option<&RateState>, limit: &Limit, now_us: u64, reserve_ns: u128) -> Gcra {
    let interval = limit.rate.interval_ns();
    let t = u128::from(interval);
    let unit = if interval.is_multiple_of(1000) {
        1000
    } else {
        1
    };
    let now = u128::from(now_us) * 1000;
    let debt = match state {
        Some(RateState::Debt {
            algorithm,
            tat,
            interval: old,
        }) if *algorithm == limit.algorithm && *tat > now && *old > 0 => {
            let d = tat - now;
            if *old == interval {
                d
            } else {
                // Capped at 2^52 units of time, as the script does.
                ((d * t).div_ceil(u128::from(*old) * unit) * unit).min(unit << 52)
            }
        }
        _ => 0,
    };
    let tau = u128::from(limit.burst) * t;
    let new = debt + u128::from(limit.cost) * t;
    if new <= tau + reserve_ns {
        Gcra {
            remaining: tau.saturating_sub(new) / t,
            reset_ns: new,
            retry_ns: new.saturating_sub(tau),
            commit: Some((
                RateState::Debt {
                    algorithm: limit.algorithm,
                    tat: now + new,
                    interval,
                },
                new,
            )),
        }
    } else {
        Gcra {
            remaining: tau.saturating_sub(debt) / t,
            reset_ns: debt,
            retry_ns: new - tau,
            commit: None,
        }
    }
}

/// The shards of a check's keys, locked in index order (so two multi-key checks never wait
/// on each other in a cycle). Almost every check has one shard: no allocation for it.
enum Shards<'a> {
    One(MutexGuard<'a, Shard>),
    Many(Vec<(usize, MutexGuard<'a, Shard>)>),
}

impl Shards<'_> {
    /// The shard of `key`, one of those locked.
    fn of(&mut self, store: &MemoryStore, key: &Key) -> &mut Shard {
        match self {
            Shards::One(shard) => shard,
            Shards::Many(shards) => {
                let index = store.shard_of(key);
                let at = shards.partition_point(|(i, _)| *i < index);
                &mut shards[at].1
            }
        }
    }
}

impl MemoryStore {
    fn lock_shards(&self, checks: &[RateCheck<'_>]) -> Shards<'_> {
        let first = checks.first().map_or(0, |check| self.shard_of(check.key));
        if checks
            .iter()
            .skip(1)
            .all(|check| self.shard_of(check.key) == first)
        {
            return Shards::One(self.lock_shard(first));
        }
        let mut indices: Vec<usize> = checks.iter().map(|c| self.shard_of(c.key)).collect();
        indices.sort_unstable();
        indices.dedup();
        let locked = indices.into_iter().map(|i| (i, self.lock_shard(i)));
        Shards::Many(locked.collect())
    }
}

#[async_trait]
impl RateOps for MemoryStore {
    async fn rate_top_merge(
        &self,
        tally: &Key,
        counts: &[(String, u64)],
        keep: Duration,
        max: usize,
    ) -> Result<()> {
        let (mut shard, now) = self.shard(tally);
        let mut tallies = shard.tallies.at(now);
        let mut members = tallies.remove(tally).unwrap_or_default();
        for (key, count) in counts {
            *members.entry(key.clone()).or_default() += count;
        }
        // As the Redis script: only the `max` highest stay.
        if members.len() > max {
            let mut by_count: Vec<u64> = members.values().copied().collect();
            by_count.sort_unstable_by(|a, b| b.cmp(a));
            let floor = by_count[max - 1];
            let mut above = by_count.iter().filter(|&&c| c > floor).count();
            members.retain(|_, count| {
                if *count > floor {
                    true
                } else if *count == floor && above < max {
                    above += 1;
                    true
                } else {
                    false
                }
            });
        }
        tallies.put(tally, members, now + keep);
        Ok(())
    }

    async fn rate_top_read(&self, tallies: &[Key]) -> Result<Vec<Vec<(String, u64)>>> {
        Ok(tallies
            .iter()
            .map(|tally| {
                let (mut shard, now) = self.shard(tally);
                let live = shard.tallies.at(now);
                live.get(tally)
                    .map(|members| members.iter().map(|(k, c)| (k.clone(), *c)).collect())
                    .unwrap_or_default()
            })
            .collect())
    }

    async fn rate_check(&self, checks: &[RateCheck<'_>], mode: RateMode) -> Result<RateOutcome> {
        let now_d = self.clock.now();
        // As deny.lua: a denied key refuses the call before any limit is read; a peek looks.
        if mode != RateMode::Peek {
            for check in checks {
                self.check_denied(now_d, check.key)?;
            }
        }
        let mut shards = self.lock_shards(checks);
        let now_d = self.clock.now();
        let now = micros(now_d) as f64;
        let peek = mode == RateMode::Peek;
        let reserve_ns = match mode {
            RateMode::Reserve(ahead) => ahead.as_nanos(),
            _ => 0,
        };
        let mut decisions = Vec::with_capacity(checks.len());
        // The first check's commit apart: a check of one limit allocates no `Vec` for it.
        let mut first = None;
        let mut more: Vec<Option<(Commit, f64)>> = Vec::new();
        for check in checks {
            let quota = super::quota::with_quota(
                self,
                shards.of(self, check.key),
                now_d,
                check.key,
                check.limit,
            );
            let limit = quota.as_ref().unwrap_or(check.limit);
            let period = micros(limit.rate.period()) as f64;
            let burst = limit.burst as f64;
            let cost = limit.cost as f64;
            let block = micros(limit.block) as f64;
            let (mut allowed, mut remaining, mut reset, mut retry) = (false, 0.0, 0.0, 0.0);
            let mut commit = None;
            // As in the script: a limit without a penalty ignores one a former
            // configuration left.
            let shard = shards.of(self, check.key);
            let mut blocks = shard.rate_blocks.at(now_d);
            let until = if block > 0.0 {
                blocks.get(check.key).copied().unwrap_or(0.0)
            } else {
                0.0
            };
            let states = shard.rates.at(now_d);
            let state = states.get(check.key);
            if until > now {
                retry = until - now;
                reset = retry;
            } else {
                match limit.algorithm {
                    Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                        // Reserving is GCRA's alone, as in the script.
                        let reserve = match limit.algorithm {
                            Algorithm::Gcra => reserve_ns,
                            _ => 0,
                        };
                        let gcra = gcra(state, limit, micros(now_d), reserve);
                        allowed = gcra.commit.is_some();
                        remaining = saturated(gcra.remaining) as f64;
                        reset = saturated(gcra.reset_ns.div_ceil(1000)) as f64;
                        retry = saturated(gcra.retry_ns.div_ceil(1000)) as f64;
                        commit = gcra.commit.map(|(state, ttl_ns)| {
                            (Commit::Put(state), saturated(ttl_ns) as f64 / 1000.0)
                        });
                    }
                    Algorithm::FixedWindow => {
                        let win = (now / period).floor();
                        let used = match state {
                            Some(RateState::FixedWindow { win: w, used }) if *w == win => *used,
                            _ => 0.0,
                        };
                        let end = (win + 1.0) * period;
                        reset = end - now;
                        if used + cost <= burst {
                            allowed = true;
                            remaining = burst - used - cost;
                            let used = used + cost;
                            let state = RateState::FixedWindow { win, used };
                            commit = Some((Commit::Put(state), end - now));
                        } else {
                            remaining = (burst - used).max(0.0);
                            retry = end - now;
                        }
                    }
                    Algorithm::SlidingWindow => {
                        let log = match state {
                            Some(RateState::SlidingWindow { log }) => Some(log),
                            _ => None,
                        };
                        let sliding = sliding(log, limit, micros(now_d));
                        allowed = sliding.commit.is_some();
                        remaining = sliding.remaining as f64;
                        reset = sliding.reset_us as f64;
                        retry = sliding.retry_us as f64;
                        commit = sliding.commit.map(|commit| (commit, reset));
                    }
                    Algorithm::SlidingCounter => {
                        let win = (now / period).floor();
                        let (cur, prev) = match state {
                            Some(RateState::SlidingCounter { win: w, cur, prev }) if *w == win => {
                                (*cur, *prev)
                            }
                            Some(RateState::SlidingCounter { win: w, cur, .. })
                                if *w == win - 1.0 =>
                            {
                                (0.0, *cur)
                            }
                            _ => (0.0, 0.0),
                        };
                        let elapsed = now - win * period;
                        let est = prev * (period - elapsed) / period + cur;
                        if cur > 0.0 {
                            reset = (win + 2.0) * period - now;
                        } else if prev > 0.0 {
                            reset = (win + 1.0) * period - now;
                        }
                        if est + cost <= burst {
                            allowed = true;
                            remaining = (burst - est - cost).floor();
                            reset = (win + 2.0) * period - now;
                            let state = RateState::SlidingCounter {
                                win,
                                cur: cur + cost,
                                prev,
                            };
                            commit = Some((Commit::Put(state), (win + 2.0) * period - now));
                        } else {
                            remaining = (burst - est).floor().max(0.0);
                            let room = burst - cost - cur;
                            // From the window's end, relative to now, as the script counts.
                            let edge = (win + 1.0) * period - now;
                            retry = if room >= 0.0 && prev > 0.0 {
                                edge - (period * room / prev).floor()
                            } else if cur > burst - cost {
                                edge + period - (period * (burst - cost) / cur).floor()
                            } else {
                                edge
                            };
                            retry = retry.max(1.0);
                        }
                    }
                }
            }
            if !allowed && block > 0.0 && !peek && until <= now {
                blocks.put(
                    check.key,
                    now + block,
                    Duration::from_micros((now + ceil_ms_us(block)) as u64),
                );
                retry = retry.max(block);
                reset = reset.max(block);
            }
            if decisions.is_empty() {
                first = commit;
            } else {
                more.push(commit);
            }
            decisions.push(Decision {
                allowed,
                limit: limit.burst,
                remaining: remaining as u64,
                reset_after: Duration::from_micros(reset as u64),
                retry_after: Duration::from_micros(retry as u64),
                window: limit.window(),
            });
        }
        if !peek && decisions.iter().all(|d| d.allowed) {
            let commits = std::iter::once(first).chain(more);
            for (check, commit) in checks.iter().zip(commits) {
                let Some((commit, ttl)) = commit else {
                    continue;
                };
                let expires = Duration::from_micros((now + ceil_ms_us(ttl)) as u64);
                let mut states = shards.of(self, check.key).rates.at(now_d);
                match commit {
                    Commit::Put(state) => states.put(check.key, state, expires),
                    Commit::Append { lo, entry } => {
                        // In place: a log of thousands of entries is not copied per call.
                        if let Some(RateState::SlidingWindow { log }) = states.get_mut(check.key) {
                            let stale = log.partition_point(|e| e.at <= lo);
                            log.drain(..stale);
                            log.push_back(entry);
                            states.set_expiry(check.key, expires);
                        } else {
                            let log = VecDeque::from([entry]);
                            states.put(check.key, RateState::SlidingWindow { log }, expires);
                        }
                    }
                }
            }
        }
        Ok(RateOutcome {
            now: Duration::from_micros(now as u64),
            decisions,
        })
    }

    async fn rate_adjust(&self, check: &RateCheck<'_>, adjust: RateAdjust) -> Result<u64> {
        let (mut shard, now) = self.shard(check.key);
        let quota = super::quota::with_quota(self, &mut shard, now, check.key, check.limit);
        let limit = quota.as_ref().unwrap_or(check.limit);
        let mut states = shard.rates.at(now);
        let state = states.get(check.key);
        let Some((next, ttl_us, units)) = adjusted(state, limit, micros(now), adjust) else {
            return Ok(0);
        };
        let expires = Duration::from_micros(micros(now) + ceil_ms_us(ttl_us as f64) as u64);
        states.put(check.key, next, expires);
        Ok(units)
    }
}

/// The most a debt grows to, in GCRA's unit (µs or ns), as the script caps it: 2^52, beyond
/// any burst, so every number stays exact.
const DEBT_CAP: u128 = 1 << 52;

/// `state` after `adjust` at `now` (µs) under `limit`, with the time until it may go (µs)
/// and the units charged or given back; `None` when there is nothing to give back. The
/// arithmetic of `rate_adjust.lua`.
fn adjusted(
    state: Option<&RateState>,
    limit: &Limit,
    now: u64,
    adjust: RateAdjust,
) -> Option<(RateState, u64, u64)> {
    if matches!(adjust, RateAdjust::Charge(0) | RateAdjust::Refund(0)) {
        return None;
    }
    let period = micros(limit.rate.period());
    match limit.algorithm {
        Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            let interval = limit.rate.interval_ns();
            let t = u128::from(interval);
            let unit: u128 = if interval.is_multiple_of(1000) {
                1000
            } else {
                1
            };
            let now_ns = u128::from(now) * 1000;
            // The debt as the check reads it (rescaled in units when the interval changed).
            let probe = Limit {
                cost: 0,
                burst: u64::MAX,
                ..limit.clone()
            };
            let debt = gcra(state, &probe, now, 0).reset_ns;
            let (new, units) = match adjust {
                RateAdjust::Charge(n) => {
                    let new = (debt + u128::from(n) * t).min(DEBT_CAP * unit);
                    (new, n)
                }
                RateAdjust::Refund(n) => {
                    let back = debt.div_ceil(t).min(u128::from(n));
                    if back == 0 {
                        return None;
                    }
                    (debt.saturating_sub(back * t), u64::try_from(back).ok()?)
                }
            };
            let state = RateState::Debt {
                algorithm: limit.algorithm,
                tat: now_ns + new,
                interval,
            };
            Some((state, u64::try_from(new.div_ceil(1000)).ok()?, units))
        }
        Algorithm::FixedWindow => {
            let win = (now / period) as f64;
            let used = match state {
                Some(RateState::FixedWindow { win: w, used }) if *w == win => *used,
                _ => 0.0,
            };
            let (used, units) = match adjust {
                RateAdjust::Charge(n) => (used + n as f64, n),
                RateAdjust::Refund(n) => {
                    let back = (n as f64).min(used);
                    if back <= 0.0 {
                        return None;
                    }
                    (used - back, back as u64)
                }
            };
            let end = (now / period + 1) * period;
            Some((RateState::FixedWindow { win, used }, end - now, units))
        }
        Algorithm::SlidingCounter => {
            let win = (now / period) as f64;
            let (mut cur, mut prev) = match state {
                Some(RateState::SlidingCounter { win: w, cur, prev }) if *w == win => (*cur, *prev),
                Some(RateState::SlidingCounter { win: w, cur, .. }) if *w == win - 1.0 => {
                    (0.0, *cur)
                }
                _ => (0.0, 0.0),
            };
            let units = match adjust {
                RateAdjust::Charge(n) => {
                    cur += n as f64;
                    n
                }
                RateAdjust::Refund(n) => {
                    // This window's units first: they weigh fully in the estimate.
                    let from_cur = (n as f64).min(cur);
                    let from_prev = (n as f64 - from_cur).min(prev);
                    if from_cur + from_prev <= 0.0 {
                        return None;
                    }
                    cur -= from_cur;
                    prev -= from_prev;
                    (from_cur + from_prev) as u64
                }
            };
            let end = (now / period + 2) * period;
            Some((
                RateState::SlidingCounter { win, cur, prev },
                end - now,
                units,
            ))
        }
        Algorithm::SlidingWindow => {
            let lo = now.saturating_sub(period);
            let mut log = match state {
                Some(RateState::SlidingWindow { log }) => log.clone(),
                _ => VecDeque::new(),
            };
            let stale = log.partition_point(|e| e.at <= lo);
            log.drain(..stale);
            let units = match adjust {
                RateAdjust::Charge(n) => {
                    // An entry of its own, at now: these units stay in the window for a
                    // whole period from the charge, as an admission's do. Into the newest
                    // entry instead when that one is not older than now (nothing changes
                    // then) or the log already holds a window's count of entries, so
                    // repeated charges never grow it past that bound.
                    let full = log.len() as u64 >= limit.burst;
                    if let Some(newest) = log.back_mut().filter(|e| e.at >= now || full) {
                        newest.cost += n;
                        newest.cum += n;
                    } else {
                        let (at, cum) = log
                            .back()
                            .map_or((now, n), |e| (now.max(e.at + 1), e.cum + n));
                        log.push_back(LogEntry { at, cum, cost: n });
                    }
                    n
                }
                RateAdjust::Refund(n) => {
                    // From the newest entries: lowering an entry's cost and cum together
                    // keeps every older entry's cum as it was.
                    let mut back = 0;
                    while back < n {
                        let Some(newest) = log.back_mut() else { break };
                        let take = newest.cost.min(n - back);
                        newest.cost -= take;
                        newest.cum -= take;
                        back += take;
                        if newest.cost == 0 {
                            log.pop_back();
                        }
                    }
                    if back == 0 {
                        return None;
                    }
                    back
                }
            };
            let ttl = log.back().map_or(1, |e| e.at + period - now);
            Some((RateState::SlidingWindow { log }, ttl, units))
        }
    }
}
