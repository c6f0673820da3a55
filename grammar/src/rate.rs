//! Rates (`"100/s"`, `"5/10s"`, `"1000/min"`) and the bounds of a rate limit's settings.

use std::time::Duration;

use crate::duration::{scaled, split_number, unit, units_hint};

/// Largest count of a rate, a burst or a cost. With the burst × interval bound below, keeps
/// every quantity a script computes far below 2^53, where Lua's numbers stop being exact.
pub const MAX_RATE_COUNT: u64 = 1_000_000_000;
/// Largest count of a `sliding_window` (exact log) limit: it keeps one entry per admitted call
/// in the window, and a full log is freed in one step when its key expires (≈ 1 ms and 1 MB
/// at this count, ten times that at ten times the count).
pub const MAX_SLIDING_WINDOW_COUNT: u64 = 10_000;
/// Shortest period of a rate.
pub const MIN_RATE_PERIOD: Duration = Duration::from_millis(1);
/// Longest period of a rate, and longest `block`: 30 days.
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(30 * 86_400);
/// Longest `wait` of a rate-limited call: holding a caller for minutes is a bug, not a limit.
pub const MAX_RATE_WAIT: Duration = Duration::from_secs(60);

/// `count` events per `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Events per period.
    pub count: u64,
    /// The period.
    pub period: Duration,
}

/// How an algorithm counts, as far as its settings' bounds go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `gcra`, `token_bucket`, `leaky_bucket`: refill at the rate up to a burst.
    Bucket,
    /// `fixed_window`, `sliding_counter`: the rate's count per window, no burst.
    Window,
    /// `sliding_window`: the rate's count per window, one entry per call.
    Log,
}

/// Parses a rate such as `"100/s"`, and checks it (see [`check`]).
///
/// ```
/// use std::time::Duration;
/// use redguard_grammar::rate::{Rate, parse};
/// assert_eq!(parse("5/10s"), Ok(Rate { count: 5, period: Duration::from_secs(10) }));
/// assert!(parse("0/s").is_err());
/// ```
pub fn parse(s: &str) -> Result<Rate, String> {
    let shape = || {
        format!(
            "`{s}` is not a rate; write count/period, e.g. \"100/s\", \"5/10s\", \"1000/min\" \
             or \"50000/h\""
        )
    };
    let (count, period) = s.trim().split_once('/').ok_or_else(shape)?;
    let count = match split_number(count.trim()).map_err(|why| format!("in `{s}`, {why}"))? {
        (Some(count), "") => count,
        _ => return Err(shape()),
    };
    let (periods, unit_name) =
        split_number(period.trim()).map_err(|why| format!("in `{s}`, {why}"))?;
    let Some(unit) = unit(unit_name) else {
        return Err(format!(
            "`{s}` has no valid period unit; {}, e.g. \"100/s\"",
            units_hint()
        ));
    };
    let period = scaled(periods.unwrap_or(1), unit).map_err(|why| format!("in `{s}`, {why}"))?;
    check(count, period)?;
    Ok(Rate { count, period })
}

/// Checks a rate: a count of 1 to [`MAX_RATE_COUNT`], a period of [`MIN_RATE_PERIOD`] to
/// [`MAX_RATE_PERIOD`], and an emission interval ([`interval_ns`]) within 0.1% of the exact
/// one (only rates above 1,000,000/s can miss it).
pub fn check(count: u64, period: Duration) -> Result<(), String> {
    if count == 0 {
        return Err(format!(
            "a rate of 0 per {period:?} allows nothing; the count must be at least 1"
        ));
    }
    if count > MAX_RATE_COUNT {
        return Err(format!(
            "a rate count of {count} is above the maximum {MAX_RATE_COUNT}"
        ));
    }
    if period < MIN_RATE_PERIOD || period > MAX_RATE_PERIOD {
        return Err(format!(
            "a rate period of {period:?} is outside 1ms..=30 days"
        ));
    }
    let interval = u128::from(interval_ns(count, period));
    let exact = period.as_nanos();
    // How much longer the counted interval is than the exact one, over all `count` units.
    let counted = interval * u128::from(count);
    let slower = counted - exact;
    if slower * 1000 > exact {
        return Err(format!(
            "a rate of {count} per {period:?} is one unit every {:.3} ns, which counted in \
             whole nanoseconds ({interval} ns) would admit {:.2}% fewer than asked (0.1% at \
             most); choose a rate whose interval is close to a whole number of nanoseconds \
             (e.g. 500000000/s, 2 ns), or at most 1000000/s",
            exact as f64 / count as f64,
            slower as f64 * 100.0 / counted as f64,
        ));
    }
    Ok(())
}

