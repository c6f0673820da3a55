//! Every bound at its edge: the last accepted value and the first refused one, on both sides.
//! The macros and the runtime refuse exactly what these functions refuse, so an edge moved by
//! one unit here is a literal that compiles and then fails, or a valid one refused.

use std::time::Duration;

use redguard_grammar::{duration, idempotency, lock, rate, tokens};

const NS: Duration = Duration::from_nanos(1);
const DAY: Duration = Duration::from_secs(86_400);

/// `check` accepts `low..=high` and refuses one step outside each end; a refusal names the
/// value it refused.
fn edges(
    what: &str,
    check: impl Fn(Duration) -> Result<(), String>,
    low: Duration,
    high: Duration,
) {
    assert_eq!(check(low), Ok(()), "{what}: the lowest {low:?}");
    assert_eq!(check(high), Ok(()), "{what}: the highest {high:?}");
    if let Some(below) = low.checked_sub(NS) {
        let why = check(below).expect_err(what);
        assert!(why.contains(&format!("{below:?}")), "{what}: {why}");
    }
    let above = high + NS;
    let why = check(above).expect_err(what);
    assert!(why.contains(&format!("{above:?}")), "{what}: {why}");
}

#[test]
fn idempotency_bounds() {
    assert_eq!(idempotency::MIN_EXPIRE, Duration::from_secs(1));
    assert_eq!(idempotency::MAX_EXPIRE, 7 * DAY);
    edges(
        "expire",
        idempotency::expire,
        idempotency::MIN_EXPIRE,
        idempotency::MAX_EXPIRE,
    );
    assert!(idempotency::timeout(Duration::ZERO).is_err());
    assert_eq!(idempotency::timeout(NS), Ok(()));
}

#[test]
fn token_bounds() {
    assert_eq!(tokens::MAX_TOKEN_TTL, 7 * DAY);
    edges(
        "token ttl",
        tokens::ttl,
        Duration::from_secs(1),
        tokens::MAX_TOKEN_TTL,
    );
}

#[test]
fn lock_bounds() {
    assert_eq!(lock::MIN_LEASE, Duration::from_secs(1));
    assert_eq!(lock::MAX_LEASE, Duration::from_secs(3600));
    assert_eq!(lock::MAX_WAIT, Duration::from_secs(60));
    assert_eq!(lock::MAX_HOLD_AT_LEAST, DAY);
    assert!(lock::DEFAULT_LEASE >= lock::MIN_LEASE && lock::DEFAULT_LEASE <= lock::MAX_LEASE);
    edges("lease", lock::lease, lock::MIN_LEASE, lock::MAX_LEASE);
    edges("wait", lock::wait, Duration::ZERO, lock::MAX_WAIT);
    edges(
        "hold_at_least",
        lock::hold_at_least,
        Duration::ZERO,
        lock::MAX_HOLD_AT_LEAST,
    );
    assert_eq!(lock::permits(1), Ok(1));
    assert_eq!(lock::permits(7), Ok(7));
    assert_eq!(lock::permits(u64::from(u32::MAX)), Ok(u32::MAX));
    assert!(lock::permits(0).is_err());
    assert!(lock::permits(u64::from(u32::MAX) + 1).is_err());
}

#[test]
fn rate_setting_bounds() {
    assert_eq!(rate::MAX_RATE_COUNT, 1_000_000_000);
    assert_eq!(rate::MAX_SLIDING_WINDOW_COUNT, 10_000);
    assert_eq!(rate::MIN_RATE_PERIOD, Duration::from_millis(1));
    assert_eq!(rate::MAX_RATE_PERIOD, 30 * DAY);
    assert_eq!(rate::MAX_RATE_WAIT, Duration::from_secs(60));
    edges("block", rate::block, Duration::ZERO, rate::MAX_RATE_PERIOD);
    edges("rate wait", rate::wait, Duration::ZERO, rate::MAX_RATE_WAIT);
    for check in [rate::burst, rate::cost] {
        assert!(check(0).is_err());
        assert_eq!(check(1), Ok(()));
        assert_eq!(check(rate::MAX_RATE_COUNT), Ok(()));
        assert!(check(rate::MAX_RATE_COUNT + 1).is_err());
    }
    assert_eq!(rate::cost_fits(5, 5), Ok(()));
    assert!(rate::cost_fits(6, 5).is_err());
}

#[test]
fn rate_bounds() {
    let s = Duration::from_secs(1);
    assert!(rate::check(0, s).is_err());
    assert_eq!(rate::check(1, s), Ok(()));
    assert_eq!(rate::check(1, rate::MIN_RATE_PERIOD), Ok(()));
    assert!(rate::check(1, rate::MIN_RATE_PERIOD - NS).is_err());
    assert_eq!(rate::check(1, rate::MAX_RATE_PERIOD), Ok(()));
    assert!(rate::check(1, rate::MAX_RATE_PERIOD + NS).is_err());
    // The largest count, in a period whose interval is a whole number of ns.
    assert_eq!(rate::check(rate::MAX_RATE_COUNT, s), Ok(()));
    assert!(rate::check(rate::MAX_RATE_COUNT + 1, 2 * s).is_err());
}

