//! Rate-limit operations on Redis: one script decides every limit of a call.

use std::time::Duration;

use async_trait::async_trait;

use super::lua::{Lua, lua};
use super::{RedisStore, evalsha};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::store::{RateAdjust, RateCheck, RateMode, RateOps, RateOutcome, Store as _};
use crate::values::{DENY_SUFFIX, Decision, QUOTA_SUFFIX, micros};

lua!(CHECK = "rate_check.lua" after "expiry.lua", "quota.lua", "deny.lua", "rescale.lua");
lua!(ADJUST = "rate_adjust.lua" after "expiry.lua", "quota.lua", "rescale.lua");
lua!(TOP = "rate_top.lua");

pub(super) fn scripts() -> Vec<&'static Lua> {
    vec![&CHECK, &ADJUST, &TOP]
}

/// Suffix of a limit's penalty key. It sits after the `{..}` hash tag, so the block key lands
/// in the same slot as the state key.
const BLOCK_SUFFIX: &str = ":block";

#[async_trait]
impl RateOps for RedisStore {
    /// On a Cluster, limits in different slots cannot share a script. They are then decided
    /// in two phases: judge every slot's limits (nothing charged, but a limit that rejects
    /// writes its penalty, exactly as one script over every key would); if all admit, charge
    /// slot by slot. A call rejected in phase one charges nothing anywhere. A limit that
    /// fills up between the two phases (a race with another caller) rejects the call in
    /// phase two, after the slots before it were charged: the only case in which a rejected
    /// call uses up another limit, and only on a Cluster with limits in several slots.
    async fn rate_check(&self, checks: &[RateCheck<'_>], mode: RateMode) -> Result<RateOutcome> {
        // One GCRA limit without a penalty (the common check): the lean script, coalesced
        // with concurrent checks; rate_check.lua for the states it leaves.
        if super::gcra::eligible(checks, mode)
            && let Some(outcome) = self.gcra_check(&checks[0], mode).await?
        {
            return Ok(outcome);
        }
        // On a single node, skip the slot grouping altogether (the common, hot case).
        if !self.is_cluster() {
            return self.rate_check_slot(checks, Phase::from(mode)).await;
        }
        let first_tag = checks.first().map(|check| check.key.hash_tag());
        let one_slot = checks
            .iter()
            .all(|check| Some(check.key.hash_tag()) == first_tag);
        if one_slot {
            return self.rate_check_slot(checks, Phase::from(mode)).await;
        }
        let mut groups: Vec<Vec<RateCheck<'_>>> = Vec::new();
        for check in checks {
            match groups
                .iter_mut()
                .find(|group| group[0].key.hash_tag() == check.key.hash_tag())
            {
                Some(group) => group.push(*check),
                None => groups.push(vec![*check]),
            }
        }
        let phases: &[Phase] = match mode {
            RateMode::Peek => &[Phase::Peek],
            RateMode::Consume | RateMode::Reserve(_) => &[Phase::Judge, Phase::Consume],
        };
        let mut outcome = RateOutcome {
            now: std::time::Duration::ZERO,
            decisions: Vec::new(),
        };
        for phase in phases {
            let mut decided: Vec<(Key, Decision)> = Vec::new();
            for group in &groups {
                let part = self.rate_check_slot(group, *phase).await?;
                outcome.now = outcome.now.max(part.now);
                let rejected = !part.allowed();
                decided.extend(group.iter().map(|c| c.key.clone()).zip(part.decisions));
                if rejected && *phase == Phase::Consume {
                    break;
                }
            }
            // Back in the caller's order; limits not reached in a stopped phase two keep
            // their phase-one decisions.
            let previous = std::mem::take(&mut outcome.decisions);
            outcome.decisions = checks
                .iter()
                .enumerate()
                .map(|(i, check)| {
                    decided
                        .iter()
                        .find(|(key, _)| key == check.key)
                        .map(|(_, decision)| *decision)
                        .or_else(|| previous.get(i).copied())
                        .ok_or_else(|| Error::Corrupt {
                            key: check.key.to_string(),
                            detail: "no decision for this limit".to_owned(),
                        })
                })
                .collect::<Result<_>>()?;
            if !outcome.allowed() {
                break;
            }
        }
        Ok(outcome)
    }

    /// One script on the state key and its override, which share a slot: atomic on a
    /// Cluster too.
    async fn rate_top_merge(
        &self,
        tally: &Key,
        counts: &[(String, u64)],
        keep: Duration,
        max: usize,
    ) -> Result<()> {
        if counts.is_empty() {
            return Ok(());
        }
        let mut cmd = evalsha(&TOP, 1, 2 + 2 * counts.len());
        cmd.arg(tally.as_str())
            .arg(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX))
            .arg(max);
        for (key, count) in counts {
            cmd.arg(key).arg(count);
        }
        let _: i64 = self
            .run_script("rate_top_merge", &TOP, cmd, Some(tally))
            .await?;
        Ok(())
    }