/// The emission interval: the time one unit takes to come back, period/count rounded up — to
/// a whole µs when it is at least 1 ms, to a whole ns below. Never looser than asked.
pub fn interval_ns(count: u64, period: Duration) -> u64 {
    // In u64 when it fits, as every accepted rate does: a u128 division is a library call,
    // and a rate check asks for its interval more than once.
    let count = count.max(1);
    if let (Ok(period), Some(micro)) = (
        u64::try_from(period.as_nanos()),
        count.checked_mul(1_000_000),
    ) {
        let interval = if period >= micro {
            period.div_ceil(1000 * count).checked_mul(1000)
        } else {
            Some(period.div_ceil(count))
        };
        if let Some(interval) = interval {
            return interval;
        }
    }
    interval_ns_wide(count, period)
}

/// [`interval_ns`] in u128, for any `count` and `period`.
fn interval_ns_wide(count: u64, period: Duration) -> u64 {
    let (period, count) = (period.as_nanos(), u128::from(count.max(1)));
    let interval = if period >= 1_000_000 * count {
        period.div_ceil(1000 * count) * 1000
    } else {
        period.div_ceil(count)
    };
    // At most MAX_RATE_PERIOD (2.6e15 ns) per unit.
    u64::try_from(interval).unwrap_or(u64::MAX)
}

/// Checks a burst: 1 to [`MAX_RATE_COUNT`].
pub fn burst(burst: u64) -> Result<(), String> {
    match burst {
        0 => Err("a burst of 0 admits nothing; the burst must be at least 1".to_owned()),
        burst if burst > MAX_RATE_COUNT => Err(format!(
            "a burst of {burst} is above the maximum {MAX_RATE_COUNT}"
        )),
        _ => Ok(()),
    }
}

/// Checks a cost: 1 to [`MAX_RATE_COUNT`].
pub fn cost(cost: u64) -> Result<(), String> {
    match cost {
        0 => Err(
            "a cost of 0 is not a check; the cost must be at least 1 (use `peek` to look \
             without consuming)"
                .to_owned(),
        ),
        cost if cost > MAX_RATE_COUNT => Err(format!(
            "a cost of {cost} is above the maximum {MAX_RATE_COUNT}"
        )),
        _ => Ok(()),
    }
}

/// Checks that a call of `cost` fits the capacity (a burst, or a window's count).
pub fn cost_fits(cost: u64, capacity: u64) -> Result<(), String> {
    if cost > capacity {
        return Err(format!(
            "a cost of {cost} exceeds the burst of {capacity}: such a call could never be \
             admitted; raise the burst or lower the cost"
        ));
    }
    Ok(())
}

/// Checks that `burst` units at `rate` span a time the scripts count exactly: a debt of at
/// most the burst and the cost, counted in µs (in ns for intervals below 1 ms, which keeps it
/// below 1e15 ns whatever the burst), stays below 2^51.
pub fn span(burst: u64, rate: Rate) -> Result<(), String> {
    let interval = u128::from(interval_ns(rate.count, rate.period));
    if u128::from(burst) * interval > 1000 << 50 {
        return Err(format!(
            "a burst of {burst} at {} per {:?} spans more than 35 years; lower the burst or the \
             period",
            rate.count, rate.period
        ));
    }
    Ok(())
}

/// Checks a window algorithm's count (the `sliding_window` log keeps one entry per call).
pub fn window_count(shape: Shape, rate: Rate) -> Result<(), String> {
    if shape == Shape::Log && rate.count > MAX_SLIDING_WINDOW_COUNT {
        return Err(format!(
            "`sliding_window` keeps one entry per call, up to the count: {} per {:?} is above \
             its maximum of {MAX_SLIDING_WINDOW_COUNT}; use `sliding_counter` or `gcra` for \
             larger counts",
            rate.count, rate.period
        ));
    }
    Ok(())
}

/// Checks a penalty's length.
pub fn block(block: Duration) -> Result<(), String> {
    if block > MAX_RATE_PERIOD {
        return Err(format!(
            "a block of {block:?} is longer than the maximum of 30 days"
        ));
    }
    Ok(())
}

/// Checks how long a rate-limited call may wait.
pub fn wait(wait: Duration) -> Result<(), String> {
    if wait > MAX_RATE_WAIT {
        return Err(format!(
            "a rate-limited call may wait at most {MAX_RATE_WAIT:?}, got {wait:?}"
        ));
    }
    Ok(())
}