#[test]
fn intervals_are_never_looser_and_within_a_thousandth() {
    // Whole µs from 1 ms per unit up, whole ns below; rounded up, never down.
    let ms = Duration::from_millis(1);
    assert_eq!(rate::interval_ns(1, ms), 1_000_000);
    assert_eq!(rate::interval_ns(3, Duration::from_secs(1)), 333_334_000);
    assert_eq!(rate::interval_ns(1000, Duration::from_secs(1)), 1_000_000);
    assert_eq!(rate::interval_ns(1001, Duration::from_secs(1)), 999_001);
    assert_eq!(rate::interval_ns(3, Duration::from_micros(1)), 334);
    // A count of 0 is treated as 1 (never a division by zero).
    assert_eq!(rate::interval_ns(0, ms), 1_000_000);
    // 0.1% fewer than asked is the edge: 2000 units in 2,000,001 ns round up to 1001 ns each,
    // 1999 ns over in all, under 0.1%; in 1,998,001 ns to 1000 ns each, 1999 ns over, above it.
    assert_eq!(
        rate::interval_ns(2000, Duration::from_nanos(2_000_001)),
        1001
    );
    assert_eq!(rate::check(2000, Duration::from_nanos(2_000_001)), Ok(()));
    assert!(rate::check(2000, Duration::from_nanos(1_998_001)).is_err());
    assert_eq!(rate::check(2000, Duration::from_nanos(2_000_000)), Ok(()));
    // Exactly 0.1% is accepted: 1001 units in 1 ms round up to 1000 ns, 1000 ns over in all.
    assert_eq!(rate::interval_ns(1001, Duration::from_millis(1)), 1000);
    assert_eq!(rate::check(1001, Duration::from_millis(1)), Ok(()));
    assert!(rate::check(3_000_000, Duration::from_secs(1)).is_err());
    // The refusal says how much fewer it would admit.
    let why = rate::check(3_000_000, Duration::from_secs(1)).unwrap_err();
    assert!(why.contains("fewer than asked"), "{why}");
}

#[test]
fn spans_and_window_counts() {
    let per_year = rate::Rate {
        count: 1,
        period: rate::MAX_RATE_PERIOD,
    };
    // 2^50 µs of debt is the edge.
    let interval = u128::from(rate::interval_ns(per_year.count, per_year.period));
    let edge = u64::try_from((1000u128 << 50) / interval).unwrap();
    assert_eq!(rate::span(edge, per_year), Ok(()));
    assert!(rate::span(edge + 1, per_year).is_err());
    // Exactly 2^50 µs is accepted: 2^30 units of 2^20 µs.
    let exact = rate::Rate {
        count: 1,
        period: Duration::from_micros(1 << 20),
    };
    assert_eq!(rate::span(1 << 30, exact), Ok(()));
    assert!(rate::span((1 << 30) + 1, exact).is_err());
    let at = |count| rate::Rate {
        count,
        period: Duration::from_secs(1),
    };
    let max = rate::MAX_SLIDING_WINDOW_COUNT;
    assert_eq!(rate::window_count(rate::Shape::Log, at(max)), Ok(()));
    assert!(rate::window_count(rate::Shape::Log, at(max + 1)).is_err());
    assert_eq!(rate::window_count(rate::Shape::Window, at(max + 1)), Ok(()));
    assert_eq!(rate::window_count(rate::Shape::Bucket, at(max + 1)), Ok(()));
}

#[test]
fn limits_take_their_capacity() {
    let five = rate::Rate {
        count: 5,
        period: Duration::from_secs(1),
    };
    let limit = |shape, burst, cost, block| rate::limit(shape, five, burst, cost, block);
    assert_eq!(
        limit(rate::Shape::Bucket, Some(9), 9, Duration::ZERO),
        Ok(9)
    );
    assert_eq!(limit(rate::Shape::Log, None, 5, Duration::ZERO), Ok(5));
    assert!(limit(rate::Shape::Log, Some(6), 1, Duration::ZERO).is_err());
    assert!(limit(rate::Shape::Bucket, None, 1, rate::MAX_RATE_PERIOD + NS).is_err());
    assert_eq!(
        limit(rate::Shape::Bucket, None, 1, rate::MAX_RATE_PERIOD),
        Ok(5)
    );
}

#[test]
fn duration_units() {
    assert_eq!(duration::unit("ms"), Some(Duration::from_millis(1)));
    assert_eq!(duration::unit("s"), Some(Duration::from_secs(1)));
    assert_eq!(duration::unit("m"), Some(Duration::from_secs(60)));
    assert_eq!(duration::unit("min"), Some(Duration::from_secs(60)));
    assert_eq!(duration::unit("h"), Some(Duration::from_secs(3600)));
    assert_eq!(duration::unit("d"), Some(DAY));
    assert_eq!(duration::unit("w"), None);
    // The error for a unit lists the units.
    let why = duration::parse("5x").unwrap_err();
    assert!(why.contains("ms, s, m (or min), h, d"), "{why}");
    let why = rate::parse("5/x").unwrap_err();
    assert!(why.contains("ms, s, m (or min), h, d"), "{why}");
    // The largest count of units that fits, and one more.
    assert_eq!(
        duration::parse("4294967295ms"),
        Ok(Duration::from_millis(u64::from(u32::MAX)))
    );
    assert!(duration::parse("4294967296ms").is_err());
}
