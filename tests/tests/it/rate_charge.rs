//! Cost charged after the call (issue 28): `Limiter::reserve` admits at the configured cost
//! and the returned `Charge` charges or refunds the rest once the real cost is known.
//!
//! - The differential: a sequence of calls charged after the work leaves every key exactly
//!   as the same sequence charged up front, on every algorithm, on the in-memory store and on
//!   Redis (its scripts on a pinned clock, so no tolerance is needed).
//! - A negative balance (charged past the limit) is repaid before the next admission, to the
//!   µs; a refund of more than the call holds is refused and sends nothing; charges follow
//!   the key's quota override. These run on memory, Redis, Cluster and Sentinel
//!   (`conformance!`), which also checks that every key has a TTL.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redguard::admin::{Admin, Quota, QuotaTtl};
use redguard::clock::ManualClock;
use redguard::rate::{Algorithm, Limiter};
use redguard::{Error, Redguard};
use redguard_tests::RedisServer;

redguard_tests::conformance!(
    a_refund_beyond_what_the_call_holds_is_refused,
    a_charge_past_the_limit_blocks_until_repaid,
    charged_after_matches_charged_up_front_in_units,
    charges_and_refunds_follow_the_quota_override,
);

const SCOPE: &str = "rate_charge";

fn limiter(rg: &Redguard, key: &str, algorithm: Algorithm, rate: &str) -> Limiter {
    redguard::limiter(key)
        .scope(SCOPE)
        .on(rg)
        .algorithm(algorithm)
        .rate(rate)
}

fn is_refused(result: &redguard::Result<u64>) -> bool {
    matches!(result, Err(Error::InvalidLimit(message)) if message.contains("refund"))
}

async fn a_refund_beyond_what_the_call_holds_is_refused(rg: Redguard) {
    for algorithm in Algorithm::ALL {
        let l = limiter(&rg, &format!("refuse:{algorithm}"), algorithm, "10/h").cost(3);
        let mut call = l.reserve().await.unwrap();
        assert_eq!(call.held(), 3);
        let before = l.peek().await.unwrap().remaining;
        assert!(is_refused(&call.refund(4).await), "{algorithm}");
        let after = l.peek().await.unwrap().remaining;
        assert_eq!(after, before, "{algorithm}: a refused refund wrote");
        assert_eq!(call.refund(3).await.unwrap(), 0, "{algorithm}");
        assert!(is_refused(&call.refund(1).await), "{algorithm}");
        // What a call charged later may be given back, and no more.
        assert_eq!(call.charge(2).await.unwrap(), 2, "{algorithm}");
        assert!(is_refused(&call.refund(3).await), "{algorithm}");
        assert_eq!(call.refund(2).await.unwrap(), 0, "{algorithm}");
        // Everything given back: the key is as if the call never came (one more call of
        // cost 3 leaves 7).
        assert_eq!(l.peek().await.unwrap().remaining, 7, "{algorithm}");
        // Another call's refund cannot spend this one's units either.
        let mut other = l.reserve().await.unwrap();
        assert!(is_refused(&other.refund(4).await), "{algorithm}");
        assert_eq!(other.refund(3).await.unwrap(), 0, "{algorithm}");
    }
}

async fn a_charge_past_the_limit_blocks_until_repaid(rg: Redguard) {
    for algorithm in Algorithm::ALL {
        let l = limiter(&rg, &format!("negative:{algorithm}"), algorithm, "5/h");
        let mut call = l.reserve().await.unwrap();
        // 7 units charged against a limit of 5: the balance is 2 below zero.
        assert_eq!(call.charge(6).await.unwrap(), 7, "{algorithm}");
        let d = l.decide().await.unwrap();
        assert!(
            !d.allowed,
            "{algorithm}: admitted on a negative balance: {d:?}"
        );
        assert_eq!(d.remaining, 0, "{algorithm}");
        if !algorithm.is_window() {
            // (7 + 1 - 5) units of 720 s must drain first.
            let wait = Duration::from_secs(3 * 720);
            assert!(
                d.retry_after > wait - Duration::from_secs(30) && d.retry_after <= wait,
                "{algorithm}: {d:?}"
            );
        }
        // Repaying 3 of the 7 leaves room for exactly one more call.
        assert_eq!(call.refund(3).await.unwrap(), 4, "{algorithm}");
        assert!(l.decide().await.unwrap().allowed, "{algorithm}");
        assert!(!l.decide().await.unwrap().allowed, "{algorithm}");
    }
}

