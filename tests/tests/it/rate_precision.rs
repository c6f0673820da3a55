//! GCRA at fast rates (issue #12, item 8). The emission interval used to be whole
//! microseconds, so 600,000/s ran at 500,000/s, and at 1e9/s a drained burst took 1000 s to
//! come back instead of 1 s. Every store's decisions are checked against an exact integer
//! model of the documented interval: period/count rounded up to a whole microsecond when it
//! is at least 1 ms, to a whole nanosecond below, and never more than 0.1% longer than the
//! exact quotient (rates that cannot meet that are refused).

use std::time::Duration;

use redguard::__private::store::{RateCheck, RateMode};
use redguard::{
    Error, Redguard, key::GuardKind, key::Key, key::KeyBuilder, rate::Algorithm, rate::Limit,
    rate::Rate,
};

redguard_tests::conformance!(
    gcra_600k_per_second_refills_at_that_rate,
    gcra_1e9_per_second_refills_in_one_second,
    gcra_matches_an_exact_model_at_many_rates,
    buckets_refill_at_600k_per_second,
);

/// The documented emission interval, in ns.
fn interval_ns(count: u64, period: Duration) -> u128 {
    let (p, c) = (period.as_nanos(), u128::from(count));
    if p >= 1_000_000 * c {
        p.div_ceil(1000 * c) * 1000
    } else {
        p.div_ceil(c)
    }
}

/// GCRA in exact integers: the theoretical arrival time in ns, decisions rounded as the
/// stores report them (whole µs, up).
struct Model {
    t: u128,
    tau: u128,
    tat: u128,
}

#[derive(Debug, PartialEq, Eq)]
struct Expect {
    allowed: bool,
    remaining: u64,
    reset_us: u128,
    retry_us: u128,
}

impl Model {
    fn new(limit: &Limit) -> Model {
        let t = interval_ns(limit.rate().count(), limit.rate().period());
        Model {
            t,
            tau: u128::from(limit.burst()) * t,
            tat: 0,
        }
    }

    fn decide(&mut self, now_us: u128, cost: u64, mode: RateMode) -> Expect {
        let now = now_us * 1000;
        let tat = self.tat.max(now);
        let new = tat + u128::from(cost) * self.t;
        if new - now <= self.tau {
            if mode == RateMode::Consume {
                self.tat = new;
            }
            Expect {
                allowed: true,
                remaining: u64::try_from((self.tau - (new - now)) / self.t).unwrap(),
                reset_us: (new - now).div_ceil(1000),
                retry_us: 0,
            }
        } else {
            Expect {
                allowed: false,
                remaining: u64::try_from((self.tau - (tat - now)) / self.t).unwrap(),
                reset_us: (tat - now).div_ceil(1000),
                retry_us: (new - self.tau - now).div_ceil(1000),
            }
        }
    }
}

fn key(rg: &Redguard, name: &str) -> Key {
    let body = KeyBuilder::new().text(name).finish().unwrap();
    rg.key(GuardKind::RateLimit, "precision", &body).unwrap()
}

/// One check of `limit` at `key` with `cost`: the decision's four numbers and the store time.
async fn check(
    rg: &Redguard,
    key: &Key,
    limit: &Limit,
    cost: u64,
    mode: RateMode,
) -> (Expect, u128) {
    let limit = Limit::new(
        limit.algorithm(),
        limit.rate(),
        Some(limit.burst()),
        cost,
        Duration::ZERO,
    )
    .unwrap();
    let checks = [RateCheck { key, limit: &limit }];
    let outcome = redguard::__private::store::of(rg)
        .rate_check(&checks, mode)
        .await
        .unwrap();
    let d = outcome.decisions[0];
    let got = Expect {
        allowed: d.allowed,
        remaining: d.remaining,
        reset_us: d.reset_after.as_micros(),
        retry_us: d.retry_after.as_micros(),
    };
    (got, outcome.now.as_micros())
}

