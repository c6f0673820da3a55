//! A quota override: the rate and burst an operator set for one rate-limit key at run time
//! (`redguard::admin`, `redguard quota set`), stored beside the limit's state at its `:quota`
//! companion key and read by the same script call that decides the limit.
//!
//! Stored form (one string, so the scripts read it with one `GET`):
//! `q1 <count> <period_us> <burst> <interval_ns>` — the rate's count and period (what an
//! operator reads back), the burst, and the emission interval the scripts count with
//! ([`grammar::interval_ns`], computed here once rather than in Lua doubles). A value of any
//! other shape, or outside the grammar's bounds, is not an override: the stores ignore it,
//! warn and count it (`redguard_rate_quota_invalid_total`), and the limit in the code applies.

use std::time::Duration;

use redguard_grammar::rate as grammar;

use crate::error::{Error, Result};
use crate::values::{IntoRate, Limit, Rate};

/// Suffix of a rate-limit key's override (after its hash tag: same Cluster slot).
pub(crate) const QUOTA_SUFFIX: &str = "quota";

/// Suffix, after `<prefix>:rate:`, of the hash holding a handle's prefix overrides: one
/// field per state-key prefix, `<prefix>:rate:{<scope>:<body prefix>`, its value
/// `<expires_at_ms, 0: permanent> ` and the override's stored form.
pub(crate) const PREFIX_HASH: &str = "quota-prefixes";

/// The most prefix overrides a handle's prefix holds: the deciding script reads them all
/// (one `HGETALL` per call), so their number bounds its cost.
pub const MAX_PREFIX_OVERRIDES: usize = 64;

/// The prefix-override hash of the handle a rate-limit state key `key` belongs to.
pub(crate) fn prefix_hash(key: &crate::key::Key) -> Option<crate::key::Key> {
    let at = key.as_str().find(":rate:{")?;
    let joined = crate::key::join(&[&key.as_str()[..at], ":rate:", PREFIX_HASH]);
    Some(crate::key::Key::stored(joined))
}

/// The longest TTL an override may be given (longer ones are [`permanent`](QuotaTtl::Permanent),
/// said so explicitly).
pub const MAX_QUOTA_TTL: Duration = Duration::from_secs(365 * 86_400);

/// The rate and burst an override gives a rate-limit key, in place of those in the code.
///
/// The algorithm, cost and penalty stay the code's. A window algorithm (fixed, sliding)
/// admits the override's count per its period and ignores its burst. The state is kept in
/// units, so a changed rate applies to what the key already owes: a lowered rate admits
/// nothing beyond the new limit (the guide, *Rate limits*).
///
/// ```
/// use redguard::admin::Quota;
///
/// let gold = Quota::new("100/s", Some(200))?;
/// assert_eq!(gold.burst(), 200);
/// assert!(Quota::new("0/s", None).is_err()); // the grammar's bounds, as for literals
/// assert!(Quota::new("10/s", Some(0)).is_err());
/// # Ok::<(), redguard::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    rate: Rate,
    burst: u64,
}

impl Quota {
    /// An override of `rate` (a [`Rate`] or text such as `"100/s"`) and `burst` (default:
    /// the rate's count), checked against the bounds the grammar enforces for literals.
    pub fn new(rate: impl IntoRate, burst: Option<u64>) -> Result<Quota> {
        let rate = rate.into_rate()?;
        let spec = grammar::Rate {
            count: rate.count(),
            period: rate.period(),
        };
        let burst = grammar::limit(grammar::Shape::Bucket, spec, burst, 1, Duration::ZERO)
            .map_err(Error::InvalidLimit)?;
        Ok(Quota { rate, burst })
    }