/// On a real clock: units compared exactly, times within what the test's own calls take.
async fn charged_after_matches_charged_up_front_in_units(rg: Redguard) {
    for algorithm in Algorithm::ALL {
        let front =
            |cost| limiter(&rg, &format!("units:front:{algorithm}"), algorithm, "100/h").cost(cost);
        let after =
            |cost| limiter(&rg, &format!("units:after:{algorithm}"), algorithm, "100/h").cost(cost);
        for (upfront, actual) in [(5, 9), (5, 1), (3, 3), (10, 0), (1, 30), (4, 2)] {
            if actual > 0 {
                front(actual).check().await.unwrap();
            }
            let mut call = after(upfront).reserve().await.unwrap();
            call.settle(actual).await.unwrap();
            assert_eq!(call.held(), actual);
        }
        let both = front(1).and(after(1)).peek().await.unwrap();
        assert_eq!(
            both[0].remaining, both[1].remaining,
            "{algorithm}: {both:?}"
        );
        assert_eq!(both[0].remaining, 100 - 45 - 1, "{algorithm}: {both:?}");
        let close = |a: Duration, b: Duration| a.abs_diff(b) < Duration::from_secs(5);
        assert!(
            close(both[0].reset_after, both[1].reset_after),
            "{algorithm}: {both:?}"
        );
    }
}

async fn charges_and_refunds_follow_the_quota_override(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    let hour = QuotaTtl::For(Duration::from_secs(3600));
    // An override is accepted only for a scope some limit has used.
    limiter(&rg, "quota:first", Algorithm::Gcra, "1/h")
        .check()
        .await
        .unwrap();
    for algorithm in Algorithm::ALL {
        let key = format!("quota:{algorithm}");
        let l = limiter(&rg, &key, algorithm, "1/h");
        admin
            .quota_set(SCOPE, &key, &Quota::new("10/h", Some(10)).unwrap(), hour)
            .await
            .unwrap();
        let mut call = l.reserve().await.unwrap();
        call.charge(6).await.unwrap();
        // 7 of the override's 10 used: one more call leaves 2 (under the code's limit of 1,
        // the key would be 6 below zero).
        let d = l.peek().await.unwrap();
        assert_eq!((d.limit, d.remaining), (10, 2), "{algorithm}: {d:?}");
        call.refund(4).await.unwrap();
        assert_eq!(l.peek().await.unwrap().remaining, 6, "{algorithm}");
        admin.quota_clear(SCOPE, &key).await.unwrap();
    }
}

// ---- exact, on a pinned clock ------------------------------------------------------------

/// A virtual clock a day ahead of the real one (keys written with absolute expiries on it
/// do not expire on Redis's real clock), on a whole minute: every step of the tests below
/// moves it by multiples of 250 ms, so no state is ever within 250 ms of its expiry when
/// read back, however long the test's own calls take on Redis's real clock.
fn virtual_clock() -> ManualClock {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_secs(86_400);
    ManualClock::starting_at(Duration::from_secs(now.as_secs() / 60 * 60))
}

async fn memory(clock: &ManualClock) -> Redguard {
    Redguard::memory_builder()
        .clock(clock.clone())
        .connect()
        .await
        .unwrap()
}

async fn pinned(server: &RedisServer, clock: &ManualClock) -> Redguard {
    Redguard::redis(server.url())
        .clock(clock.clone())
        .connect()
        .await
        .unwrap()
}

/// What one differential run did.
#[derive(Debug, Default)]
struct Ran {
    steps: u32,
    charges: u32,
    refunds: u32,
}

/// A random sequence of calls, each with an up-front cost and an actual one, run twice on
/// `rg`: on one key charged up front (`check` at the actual cost), on another admitted at
/// the up-front cost and settled after the work. A step runs only when the up-front side
/// admits it (the sequence must be one both can make); then the charged-after side must
/// admit too, and after every step both keys must decide every next call identically.
async fn differential(rg: &Redguard, clock: &ManualClock, algorithm: Algorithm, seed: u64) -> Ran {
    const BURST: u64 = 40;
    let mut rng = fastrand::Rng::with_seed(seed);
    let front = |cost| {
        limiter(
            rg,
            &format!("diff:front:{algorithm}:{seed}"),
            algorithm,
            "40/min",
        )
        .cost(cost)
    };
    let after = |cost| {
        limiter(
            rg,
            &format!("diff:after:{algorithm}:{seed}"),
            algorithm,
            "40/min",
        )
        .cost(cost)
    };
    let mut ran = Ran::default();
    for step in 0..80 {
        clock.advance(Duration::from_millis(250) * rng.u32(0..=16));
        let upfront = rng.u64(1..=6);
        let actual = rng.u64(0..=9);
        let fits = front(upfront.max(actual)).peek().await.unwrap().allowed;
        if fits {
            if actual > 0 {
                front(actual).check().await.unwrap();
            }
            let mut call = after(upfront).reserve().await.unwrap_or_else(|err| {
                panic!("{algorithm} seed {seed} step {step}: up front admitted, after: {err}")
            });
            call.settle(actual).await.unwrap();
            assert_eq!(call.held(), actual);
            ran.steps += 1;
            ran.charges += u32::from(actual > upfront);
            ran.refunds += u32::from(actual < upfront);
        }
        for cost in [1, BURST / 2, BURST] {
            let both = front(cost).and(after(cost)).peek().await.unwrap();
            assert_eq!(
                both[0], both[1],
                "{algorithm} seed {seed} step {step} (ran: {fits}), next cost {cost}: \
                 up front vs charged after"
            );
        }
    }
    ran
}

