//! What a limit is: a [`Rate`], an [`Algorithm`], a burst and a cost, validated into a
//! [`Limit`] before anything reaches the store.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use redguard_grammar::rate as grammar;

use crate::error::{Error, Result};

pub use redguard_grammar::rate::{MAX_RATE_COUNT, MAX_RATE_PERIOD, MAX_SLIDING_WINDOW_COUNT};

/// `count` events per `period`: `"100/s"`, `"5/10s"`, `"1000/min"`, `"50000/h"`.
///
/// ```
/// use std::time::Duration;
/// use redguard::rate::Rate;
///
/// let rate: Rate = "5/10s".parse()?;
/// assert_eq!((rate.count(), rate.period()), (5, Duration::from_secs(10)));
/// assert_eq!(Rate::per_minute(1000), "1000/min".parse()?);
///
/// // Values from configuration are checked, never trusted: an error, not a panic.
/// assert!("0/s".parse::<Rate>().is_err());
/// assert!("100 per second".parse::<Rate>().is_err());
/// # Ok::<(), redguard::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    count: u64,
    period: Duration,
}

impl Rate {
    /// `count` per `period`; `count` in 1..=[`MAX_RATE_COUNT`], `period` from 1 ms to
    /// [`MAX_RATE_PERIOD`], and an emission interval (`period / count`) within 0.1% of what
    /// the stores count in: whole microseconds from 1 ms up, whole nanoseconds below. Every
    /// rate up to 1,000,000 per second meets that; above, the interval must be close to a
    /// whole number of nanoseconds (`"500000000/s"`, 2 ns, is accepted; `"3000000/s"`,
    /// 333.3 ns, would run 0.2% slow and is refused).
    pub fn new(count: u64, period: Duration) -> Result<Rate> {
        grammar::check(count, period).map_err(Error::InvalidLimit)?;
        Ok(Rate { count, period })
    }

    /// `count` per second.
    ///
    /// # Panics
    /// When [`Rate::new`] would refuse it (`count` 0 or above [`MAX_RATE_COUNT`], or too fine
    /// to count within 0.1%); use [`Rate::new`] for values from configuration.
    pub fn per_second(count: u64) -> Rate {
        Self::known(count, Duration::from_secs(1))
    }

    /// `count` per minute (panics like [`Rate::per_second`]).
    pub fn per_minute(count: u64) -> Rate {
        Self::known(count, Duration::from_secs(60))
    }

    /// `count` per hour (panics like [`Rate::per_second`]).
    pub fn per_hour(count: u64) -> Rate {
        Self::known(count, Duration::from_secs(3600))
    }

    fn known(count: u64, period: Duration) -> Rate {
        match Rate::new(count, period) {
            Ok(rate) => rate,
            Err(err) => panic!("{err}"),
        }
    }

    /// A rate the macro already validated at compile time.
    #[doc(hidden)]
    pub const fn __checked(count: u64, period_ms: u64) -> Rate {
        Rate {
            count,
            period: Duration::from_millis(period_ms),
        }
    }

    /// Events per period.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The emission interval, the time one unit of cost takes to come back, in ns: `period /
    /// count` rounded up to a whole microsecond when it is at least 1 ms (the stores then
    /// count in µs, as Redis's clock does), to a whole nanosecond below. Rounding up keeps a
    /// limiter stricter than the exact rate, never looser: by less than 1 µs per unit from
    /// 1 ms up (< 0.1%), by less than 1 ns below, which [`Rate::new`] bounds to 0.1%.
    pub(crate) fn interval_ns(&self) -> u64 {
        grammar::interval_ns(self.count, self.period)
    }
}

impl FromStr for Rate {
    type Err = Error;

    fn from_str(s: &str) -> Result<Rate> {
        if let Some(rate) = LAST_PARSED.with(|last| last.get().and_then(|last| last.rate(s))) {
            return Ok(rate);
        }
        let grammar::Rate { count, period } = grammar::parse(s).map_err(Error::InvalidLimit)?;
        let rate = Rate { count, period };
        if let Some(parsed) = Parsed::new(s, rate) {
            LAST_PARSED.with(|last| last.set(Some(parsed)));
        }
        Ok(rate)
    }
}

/// Longest rate text [`LAST_PARSED`] keeps.
const PARSED_LEN: usize = 24;