    async fn rate_top_read(&self, tallies: &[Key]) -> Result<Vec<Vec<(String, u64)>>> {
        let mut read = Vec::with_capacity(tallies.len());
        // One key per command: a Cluster holds a scope's tallies in one slot, but reading
        // them one by one keeps this free of routing rules.
        for tally in tallies {
            let mut cmd = redis::cmd("ZRANGE");
            cmd.arg(tally.as_str()).arg(0).arg(-1).arg("WITHSCORES");
            let mut conn = self.conn();
            let members: Vec<(String, f64)> = self
                .bounded(
                    "rate_top_read",
                    async move { cmd.query_async(&mut conn).await },
                )
                .await?;
            read.push(
                members
                    .into_iter()
                    .map(|(key, count)| (key, count.max(0.0) as u64))
                    .collect(),
            );
        }
        Ok(read)
    }

    async fn rate_adjust(&self, check: &RateCheck<'_>, adjust: RateAdjust) -> Result<u64> {
        let (op, units) = match adjust {
            RateAdjust::Charge(units) => ("c", units),
            RateAdjust::Refund(units) => ("r", units),
        };
        if units == 0 {
            return Ok(0);
        }
        let limit = check.limit;
        let quota = check.key.companion(QUOTA_SUFFIX);
        // Off a Cluster, the prefix overrides too (in another slot on a Cluster).
        let prefixes = (!self.is_cluster())
            .then(|| crate::values::prefix_hash(check.key))
            .flatten();
        let mut keys = vec![check.key, &quota];
        if let Some(prefixes) = &prefixes {
            keys.push(prefixes);
        }
        let reply: Vec<i64> = self
            .eval(
                "rate_adjust",
                &ADJUST,
                &keys,
                &[
                    &op,
                    &units,
                    &limit.algorithm.as_str(),
                    &limit.rate.interval_ns(),
                    &micros(limit.rate.period()),
                    &limit.burst,
                ],
            )
            .await?;
        match reply.as_slice() {
            [done, q] => {
                if *q == -1 {
                    crate::store::rate::quota_ignored(check.key);
                }
                u64::try_from(*done).map_err(|_| Error::Corrupt {
                    key: check.key.to_string(),
                    detail: format!("rate_adjust returned {reply:?}"),
                })
            }
            _ => Err(Error::Corrupt {
                key: check.key.to_string(),
                detail: format!("rate_adjust returned {reply:?}"),
            }),
        }
    }
}

/// What one script run may write: the script's first argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Charge every limit when all admit; write the penalties of limits that reject.
    Consume,
    /// Write nothing.
    Peek,
    /// Charge nothing, but write the penalties of limits that reject: phase one of a call
    /// over several slots, so that a rejection there penalises as one script would.
    Judge,
    /// `Consume`, a GCRA limit admitting a call up to this many µs ahead of its slot.
    Reserve(u64),
}