fn assert_exercised(algorithm: Algorithm, ran: &Ran) {
    assert!(
        ran.steps >= 20 && ran.charges >= 5 && ran.refunds >= 5,
        "{algorithm}: the sequence exercised too little: {ran:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_charged_after_equals_charged_up_front() {
    for algorithm in Algorithm::ALL {
        for seed in 1..=4 {
            let clock = virtual_clock();
            let rg = memory(&clock).await;
            let ran = differential(&rg, &clock, algorithm, seed).await;
            assert_exercised(algorithm, &ran);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_charged_after_equals_charged_up_front() {
    let server = RedisServer::start();
    for algorithm in Algorithm::ALL {
        for seed in 1..=2 {
            let clock = virtual_clock();
            let rg = pinned(&server, &clock).await;
            let ran = differential(&rg, &clock, algorithm, seed).await;
            assert_exercised(algorithm, &ran);
        }
    }
    server.assert_every_key_has_ttl();
}

/// Charged 15 against a burst of 10 at 10/s: refused for exactly the 600 ms that repay the
/// debt past what one more call needs, then admitted; a fixed window's overage is gone with
/// its window.
async fn negative_balance_repaid_to_the_microsecond(rg: Redguard, clock: ManualClock) {
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        let l = limiter(&rg, &format!("repay:{algorithm}"), algorithm, "10/s");
        let mut call = l.reserve().await.unwrap();
        call.charge(14).await.unwrap();
        let d = l.decide().await.unwrap();
        assert!(!d.allowed, "{algorithm}");
        assert_eq!(d.retry_after, Duration::from_millis(600), "{algorithm}");
        clock.advance(Duration::from_micros(599_999));
        let d = l.decide().await.unwrap();
        assert!(!d.allowed, "{algorithm}: admitted 1 µs early");
        assert_eq!(d.retry_after, Duration::from_micros(1), "{algorithm}");
        clock.advance(Duration::from_micros(1));
        let d = l.decide().await.unwrap();
        assert!(d.allowed, "{algorithm}: {d:?}");
        assert_eq!(d.remaining, 0, "{algorithm}");
    }
    // At the start of a window (the clock is on a whole minute, moved by 1.8 s above).
    clock.advance(Duration::from_millis(200));
    let l = limiter(&rg, "repay:fixed", Algorithm::FixedWindow, "10/s");
    let mut call = l.reserve().await.unwrap();
    call.charge(14).await.unwrap();
    let d = l.decide().await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Duration::from_secs(1));
    clock.advance(Duration::from_secs(1));
    assert_eq!(l.decide().await.unwrap().remaining, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_negative_balance_repaid_to_the_microsecond() {
    let clock = virtual_clock();
    negative_balance_repaid_to_the_microsecond(memory(&clock).await, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_negative_balance_repaid_to_the_microsecond() {
    let server = RedisServer::start();
    let clock = virtual_clock();
    negative_balance_repaid_to_the_microsecond(pinned(&server, &clock).await, clock).await;
    server.assert_every_key_has_ttl();
}

// ---- from the attribute -------------------------------------------------------------------

/// An LLM reply: its cost is the tokens it used, known once it is in.
#[derive(Debug)]
struct Reply {
    tokens: u64,
}

impl redguard::rate::Cost for Reply {
    fn cost(&self) -> u64 {
        self.tokens
    }
}

#[redguard::rate_limit(key = "tenant:{tenant}", scope = "llm", rate = "100/h", cost = 10, charge = after)]
async fn complete(tenant: &str, tokens: u64, fail: bool) -> redguard::Result<Reply> {
    if fail {
        return Err(Error::Config("the model timed out".to_owned()));
    }
    Ok(Reply { tokens })
}

async fn llm_remaining(tenant: &str) -> u64 {
    redguard::limiter(redguard::key("tenant:{tenant}").part("tenant", tenant))
        .scope("llm")
        .rate("100/h")
        .peek()
        .await
        .unwrap()
        .remaining
}

/// `charge = after`: admitted at `cost = 10`, settled with the `Ok` value's cost (more or
/// less than 10); an `Err` keeps the 10; a reply costing past the limit is paid for before
/// the tenant's next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_charges_what_the_ok_value_reports() {
    let server = RedisServer::start();
    let redis = redguard_tests::connect(&server).await;
    for rg in [Redguard::memory(), redis] {
        rg.scope(async {
            // One call of cost 1 more leaves: 100 - held - 1.
            complete("acme", 35, false).await.unwrap();
            assert_eq!(llm_remaining("acme").await, 64);
            complete("acme", 2, false).await.unwrap();
            assert_eq!(llm_remaining("acme").await, 62);
            assert!(complete("acme", 0, true).await.is_err());
            assert_eq!(llm_remaining("acme").await, 52);
            // 90 charged after an admission at 10 with 53 left: the tenant owes 37.
            complete("acme", 90, false).await.unwrap();
            assert_eq!(llm_remaining("acme").await, 0);
            let refused = complete("acme", 1, false).await.unwrap_err();
            assert!(matches!(refused, Error::RateLimited(_)), "{refused:?}");
            // Another tenant is untouched.
            assert_eq!(llm_remaining("globex").await, 99);
        })
        .await;
    }
    server.assert_every_key_has_ttl();
}

// ---- the tests can fail -------------------------------------------------------------------

/// `rate_adjust.lua` as the runtime sends it: after its preludes.
const ADJUST_PRELUDES: &str = concat!(
    include_str!("../../../runtime/src/store/redis/scripts/expiry.lua"),
    include_str!("../../../runtime/src/store/redis/scripts/quota.lua"),
);
const ADJUST: &str = concat!(
    include_str!("../../../runtime/src/store/redis/scripts/expiry.lua"),
    include_str!("../../../runtime/src/store/redis/scripts/quota.lua"),
    include_str!("../../../runtime/src/store/redis/scripts/rate_adjust.lua"),
);

/// The tests above on one handle; a panic is a caught difference.
async fn every_case(rg: Redguard, clock: ManualClock) {
    for algorithm in Algorithm::ALL {
        differential(&rg, &clock, algorithm, 1).await;
    }
    a_refund_beyond_what_the_call_holds_is_refused(rg.clone()).await;
    a_charge_past_the_limit_blocks_until_repaid(rg.clone()).await;
    charges_and_refunds_follow_the_quota_override(rg.clone()).await;
    negative_balance_repaid_to_the_microsecond(rg, clock).await;
}

/// Mutants of `rate_adjust.lua` itself (not its preludes, which other tests cover), every
/// 8th (`MUTANT_SAMPLE=1` for all), run through the cases above on Redis: nearly every one
/// must be caught, or the cases would pass a broken charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cases_catch_mutants_of_the_charge_script() {
    let sample: usize = std::env::var("MUTANT_SAMPLE")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(8)
        .max(1);
    let prelude_lines = ADJUST_PRELUDES.lines().count();
    let mutants: Vec<_> = redguard_tests::mutate::of("rate_adjust", ADJUST)
        .into_iter()
        .filter(|m| m.line > prelude_lines)
        .step_by(sample)
        .collect();
    assert!(mutants.len() >= 10, "{} mutants", mutants.len());
    let server = RedisServer::start();
    let mut missed = Vec::new();
    for mutant in &mutants {
        ::redis::cmd("FLUSHALL")
            .query::<()>(&mut server.connection())
            .unwrap();
        let clock = virtual_clock();
        let applied = mutant.clone();
        let rg = Redguard::redis(server.url())
            .clock(clock.clone())
            .script_transform(move |source| applied.apply(source))
            .connect()
            .await
            .unwrap();
        let caught = tokio::spawn(every_case(rg, clock)).await.is_err();
        if !caught {
            missed.push((mutant.line, mutant.diff()));
        }
    }
    eprintln!(
        "rate_adjust.lua: {} of {} mutants caught; missed: {missed:#?}",
        mutants.len() - missed.len(),
        mutants.len()
    );
    assert!(
        missed.len() * 10 <= mutants.len(),
        "more than 10% of the mutants missed: {missed:#?}"
    );
}
