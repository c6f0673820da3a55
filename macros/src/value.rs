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
}