/// A rate text and what it parsed to.
#[derive(Debug, Clone, Copy)]
struct Parsed {
    text: [u8; PARSED_LEN],
    len: usize,
    rate: Rate,
}

impl Parsed {
    fn new(s: &str, rate: Rate) -> Option<Parsed> {
        let mut text = [0; PARSED_LEN];
        text.get_mut(..s.len())?.copy_from_slice(s.as_bytes());
        Some(Parsed {
            text,
            len: s.len(),
            rate,
        })
    }

    fn rate(&self, s: &str) -> Option<Rate> {
        (self.text[..self.len] == *s.as_bytes()).then_some(self.rate)
    }
}

thread_local! {
    /// The last rate text parsed on this thread: a limiter built per call (`.rate("100/s")`
    /// in a handler) parses its literal once, and the parse is a pure function of the text.
    static LAST_PARSED: std::cell::Cell<Option<Parsed>> = const { std::cell::Cell::new(None) };
}

impl TryFrom<&str> for Rate {
    type Error = Error;
    fn try_from(s: &str) -> Result<Rate> {
        s.parse()
    }
}

impl TryFrom<&String> for Rate {
    type Error = Error;
    fn try_from(s: &String) -> Result<Rate> {
        s.parse()
    }
}

impl TryFrom<String> for Rate {
    type Error = Error;
    fn try_from(s: String) -> Result<Rate> {
        s.parse()
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.period.as_millis();
        match ms {
            1000 => write!(f, "{}/s", self.count),
            60_000 => write!(f, "{}/min", self.count),
            3_600_000 => write!(f, "{}/h", self.count),
            ms if ms % 1000 == 0 => write!(f, "{}/{}s", self.count, ms / 1000),
            ms => write!(f, "{}/{}ms", self.count, ms),
        }
    }
}

/// What [`Limiter::rate`](crate::rate::Limiter::rate) accepts: a [`Rate`], or text such as `"100/s"` from configuration
/// (checked when the limiter runs: a bad value is [`Error::InvalidLimit`], never a panic).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a rate",
    label = "expected a `redguard::rate::Rate`, or text such as \"100/s\"",
    note = "build one with `redguard::rate::Rate::new(count, period)` or `Rate::per_second(n)`, or \
            pass the configured text (`&str` / `String`)"
)]
pub trait IntoRate {
    /// The rate, or why the value is not one.
    fn into_rate(self) -> Result<Rate>;
}

impl IntoRate for Rate {
    fn into_rate(self) -> Result<Rate> {
        Ok(self)
    }
}

impl IntoRate for &Rate {
    fn into_rate(self) -> Result<Rate> {
        Ok(*self)
    }
}

impl IntoRate for &str {
    fn into_rate(self) -> Result<Rate> {
        self.parse()
    }
}

impl IntoRate for String {
    fn into_rate(self) -> Result<Rate> {
        self.parse()
    }
}

impl IntoRate for &String {
    fn into_rate(self) -> Result<Rate> {
        self.parse()
    }
}

/// How a limit counts. All read time from the store (Redis's `TIME`), never the client.
///
/// | algorithm | state per key | bound on admitted calls |
/// |---|---|---|
/// | [`Gcra`](Algorithm::Gcra) (default) | one integer | any interval t: ≤ burst + rate·t |
/// | [`TokenBucket`](Algorithm::TokenBucket) | tokens + timestamp | any interval t: ≤ burst + rate·t |
/// | [`LeakyBucket`](Algorithm::LeakyBucket) | level + timestamp | any interval t: ≤ burst + rate·t |
/// | [`SlidingWindow`](Algorithm::SlidingWindow) | one entry per admitted call (count ≤ [`MAX_SLIDING_WINDOW_COUNT`]) | any window-long interval: ≤ count |
/// | [`SlidingCounter`](Algorithm::SlidingCounter) | two counters | ≤ count if the previous window's traffic was even; < 2·count in the worst case |
/// | [`FixedWindow`](Algorithm::FixedWindow) | one counter | each window: ≤ count; across an edge up to 2·count |
///
/// The window algorithms admit `rate.count()` per `rate.period()` and take no burst; the
/// others refill at `rate` up to `burst` (default: `rate.count()`).
///
/// ```
/// use redguard::rate::Algorithm;
/// assert_eq!("sliding_window".parse::<Algorithm>()?, Algorithm::SlidingWindow);
/// assert_eq!(Algorithm::default(), Algorithm::Gcra);
/// # Ok::<(), redguard::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// Generic cell rate algorithm: one key holding the theoretical arrival time.
    #[default]
    Gcra,
    /// A counter per aligned window.
    FixedWindow,
    /// A log of admitted calls and their costs (sorted set): exact, memory grows with the
    /// calls in a window (count at most [`MAX_SLIDING_WINDOW_COUNT`]).
    SlidingWindow,
    /// The previous and current window's counters, weighted: approximate, O(1) memory.
    SlidingCounter,
    /// Tokens refilled at the rate up to the burst.
    TokenBucket,
    /// A bucket draining at the rate, holding up to the burst (the "meter" form).
    LeakyBucket,
}

