//! Rate-limit operations on Redis: one script decides every limit of a call.

use std::time::Duration;

use async_trait::async_trait;
use once_cell::sync::Lazy;
use redis::Script;

use super::{RedisStore, bounded, corrupt_or};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::rate::{Decision, micros};
use crate::store::{RateCheck, RateMode, RateOps, RateOutcome, Store as _};

static CHECK: Lazy<Script> = Lazy::new(|| Script::new(include_str!("scripts/rate_check.lua")));

pub(super) fn scripts() -> Vec<&'static Script> {
    vec![&CHECK]
}

/// Suffix of a limit's penalty key. It sits after the `{..}` hash tag, so the block key lands
/// in the same slot as the state key.
const BLOCK_SUFFIX: &str = ":block";

#[async_trait]
impl RateOps for RedisStore {
    async fn rate_check(&self, checks: &[RateCheck<'_>], mode: RateMode) -> Result<RateOutcome> {
        let Some(first) = checks.first() else {
            return Ok(RateOutcome {
                now: self.time().await?,
                decisions: Vec::new(),
            });
        };
        let mut invocation = CHECK.prepare_invoke();
        invocation
            .arg(if mode == RateMode::Peek { "1" } else { "0" })
            .arg(
                uuid::Uuid::new_v4()
                    .simple()
                    .to_string()
                    .get(..12)
                    .unwrap_or("0"),
            );
        for check in checks {
            let limit = check.limit;
            invocation
                .key(check.key.as_str())
                .key(format!("{}{BLOCK_SUFFIX}", check.key))
                .arg(limit.algorithm.as_str())
                .arg(limit.rate.count())
                .arg(micros(limit.rate.period()))
                .arg(limit.burst)
                .arg(limit.cost)
                .arg(micros(limit.block));
        }
        let mut conn = self.conn();
        let reply: Vec<i64> = bounded("rate_check", self.timeout(), async move {
            invocation.invoke_async(&mut conn).await
        })
        .await
        .map_err(|err| corrupt_or(err, first.key))?;
        parse(&reply, checks, first.key)
    }
}

fn parse(reply: &[i64], checks: &[RateCheck<'_>], key: &Key) -> Result<RateOutcome> {
    let corrupt = || Error::Corrupt {
        key: key.to_string(),
        detail: format!("rate script returned {reply:?}"),
    };
    let (&now, rest) = reply.split_first().ok_or_else(corrupt)?;
    if rest.len() != checks.len() * 4 {
        return Err(corrupt());
    }
    let us = |v: i64| {
        u64::try_from(v)
            .map(Duration::from_micros)
            .map_err(|_| corrupt())
    };
    let decisions = rest
        .chunks_exact(4)
        .zip(checks)
        .map(|(d, check)| {
            Ok(Decision {
                allowed: d[0] == 1,
                limit: check.limit.burst,
                remaining: u64::try_from(d[1]).map_err(|_| corrupt())?,
                reset_after: us(d[2])?,
                retry_after: us(d[3])?,
                window: check.limit.window(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RateOutcome {
        now: us(now)?,
        decisions,
    })
}