/// Checks a whole limit and returns its capacity: the burst (default: the rate's count) of a
/// bucket algorithm, the rate's count of a window one (which takes no other burst).
pub fn limit(
    shape: Shape,
    rate: Rate,
    burst: Option<u64>,
    cost: u64,
    block: Duration,
) -> Result<u64, String> {
    check(rate.count, rate.period)?;
    window_count(shape, rate)?;
    let capacity = match burst {
        Some(burst) if shape != Shape::Bucket && burst != rate.count => {
            return Err(format!(
                "a window algorithm admits the rate's count per period and takes no burst; set \
                 the rate (e.g. \"{burst}/{}ms\") instead of burst = {burst}",
                rate.period.as_millis()
            ));
        }
        Some(burst) => {
            self::burst(burst)?;
            burst
        }
        None => rate.count,
    };
    self::cost(cost)?;
    cost_fits(cost, capacity)?;
    span(capacity, rate)?;
    self::block(block)?;
    Ok(capacity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        let rate = |count, secs| {
            Ok(Rate {
                count,
                period: Duration::from_secs(secs),
            })
        };
        assert_eq!(parse("100/s"), rate(100, 1));
        assert_eq!(parse("5/10s"), rate(5, 10));
        assert_eq!(parse("1000/min"), rate(1000, 60));
        assert_eq!(parse("50000/h"), rate(50_000, 3600));
        assert_eq!(parse(" 7 / 2m "), rate(7, 120));
        for bad in [
            "",
            "100",
            "100/",
            "/s",
            "0/s",
            "5/0s",
            "x/s",
            "5/sec",
            "5/ 1 s",
            "-1/s",
            "+1/s",
            "1.5/s",
            "99999999999999999999/s",
            "5/99999999999s",
            "2000000000/s",
            "1/31d",
            "3000000/s",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn intervals() {
        let per_second = |count| interval_ns(count, Duration::from_secs(1));
        assert_eq!(per_second(3), 333_334_000);
        assert_eq!(per_second(1_000_000), 1_000);
        assert_eq!(per_second(600_000), 1_667);
        assert_eq!(per_second(1_000_000_000), 1);
    }

    #[test]
    fn intervals_in_u64_are_those_in_u128() {
        let periods = [
            Duration::from_nanos(1),
            Duration::from_nanos(999),
            Duration::from_micros(1),
            Duration::from_nanos(999_999),
            Duration::from_millis(1),
            Duration::from_nanos(1_000_001),
            Duration::from_secs(1),
            Duration::from_secs(7) + Duration::from_nanos(3),
            MAX_RATE_PERIOD,
            Duration::from_nanos(u64::MAX - 1),
            Duration::from_nanos(u64::MAX),
            Duration::from_secs(u64::MAX),
        ];
        let counts = [
            0,
            1,
            2,
            3,
            7,
            999,
            1000,
            1001,
            1_000_000,
            MAX_RATE_COUNT,
            u64::MAX / 1_000_000,
            u64::MAX / 1_000_000 + 1,
            u64::MAX,
        ];
        for period in periods {
            for count in counts {
                assert_eq!(
                    interval_ns(count, period),
                    interval_ns_wide(count, period),
                    "{count} per {period:?}"
                );
            }
        }
    }

    #[test]
    fn limits() {
        let five = Rate {
            count: 5,
            period: Duration::from_secs(1),
        };
        let gcra = |burst, cost| limit(Shape::Bucket, five, burst, cost, Duration::ZERO);
        assert_eq!(gcra(None, 1), Ok(5));
        assert!(gcra(Some(0), 1).is_err());
        assert!(gcra(Some(10), 0).is_err());
        assert!(gcra(Some(10), 11).is_err());
        assert!(gcra(None, 6).is_err());
        assert!(limit(Shape::Window, five, Some(10), 1, Duration::ZERO).is_err());
        assert_eq!(
            limit(Shape::Window, five, Some(5), 1, Duration::ZERO),
            Ok(5)
        );
        let slow = Rate {
            count: 1,
            period: MAX_RATE_PERIOD,
        };
        assert!(limit(Shape::Bucket, slow, Some(MAX_RATE_COUNT), 1, Duration::ZERO).is_err());
        let big = Rate {
            count: MAX_SLIDING_WINDOW_COUNT + 1,
            period: Duration::from_secs(1),
        };
        assert!(limit(Shape::Log, big, None, 1, Duration::ZERO).is_err());
        assert!(limit(Shape::Window, big, None, 1, Duration::ZERO).is_ok());
    }
}
