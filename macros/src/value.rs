//! Compile-time literals: durations (`"300ms"`, `"5s"`, `"10m"`, `"1h"`, `"2d"`, or a bare
//! integer of seconds) and rates (`"100/s"`, `"5/10s"`, `"1000/min"`, `"50000/h"`).

use std::time::Duration;

const UNITS: &str = "use one of ms, s, m (or min), h, d";

fn unit(name: &str) -> Option<Duration> {
    Some(match name {
        "ms" => Duration::from_millis(1),
        "s" => Duration::from_secs(1),
        "m" | "min" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        "d" => Duration::from_secs(86_400),
        _ => return None,
    })
}

/// Splits `"300ms"` into (`Some(300)`, `"ms"`); the number is optional (`"s"` in `"5/s"`).
fn split_number(s: &str) -> Result<(Option<u64>, &str), String> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, rest) = s.split_at(digits);
    let number = match number {
        "" => None,
        n => Some(
            n.parse::<u64>()
                .map_err(|_| format!("`{n}` is too large"))?,
        ),
    };
    Ok((number, rest))
}

fn scaled(count: u64, unit: Duration) -> Result<Duration, String> {
    u32::try_from(count)
        .ok()
        .and_then(|n| unit.checked_mul(n))
        .ok_or_else(|| format!("`{count}` is too large"))
}

/// Parses a duration literal such as `"300ms"` or `"5s"`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit_name) = split_number(s.trim())?;
    let Some(number) = number else {
        return Err(format!(
            "`{s}` is not a duration; write a number and a unit, e.g. \"300ms\" or \"5s\""
        ));
    };
    let Some(unit) = unit(unit_name) else {
        return Err(format!("`{s}` has no valid unit; {UNITS}, e.g. \"300ms\""));
    };
    scaled(number, unit)
}

/// A rate: `count` events per `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rate {
    pub(crate) count: u64,
    pub(crate) period: Duration,
}

impl Rate {
    /// The runtime's emission interval in ns (`redguard::Rate`, kept in step): period/count
    /// rounded up to a whole µs from 1 ms up, to a whole ns below.
    pub(crate) fn interval_ns(&self) -> u128 {
        let (period, count) = (self.period.as_nanos(), u128::from(self.count));
        if period >= 1_000_000 * count {
            period.div_ceil(1000 * count) * 1000
        } else {
            period.div_ceil(count)
        }
    }

    /// Why the runtime would refuse this rate's interval: counted in whole nanoseconds, it
    /// would run more than 0.1% slow (only possible above 1,000,000 per second).
    pub(crate) fn too_fine(&self) -> Option<String> {
        let exact = self.period.as_nanos();
        let slower = self.interval_ns() * u128::from(self.count) - exact;
        (slower * 1000 > exact).then(|| {
            let counted = self.interval_ns() * u128::from(self.count);
            format!(
                "one unit every {:.3} ns, counted in whole nanoseconds ({} ns), would admit \
                 {:.2}% fewer than asked (0.1% at most); use a rate whose interval is close to \
                 a whole number of nanoseconds (e.g. \"500000000/s\", 2 ns), or at most \
                 \"1000000/s\"",
                exact as f64 / self.count as f64,
                self.interval_ns(),
                slower as f64 * 100.0 / counted as f64,
            )
        })
    }
}

/// Parses a rate literal such as `"100/s"` or `"5/10s"`.
pub(crate) fn parse_rate(s: &str) -> Result<Rate, String> {
    let shape = || format!("`{s}` is not a rate; write count/period, e.g. \"100/s\" or \"5/10s\"");
    let (count, period) = s.trim().split_once('/').ok_or_else(shape)?;
    let count = match split_number(count.trim())? {
        (Some(count), "") => count,
        _ => return Err(shape()),
    };
    let (periods, unit_name) = split_number(period.trim())?;
    let Some(unit) = unit(unit_name) else {
        return Err(format!(
            "`{s}` has no valid period unit; {UNITS}, e.g. \"100/s\""
        ));
    };
    let period = scaled(periods.unwrap_or(1), unit)?;
    if count == 0 {
        return Err(format!(
            "`{s}` allows nothing; the count must be at least 1"
        ));
    }
    if period.is_zero() {
        return Err(format!("`{s}` has an empty period"));
    }
    Ok(Rate { count, period })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("10min"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in [
            "",
            "ms",
            "5",
            "5 sec",
            "5x",
            "-5s",
            "1.5s",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rates() {
        let rate = |count, secs| {
            Ok(Rate {
                count,
                period: Duration::from_secs(secs),
            })
        };
        assert_eq!(parse_rate("100/s"), rate(100, 1));
        assert_eq!(parse_rate("5/10s"), rate(5, 10));
        assert_eq!(parse_rate("1000/min"), rate(1000, 60));
        assert_eq!(parse_rate("50000/h"), rate(50_000, 3600));
        for bad in [
            "", "100", "100/", "/s", "0/s", "5/0s", "x/s", "5/sec", "5/ 1 s",
        ] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn intervals() {
        let rate = |s| parse_rate(s).unwrap();
        assert_eq!(rate("3/s").interval_ns(), 333_334_000);
        assert_eq!(rate("600000/s").interval_ns(), 1667);
        assert_eq!(rate("1000000000/s").interval_ns(), 1);
        for fine in [
            "1000000/s",
            "1000001/s",
            "500000000/s",
            "1000000000/s",
            "7/20ms",
        ] {
            assert_eq!(rate(fine).too_fine(), None, "{fine}");
        }
        for coarse in ["3000000/s", "700000000/s", "1000000000/ms", "3000/ms"] {
            assert!(rate(coarse).too_fine().is_some(), "{coarse}");
        }
    }
}