impl Algorithm {
    /// Every algorithm, in the order of the table above.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::SlidingWindow,
        Algorithm::SlidingCounter,
        Algorithm::FixedWindow,
    ];

    /// The name used in attributes and scripts: `gcra`, `fixed_window`, ….
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Gcra => "gcra",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingCounter => "sliding_counter",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
        }
    }

    /// True for the window algorithms, which take no burst.
    pub fn is_window(self) -> bool {
        matches!(
            self,
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingCounter
        )
    }
}

impl FromStr for Algorithm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|algorithm| algorithm.as_str() == s)
            .ok_or_else(|| {
                Error::InvalidLimit(format!(
                    "unknown rate-limit algorithm `{s}`; expected one of gcra, fixed_window, \
                     sliding_window, sliding_counter, token_bucket, leaky_bucket"
                ))
            })
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// What [`Limit::new`] was last asked on this thread and the burst it validated.
type Validated = ((Algorithm, Rate, Option<u64>, u64, Duration), u64);

thread_local! {
    /// The last limit validated on this thread: a limiter built per call validates its
    /// limit once, and the validation is a pure function of its arguments.
    static LAST_LIMIT: std::cell::Cell<Option<Validated>> = const { std::cell::Cell::new(None) };
}

/// One validated limit on one key's counting: what a store checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub(crate) algorithm: Algorithm,
    pub(crate) rate: Rate,
    pub(crate) burst: u64,
    pub(crate) cost: u64,
    pub(crate) block: Duration,
}

