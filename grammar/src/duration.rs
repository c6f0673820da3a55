//! Durations: `"300ms"`, `"5s"`, `"10m"` (or `"10min"`), `"1h"`, `"2d"`.

use std::time::Duration;

const UNITS: &str = "use one of ms, s, m (or min), h, d";

/// The length of a unit name.
pub fn unit(name: &str) -> Option<Duration> {
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
pub(crate) fn split_number(s: &str) -> Result<(Option<u64>, &str), String> {
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

/// `count` units, if representable.
pub(crate) fn scaled(count: u64, unit: Duration) -> Result<Duration, String> {
    u32::try_from(count)
        .ok()
        .and_then(|n| unit.checked_mul(n))
        .ok_or_else(|| format!("`{count}` is too large"))
}

/// Parses a duration such as `"300ms"` or `"5s"`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(redguard_grammar::duration::parse("300ms"), Ok(Duration::from_millis(300)));
/// assert!(redguard_grammar::duration::parse("5 sec").is_err());
/// ```
pub fn parse(s: &str) -> Result<Duration, String> {
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

pub(crate) fn units_hint() -> &'static str {
    UNITS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("10min"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
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
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