impl From<RateMode> for Phase {
    fn from(mode: RateMode) -> Phase {
        match mode {
            RateMode::Consume => Phase::Consume,
            RateMode::Peek => Phase::Peek,
            RateMode::Reserve(ahead) => Phase::Reserve(micros(ahead)),
        }
    }
}

impl RedisStore {
    /// All of `checks` in one script: their keys must share a slot (or the store is a single
    /// node).
    async fn rate_check_slot(&self, checks: &[RateCheck<'_>], phase: Phase) -> Result<RateOutcome> {
        let Some(first) = checks.first() else {
            return Ok(RateOutcome {
                now: self.time().await?,
                decisions: Vec::new(),
            });
        };
        // Every key first, then the arguments: EVALSHA's order. Each limit passes four
        // keys and six arguments.
        // Off a Cluster, the prefix overrides too (one hash, in another slot on a Cluster).
        let prefixes = if self.is_cluster() {
            None
        } else {
            crate::values::prefix_hash(first.key)
        };
        let mut cmd = evalsha(
            &CHECK,
            checks.len() * 4 + 2 * usize::from(prefixes.is_some()),
            1 + checks.len() * 6,
        );
        for check in checks {
            cmd.arg(check.key.as_str())
                .arg(format!("{}{BLOCK_SUFFIX}", check.key))
                .arg(check.key.companion(QUOTA_SUFFIX).as_str())
                .arg(check.key.companion(DENY_SUFFIX).as_str());
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
        match phase {
            Phase::Consume => cmd.arg("0"),
            Phase::Peek => cmd.arg("1"),
            Phase::Judge => cmd.arg("2"),
            Phase::Reserve(ahead) => cmd.arg(format!("r{ahead}")),
        };
        for check in checks {
            let limit = check.limit;
            cmd.arg(limit.algorithm.as_str())
                .arg(limit.rate.interval_ns())
                .arg(micros(limit.rate.period()))
                .arg(limit.burst)
                .arg(limit.cost)
                .arg(micros(limit.block));
        }
        let reply: Vec<i64> = self
            .run_script("rate_check", &CHECK, cmd, Some(first.key))
            .await?;
        parse(&reply, checks, first.key)
    }
}

pub(super) fn parse(reply: &[i64], checks: &[RateCheck<'_>], key: &Key) -> Result<RateOutcome> {
    let corrupt = || Error::Corrupt {
        key: key.to_string(),
        detail: format!("rate script returned {reply:?}"),
    };
    let (&now, rest) = reply.split_first().ok_or_else(corrupt)?;
    if rest.len() != checks.len() * 6 {
        return Err(corrupt());
    }
    let us = |v: i64| {
        u64::try_from(v)
            .map(Duration::from_micros)
            .map_err(|_| corrupt())
    };
    let decisions = rest
        .chunks_exact(6)
        .zip(checks)
        .map(|(d, check)| {
            let (limit, window) = match d[4] {
                0 => (check.limit.burst, check.limit.window()),
                -1 => {
                    crate::store::rate::quota_ignored(check.key);
                    (check.limit.burst, check.limit.window())
                }
                cap => {
                    let cap = u64::try_from(cap).map_err(|_| corrupt())?;
                    let unit = u64::try_from(d[5]).map_err(|_| corrupt())?;
                    let window = if check.limit.algorithm.is_window() {
                        Duration::from_micros(unit)
                    } else {
                        Duration::from_nanos(cap.saturating_mul(unit))
                    };
                    (cap, window)
                }
            };
            Ok(Decision {
                allowed: d[0] == 1,
                limit,
                remaining: u64::try_from(d[1]).map_err(|_| corrupt())?,
                reset_after: us(d[2])?,
                retry_after: us(d[3])?,
                window,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RateOutcome {
        now: us(now)?,
        decisions,
    })
}