impl Limit {
    /// Validates a limit. `burst` defaults to `rate.count()` and is refused for window
    /// algorithms; `cost` must not exceed the burst (such a call could never be admitted);
    /// `block` (zero for none, at most 30 days) is how long a key that exceeded its limit
    /// stays rejected. A sliding window's count is at most [`MAX_SLIDING_WINDOW_COUNT`], and
    /// the burst must refill within 2^50 µs (35 years: burst × the rate's interval), which
    /// keeps every quantity the stores compute exact.
    ///
    /// ```
    /// use redguard::{rate::Algorithm, rate::Limit, rate::Rate};
    /// let limit = Limit::new(Algorithm::Gcra, Rate::per_second(5), Some(10), 1, Default::default())?;
    /// assert_eq!(limit.burst(), 10);
    /// let too_costly = Limit::new(Algorithm::Gcra, Rate::per_second(5), Some(10), 11, Default::default());
    /// assert!(too_costly.is_err());
    /// # Ok::<(), redguard::Error>(())
    /// ```
    pub fn new(
        algorithm: Algorithm,
        rate: Rate,
        burst: Option<u64>,
        cost: u64,
        block: Duration,
    ) -> Result<Limit> {
        let shape = match algorithm {
            Algorithm::SlidingWindow => grammar::Shape::Log,
            algorithm if algorithm.is_window() => grammar::Shape::Window,
            _ => grammar::Shape::Bucket,
        };
        let asked = (algorithm, rate, burst, cost, block);
        let known = LAST_LIMIT.with(|last| last.get().filter(|(was, _)| *was == asked));
        let burst = match known {
            Some((_, burst)) => burst,
            None => {
                let spec = grammar::Rate {
                    count: rate.count,
                    period: rate.period,
                };
                let burst =
                    grammar::limit(shape, spec, burst, cost, block).map_err(Error::InvalidLimit)?;
                LAST_LIMIT.with(|last| last.set(Some((asked, burst))));
                burst
            }
        };
        Ok(Limit {
            algorithm,
            rate,
            burst,
            cost,
            block,
        })
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The capacity: the burst for bucket algorithms, `rate.count()` for window ones.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Units this call consumes.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// How long a key that exceeded this limit stays rejected (zero: no penalty).
    pub fn block(&self) -> Duration {
        self.block
    }

    /// The time the full capacity takes to come back: the `w` of `RateLimit-Policy`.
    pub(crate) fn window(&self) -> Duration {
        if self.algorithm.is_window() {
            self.rate.period
        } else {
            Duration::from_nanos(self.burst.saturating_mul(self.rate.interval_ns()))
        }
    }
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithms_by_name() {
        for algorithm in Algorithm::ALL {
            assert_eq!(algorithm.as_str().parse::<Algorithm>().unwrap(), algorithm);
            assert_eq!(format!("{algorithm:>16}").trim_start(), algorithm.as_str());
        }
        let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(
            names,
            [
                "gcra",
                "token_bucket",
                "leaky_bucket",
                "sliding_window",
                "sliding_counter",
                "fixed_window"
            ]
        );
        let windows: Vec<bool> = Algorithm::ALL.iter().map(|a| a.is_window()).collect();
        assert_eq!(windows, [false, false, false, true, true, true]);
        assert!(matches!(
            "GCRA".parse::<Algorithm>(),
            Err(Error::InvalidLimit(why)) if why.contains("`GCRA`")
        ));
    }

    #[test]
    fn rates_display_as_written() {
        for (text, shown) in [
            ("5/s", "5/s"),
            ("5/min", "5/min"),
            ("5/h", "5/h"),
            ("5/10s", "5/10s"),
            ("5/1500ms", "5/1500ms"),
            ("5/d", "5/86400s"),
        ] {
            let rate: Rate = text.parse().unwrap();
            assert_eq!(rate.to_string(), shown);
            assert_eq!(rate.to_string().parse::<Rate>().unwrap(), rate);
        }
        let rate = Rate::new(7, Duration::from_millis(250)).unwrap();
        assert_eq!(
            (rate.count(), rate.period()),
            (7, Duration::from_millis(250))
        );
    }

    #[test]
    fn a_limit_keeps_its_settings() {
        let rate = Rate::new(10, Duration::from_secs(1)).unwrap();
        let limit = Limit::new(
            Algorithm::TokenBucket,
            rate,
            Some(20),
            3,
            Duration::from_secs(9),
        )
        .unwrap();
        assert_eq!(limit.algorithm(), Algorithm::TokenBucket);
        assert_eq!(limit.rate(), rate);
        assert_eq!((limit.burst(), limit.cost()), (20, 3));
        assert_eq!(limit.block(), Duration::from_secs(9));
        // The full burst comes back in burst × interval; a window in its period.
        assert_eq!(limit.window(), Duration::from_secs(2));
        let window = Limit::new(Algorithm::FixedWindow, rate, None, 1, Duration::ZERO).unwrap();
        assert_eq!(window.window(), Duration::from_secs(1));
        assert_eq!(micros(Duration::from_millis(3)), 3000);
        assert_eq!(micros(Duration::MAX), u64::MAX);
    }

    #[test]
    fn rates() {
        let rate = |count, secs| Rate::new(count, Duration::from_secs(secs)).unwrap();
        assert_eq!("100/s".parse::<Rate>().unwrap(), rate(100, 1));
        assert_eq!("5/10s".parse::<Rate>().unwrap(), rate(5, 10));
        assert_eq!("1000/min".parse::<Rate>().unwrap(), rate(1000, 60));
        assert_eq!("50000/h".parse::<Rate>().unwrap(), rate(50_000, 3600));
        assert_eq!(" 7 / 2m ".parse::<Rate>().unwrap(), rate(7, 120));
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
        ] {
            let err = bad.parse::<Rate>().unwrap_err();
            assert!(matches!(err, Error::InvalidLimit(_)), "{bad:?}: {err:?}");
        }
        assert_eq!(rate(5, 10).to_string(), "5/10s");
        assert_eq!(Rate::per_minute(3).to_string(), "3/min");
    }