    /// The rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The burst (bucket algorithms; a window one admits the rate's count).
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The stored form (see the module's notes).
    pub(crate) fn encode(&self) -> String {
        format!(
            "q1 {} {} {} {}",
            self.rate.count(),
            crate::values::micros(self.rate.period()),
            self.burst,
            self.rate.interval_ns()
        )
    }

    /// The override a stored value holds, or why it is none. Stricter than the scripts
    /// (which check the bounds but trust the interval): the interval must be the rate's.
    pub(crate) fn decode(stored: &str) -> std::result::Result<Quota, String> {
        let bad = || {
            format!(
                "{stored:?} is not a quota override (`q1 <count> <period_us> <burst> <interval_ns>`)"
            )
        };
        let mut fields = stored.strip_prefix("q1 ").ok_or_else(bad)?.split(' ');
        let mut next = || -> std::result::Result<u64, String> {
            fields.next().and_then(|f| f.parse().ok()).ok_or_else(bad)
        };
        let (count, period_us, burst, interval) = (next()?, next()?, next()?, next()?);
        if fields.next().is_some() {
            return Err(bad());
        }
        let rate =
            Rate::new(count, Duration::from_micros(period_us)).map_err(|err| err.to_string())?;
        let quota = Quota::new(rate, Some(burst)).map_err(|err| err.to_string())?;
        if rate.interval_ns() != interval {
            return Err(format!(
                "{stored:?}: the interval {interval} ns is not that of {count} per {period_us} µs"
            ));
        }
        Ok(quota)
    }

    /// `limit` with this override's rate and burst (a window algorithm's capacity is the
    /// rate's count), or `None` when the override does not fit its algorithm (a sliding
    /// log's count above [`MAX_SLIDING_WINDOW_COUNT`](crate::values::MAX_SLIDING_WINDOW_COUNT)).
    /// Not validated again otherwise: a cost above the new burst is a call that is rejected,
    /// as the scripts reject it.
    pub(crate) fn apply(&self, limit: &Limit) -> Option<Limit> {
        if limit.algorithm == crate::values::Algorithm::SlidingWindow
            && self.rate.count() > crate::values::MAX_SLIDING_WINDOW_COUNT
        {
            return None;
        }
        let mut limit = limit.clone();
        limit.rate = self.rate;
        limit.burst = if limit.algorithm.is_window() {
            self.rate.count()
        } else {
            self.burst
        };
        Some(limit)
    }
}

/// How long an override lasts: every override has a TTL or is explicitly permanent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaTtl {
    /// Removed by the store after this long (1 s to [`MAX_QUOTA_TTL`]).
    For(Duration),
    /// Kept until cleared.
    Permanent,
}

impl QuotaTtl {
    /// Checks the bounds.
    pub(crate) fn check(self) -> Result<Option<Duration>> {
        match self {
            QuotaTtl::Permanent => Ok(None),
            QuotaTtl::For(ttl) if ttl < Duration::from_secs(1) => Err(Error::InvalidLimit(
                format!("an override's TTL of {ttl:?} is below the minimum of 1s"),
            )),
            QuotaTtl::For(ttl) if ttl > MAX_QUOTA_TTL => Err(Error::InvalidLimit(format!(
                "an override's TTL of {ttl:?} is above the maximum of 365 days; make it \
                 permanent explicitly if it should stay"
            ))),
            QuotaTtl::For(ttl) => Ok(Some(ttl)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::Algorithm;

    #[test]
    fn the_stored_form_reads_back() {
        for (rate, burst) in [("100/s", Some(200)), ("7/s", None), ("3/30d", Some(1))] {
            let quota = Quota::new(rate, burst).unwrap();
            assert_eq!(Quota::decode(&quota.encode()), Ok(quota), "{rate}");
        }
    }

    #[test]
    fn hand_written_values_are_refused() {
        for bad in [
            "",
            "100/s",
            "q1 100 1000000 200",
            "q1 100 1000000 200 10000000 1",
            "q1 100 1000000 0 10000000",
            "q1 0 1000000 1 10000000",
            "q1 100 1000000 200 1",
            "q1 -1 1000000 200 10000000",
            "q2 100 1000000 200 10000000",
        ] {
            assert!(Quota::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_window_algorithm_takes_the_count() {
        let quota = Quota::new("50/min", Some(80)).unwrap();
        let code = Limit::new(
            Algorithm::FixedWindow,
            Rate::per_second(5),
            None,
            1,
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(quota.apply(&code).unwrap().burst(), 50);
        let code = Limit::new(
            Algorithm::Gcra,
            Rate::per_second(5),
            None,
            1,
            Duration::ZERO,
        )
        .unwrap();
        assert_eq!(quota.apply(&code).unwrap().burst(), 80);
    }
}