async fn gcra_600k_per_second_refills_at_that_rate(rg: Redguard) {
    let rate = Rate::per_second(600_000);
    let limit = Limit::new(Algorithm::Gcra, rate, None, 1, Duration::ZERO).unwrap();
    let key = key(&rg, "600k");
    let (drained, t0) = check(&rg, &key, &limit, 600_000, RateMode::Consume).await;
    // 600,000 units of 1667 ns (1666.67 rounded up): 1.0002 s, not 1.2 s (2 µs each).
    assert!(drained.allowed && drained.remaining == 0, "{drained:?}");
    assert_eq!(drained.reset_us, 1_000_200, "{drained:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (d, t1) = check(&rg, &key, &limit, 1, RateMode::Peek).await;
    let elapsed_ns = (t1 - t0) * 1000;
    // Back: one unit per 1667 ns; the peek's own unit is not among `remaining`.
    let back = u64::try_from(elapsed_ns / 1667).unwrap();
    assert!(d.allowed, "{d:?}");
    assert_eq!(d.remaining, back - 1, "after {elapsed_ns} ns: {d:?}");
    let exact = elapsed_ns as f64 * 0.0006;
    assert!(
        (back as f64 - exact).abs() <= exact * 0.001 + 1.0,
        "{back} units back after {elapsed_ns} ns, {exact} at 600,000/s"
    );
}

async fn gcra_1e9_per_second_refills_in_one_second(rg: Redguard) {
    let rate = Rate::per_second(1_000_000_000);
    let limit = Limit::new(Algorithm::Gcra, rate, None, 1, Duration::ZERO).unwrap();
    let key = key(&rg, "1e9");
    let (drained, t0) = check(&rg, &key, &limit, 1_000_000_000, RateMode::Consume).await;
    assert!(drained.allowed && drained.remaining == 0, "{drained:?}");
    assert_eq!(
        drained.reset_us, 1_000_000,
        "the burst comes back in 1 s: {drained:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (d, t1) = check(&rg, &key, &limit, 1, RateMode::Peek).await;
    let back = u64::try_from((t1 - t0) * 1000).unwrap();
    assert_eq!(d.remaining, back - 1, "{d:?}");
    // The full burst is back 1 s after the drain; the peeked unit adds 1 ns (1 µs, up).
    assert_eq!(d.reset_us, 1_000_000 - (t1 - t0) + 1, "{d:?}");
    // 1.01 s after draining, all of it is back: the whole burst is admitted at once.
    let (_, now) = check(&rg, &key, &limit, 1, RateMode::Peek).await;
    let until = (t0 + 1_010_000).saturating_sub(now);
    tokio::time::sleep(Duration::from_micros(u64::try_from(until).unwrap())).await;
    let (again, t2) = check(&rg, &key, &limit, 1_000_000_000, RateMode::Consume).await;
    assert!(t2 - t0 >= 1_010_000);
    assert!(again.allowed, "{again:?}");
    assert_eq!(again.reset_us, 1_000_000, "{again:?}");
}

/// The token and leaky buckets drain by the same interval (as fractional µs): 600,000/s is
/// 600,000/s for them too, not 500,000/s.
async fn buckets_refill_at_600k_per_second(rg: Redguard) {
    for algorithm in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let rate = Rate::per_second(600_000);
        let limit = Limit::new(algorithm, rate, None, 1, Duration::ZERO).unwrap();
        let key = key(&rg, algorithm.as_str());
        let (drained, t0) = check(&rg, &key, &limit, 600_000, RateMode::Consume).await;
        assert!(
            drained.allowed && drained.remaining == 0,
            "{algorithm}: {drained:?}"
        );
        assert_eq!(drained.reset_us, 1_000_200, "{algorithm}: {drained:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (d, t1) = check(&rg, &key, &limit, 1, RateMode::Peek).await;
        // Units back after t µs: t / 1.667; the peeked unit is not among `remaining`.
        let back = (t1 - t0) as f64 / 1.667;
        assert!(
            (d.remaining as f64 - (back - 1.0)).abs() <= 1.0,
            "{algorithm}: {back} units back after {} µs: {d:?}",
            t1 - t0
        );
    }
}

/// Rates from 1 per 30 days to 1e9 per second, fixed and random, with random bursts, costs,
/// pauses and peeks: every decision equals the model's, to the microsecond.
async fn gcra_matches_an_exact_model_at_many_rates(rg: Redguard) {
    let seed = fastrand::u64(..);
    println!("seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let ms = Duration::from_millis;
    let mut pairs: Vec<(u64, Duration)> = vec![
        (1, ms(1)),
        (3, Duration::from_secs(1)),
        (7, ms(20)),
        (999, Duration::from_secs(1)),
        (1000, Duration::from_secs(1)),
        (600_000, Duration::from_secs(1)),
        (999_999, Duration::from_secs(1)),
        (1_000_000, Duration::from_secs(1)),
        (1_000_001, Duration::from_secs(1)),
        (3_000_000, Duration::from_secs(1)),
        (250_000_000, Duration::from_secs(1)),
        (333_333_333, Duration::from_secs(1)),
        (1_000_000_000, Duration::from_secs(1)),
        (1_000_000_000, Duration::from_secs(60)),
        (1_000_000_000, ms(1)),
        (7, Duration::from_secs(86_400)),
        (1, Duration::from_secs(30 * 86_400)),
        (1_000_000, Duration::from_secs(3600)),
        (1, Duration::from_nanos(1_000_000_001)),
    ];
    for _ in 0..40 {
        let count = 10f64.powf(rng.f64() * 9.0).round().max(1.0) as u64;
        let period = ms(10f64.powf(rng.f64() * 9.4).round().max(1.0) as u64);
        pairs.push((count, period.min(redguard::rate::MAX_RATE_PERIOD)));
    }
    let (mut decided, mut refused) = (0, 0);
    for (i, (count, period)) in pairs.into_iter().enumerate() {
        let t = interval_ns(count, period);
        let off = t * u128::from(count) - period.as_nanos();
        let exact_enough = off * 1000 <= period.as_nanos();
        let rate = match Rate::new(count, period) {
            Ok(rate) => rate,
            Err(err) => {
                assert!(!exact_enough, "{count}/{period:?} refused: {err}");
                assert!(matches!(err, Error::InvalidLimit(_)), "{err:?}");
                refused += 1;
                continue;
            }
        };
        assert!(exact_enough, "{rate} accepted with an interval of {t} ns");
        let burst = match rng.u8(..3) {
            0 => count,
            1 => 1,
            _ => rng.u64(1..=count.min(5000)),
        };
        let Ok(limit) = Limit::new(Algorithm::Gcra, rate, Some(burst), 1, Duration::ZERO) else {
            assert!(
                u128::from(burst) * t > 1000 << 50,
                "{rate} burst {burst} refused"
            );
            refused += 1;
            continue;
        };
        let key = key(&rg, &format!("model{i}"));
        let mut model = Model::new(&limit);
        for call in 0..12 {
            if rng.u8(..4) == 0 {
                tokio::time::sleep(Duration::from_micros(rng.u64(..1500))).await;
            }
            let cost = if rng.bool() { 1 } else { rng.u64(1..=burst) };
            let mode = if rng.u8(..5) == 0 {
                RateMode::Peek
            } else {
                RateMode::Consume
            };
            let (got, now) = check(&rg, &key, &limit, cost, mode).await;
            let expect = model.decide(now, cost, mode);
            assert_eq!(
                got, expect,
                "{rate} (interval {t} ns) burst {burst}, call {call}: cost {cost} {mode:?} at {now}"
            );
            decided += 1;
        }
    }
    println!("{decided} decisions equal to the model's, {refused} limits refused");
}

/// Keys written by the previous version stay readable: "<T><rrr>" (T in µs, the TAT in the
/// key's expiry less rrr µs) and the older "<tat>:<T>". A state whose interval is still the
/// same is read to the microsecond; one written with the old, coarser interval of a fast
/// rate keeps its debt in units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_states_of_the_previous_version_are_read() {
    let server = redguard_tests::RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let mut conn = server.connection();
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    let set = |conn: &mut ::redis::Connection, key: &Key, value: &str, pxat: u128| {
        let _: () = ::redis::cmd("SET")
            .arg(key.as_str())
            .arg(value)
            .arg("PXAT")
            .arg(u64::try_from(pxat).unwrap())
            .query(conn)
            .unwrap();
    };

    // 10/s: 100,000 µs per unit, the same interval before and after. TAT = at - 500 µs.
    let limit = Limit::new(
        Algorithm::Gcra,
        Rate::per_second(10),
        None,
        1,
        Duration::ZERO,
    )
    .unwrap();
    let slow = key(&rg, "old-10");
    let at = now_ms() + 450;
    set(&mut conn, &slow, "100000500", at);
    let (d, now) = check(&rg, &slow, &limit, 1, RateMode::Peek).await;
    let debt = at * 1000 - 500 - now;
    let mut model = Model {
        t: 100_000_000,
        tau: 1_000_000_000,
        tat: (now + debt) * 1000,
    };
    assert_eq!(d, model.decide(now, 1, RateMode::Peek), "debt {debt} µs");

    // The same, in the format before 0.1.
    let legacy = key(&rg, "legacy-10");
    let tat = (now_ms() + 450) * 1000 - 500;
    set(&mut conn, &legacy, &format!("{tat}:100000"), tat / 1000 + 1);
    let (d, now) = check(&rg, &legacy, &limit, 1, RateMode::Peek).await;
    model.tat = tat * 1000;
    assert_eq!(d, model.decide(now, 1, RateMode::Peek));

    // 600,000/s was counted at 2 µs per unit: a second of debt was 500,000 units. Read now,
    // those units are owed at 1667 ns each (the debt is rescaled in units, rounded up to ns).
    let limit = Limit::new(
        Algorithm::Gcra,
        Rate::per_second(600_000),
        None,
        1,
        Duration::ZERO,
    )
    .unwrap();
    let fast = key(&rg, "old-600k");
    let at = now_ms() + 1000;
    set(&mut conn, &fast, "2000", at);
    let mut model = Model::new(&limit);
    let (d, now) = check(&rg, &fast, &limit, 1, RateMode::Peek).await;
    model.tat = now * 1000 + ((at * 1000 - now) * 1667).div_ceil(2);
    assert_eq!(d, model.decide(now, 1, RateMode::Peek));
    // Kept in units: about 500,000 owed of 600,000, not the second of debt rescaled in time
    // (600,000 owed, nothing left). The time from `at` to the check only lowers the debt: up
    // to 100 ms of it on a loaded machine (2 µs a unit).
    assert!(d.remaining > 99_000 && d.remaining < 150_000, "{d:?}");
    // Charging writes the new format ("-<T ns><rrrrrr>"), which reads back exactly.
    let (d, now) = check(&rg, &fast, &limit, 1, RateMode::Consume).await;
    model.tat = now * 1000 + ((at * 1000 - now) * 1667).div_ceil(2);
    assert_eq!(d, model.decide(now, 1, RateMode::Consume));
    let value: String = ::redis::cmd("GET")
        .arg(fast.as_str())
        .query(&mut conn)
        .unwrap();
    assert!(value.starts_with("-1667"), "{value}");
    let (d, now) = check(&rg, &fast, &limit, 1, RateMode::Peek).await;
    assert_eq!(d, model.decide(now, 1, RateMode::Peek));
    server.assert_every_key_has_ttl();
}

/// The scripts' conversion of a debt counted at one interval into another's units (a rate
/// changed on a live key) is `ceil(d · new / old)` exactly, as the model and the memory store
/// compute it in 128-bit integers, capped at 2^52 as they are. Random triples across every
/// interval a limit may have, most of them with `d · new` past 2^53 where doubles cannot hold
/// the product (the rate machine reaches that path in a few cases only).
#[test]
fn the_scripts_rescale_a_debt_exactly() {
    const CAP: u128 = 1 << 52;
    let server = redguard_tests::RedisServer::start();
    let mut conn = server.connection();
    let script = ::redis::Script::new(concat!(
        include_str!("../../../runtime/src/store/redis/scripts/rescale.lua"),
        "local out = {}\n",
        "for i = 1, #ARGV, 3 do\n",
        "  local r = rescale(tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]))\n",
        "  out[#out + 1] = string.format('%.0f', math.min(r, 4503599627370496))\n",
        "end\n",
        "return out\n",
    ));
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    // An interval in the unit it counts in: ns below 1 ms when not whole µs, else µs (up to
    // 30 days).
    let interval = |rng: &mut fastrand::Rng| match rng.u8(..3) {
        0 => rng.u64(1..1_000_000),
        1 => rng.u64(1..100_000_000),
        _ => rng.u64(1..=2_592_000_000_000),
    };
    let mut beyond = 0;
    for _ in 0..20 {
        let triples: Vec<(u64, u64, u64)> = (0..500)
            .map(|_| {
                let (old, new) = (interval(&mut rng), interval(&mut rng));
                // A debt of up to a burst's span: at most 2^50 of its unit.
                let bits = rng.u32(1..=30);
                let units = rng.u64(1..=1 << bits);
                let d = units
                    .saturating_mul(old)
                    .saturating_sub(rng.u64(..old))
                    .min(1 << 50);
                (d.max(1), new, old)
            })
            .collect();
        let args: Vec<String> = triples
            .iter()
            .flat_map(|(d, b, a)| [d.to_string(), b.to_string(), a.to_string()])
            .collect();
        let got: Vec<String> = script.arg(&args).invoke(&mut conn).unwrap();
        for ((d, b, a), got) in triples.iter().zip(got) {
            let exact = (u128::from(*d) * u128::from(*b)).div_ceil(u128::from(*a));
            if u128::from(*d) * u128::from(*b) >= 1 << 53 {
                beyond += 1;
            }
            assert_eq!(
                got,
                exact.min(CAP).to_string(),
                "ceil({d} · {b} / {a}) (seed {seed})"
            );
        }
    }
    assert!(beyond > 1000, "only {beyond} products past 2^53");
}