    #[test]
    fn interval_rounds_up() {
        // From 1 ms up: whole µs.
        assert_eq!(Rate::per_second(3).interval_ns(), 333_334_000);
        assert_eq!(Rate::per_second(999).interval_ns(), 1_002_000);
        assert_eq!(Rate::per_second(1000).interval_ns(), 1_000_000);
        // Below: whole ns (600,000/s was 2 µs, i.e. 500,000/s).
        assert_eq!(Rate::per_second(600_000).interval_ns(), 1667);
        assert_eq!(Rate::per_second(1_000_000).interval_ns(), 1000);
        assert_eq!(Rate::per_second(1_000_001).interval_ns(), 1000);
        assert_eq!(Rate::per_second(500_000_000).interval_ns(), 2);
        assert_eq!(Rate::per_second(1_000_000_000).interval_ns(), 1);
        let slow = Rate::new(1, MAX_RATE_PERIOD).unwrap();
        assert_eq!(slow.interval_ns(), 2_592_000_000_000_000);
    }

    #[test]
    fn rates_off_by_more_than_a_thousandth_are_refused() {
        for (count, period) in [
            (3_000_000, Duration::from_secs(1)),
            (333_333_333, Duration::from_secs(1)),
            (700_000_000, Duration::from_secs(1)),
            (1_000_000_000, Duration::from_millis(1)),
            (3_000, Duration::from_millis(1)),
        ] {
            let err = Rate::new(count, period).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidLimit(m) if m.contains("fewer than asked")),
                "{count}/{period:?}: {err}"
            );
        }
        // Every count up to 1,000,000/s, and a sample of periods, is accepted.
        for count in (1..=1_000_000).step_by(997) {
            for ms in [1, 7, 1000, 86_400_000] {
                let period = Duration::from_millis(ms);
                if count <= 1000 * ms {
                    Rate::new(count, period).unwrap();
                }
            }
        }
    }

    #[test]
    fn limits() {
        let gcra = |burst, cost| {
            Limit::new(
                Algorithm::Gcra,
                Rate::per_second(5),
                burst,
                cost,
                Duration::ZERO,
            )
        };
        assert_eq!(gcra(None, 1).unwrap().burst(), 5);
        assert!(gcra(Some(0), 1).is_err());
        assert!(gcra(Some(10), 0).is_err());
        assert!(gcra(Some(10), 11).is_err());
        assert!(gcra(None, 6).is_err());
        let window = Limit::new(
            Algorithm::FixedWindow,
            Rate::per_second(5),
            Some(10),
            1,
            Duration::ZERO,
        );
        assert!(window.is_err());
        let slow = Limit::new(
            Algorithm::Gcra,
            Rate::new(1, MAX_RATE_PERIOD).unwrap(),
            Some(MAX_RATE_COUNT),
            1,
            Duration::ZERO,
        );
        assert!(slow.is_err());
    }
    #[test]
    fn the_per_thread_caches_answer_only_for_the_same_input() {
        let rate = |count, secs| Rate::new(count, Duration::from_secs(secs)).unwrap();
        // Each text right after a different one, a prefix of it, or itself; and a refused
        // text between accepted ones.
        for (text, want) in [
            ("100/s", Some(rate(100, 1))),
            ("100/s", Some(rate(100, 1))),
            ("10/s", Some(rate(10, 1))),
            ("100/s", Some(rate(100, 1))),
            ("100/sx", None),
            ("100/s", Some(rate(100, 1))),
            ("1/min", Some(rate(1, 60))),
            // Longer than the cache keeps: parsed every time.
            (
                "1000000/1000000000000ms",
                "1000000/1000000000000ms".parse::<Rate>().ok(),
            ),
            ("1/min", Some(rate(1, 60))),
        ] {
            assert_eq!(text.parse::<Rate>().ok(), want, "{text:?}");
        }
        let limit = |rate, burst, cost| {
            Limit::new(Algorithm::Gcra, rate, burst, cost, Duration::ZERO).map(|l| l.burst())
        };
        let five = Rate::per_second(5);
        assert_eq!(limit(five, Some(10), 1).unwrap(), 10);
        assert_eq!(limit(five, Some(10), 1).unwrap(), 10);
        assert_eq!(limit(five, None, 1).unwrap(), 5);
        assert!(limit(five, None, 6).is_err());
        assert!(limit(five, None, 6).is_err());
        assert_eq!(limit(five, None, 5).unwrap(), 5);
        assert_eq!(limit(Rate::per_second(7), None, 5).unwrap(), 7);
        let window = Limit::new(Algorithm::FixedWindow, five, None, 1, Duration::ZERO);
        assert_eq!(window.unwrap().algorithm(), Algorithm::FixedWindow);
        assert!(Limit::new(Algorithm::FixedWindow, five, Some(10), 1, Duration::ZERO).is_err());
    }
}
