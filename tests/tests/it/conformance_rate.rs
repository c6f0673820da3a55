//! Rate-limit conformance: each case runs against the in-memory store and a real Redis
//! (see `redguard_tests::conformance!`), which must decide identically.

use std::time::Duration;

use redguard::{Error, Redguard, rate::Algorithm, rate::Limiter, rate::Rate};

redguard_tests::conformance!(
    every_algorithm_admits_its_capacity_then_rejects,
    gcra_retry_after_is_the_emission_interval,
    peek_does_not_count,
    cost_counts_units_and_cost_above_burst_is_refused,
    stacked_rejection_by_user_does_not_charge_global,
    stacked_rejection_by_global_does_not_charge_user,
    block_rejects_without_counting_then_lifts,
    removing_the_penalty_lifts_it,
    stacked_penalty_is_written_when_its_limit_rejects,
    stacked_penalties_of_every_rejecting_limit,
    stacked_penalty_is_not_written_when_another_limit_rejects,
    lowering_the_limit_never_admits_beyond_it,
    gcra_debt_is_kept_in_units_across_interval_units,
    changing_the_algorithm_replaces_state,
    bad_runtime_values_are_errors_not_panics,
    decision_headers_for_a_rejection,
    check_with_question_mark_limits,
    concurrent_gcra_checks_decide_as_in_sequence,
);

/// Many concurrent checks on a few keys (on Redis, coalesced into shared script calls):
/// each key admits exactly its burst, and the admitted calls see every `remaining` from
/// burst - 1 down to 0 once, as calls made one after another would.
async fn concurrent_gcra_checks_decide_as_in_sequence(rg: Redguard) {
    const KEYS: u64 = 4;
    const BURST: u64 = 40;
    let tasks: Vec<_> = (0..64u64)
        .map(|task| {
            let rg = rg.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                for call in 0..8u64 {
                    let k = (task + call) % KEYS;
                    let d = redguard::limiter(redguard::key("coalesced{k}").part("k", &k))
                        .on(&rg)
                        .rate("1/h")
                        .burst(BURST)
                        .decide()
                        .await
                        .unwrap();
                    seen.push((k, d));
                }
                seen
            })
        })
        .collect();
    let mut remaining: Vec<Vec<u64>> = vec![Vec::new(); KEYS as usize];
    for task in tasks {
        for (k, d) in task.await.unwrap() {
            if d.allowed {
                remaining[k as usize].push(d.remaining);
            } else {
                assert_eq!(d.remaining, 0, "{d:?}");
                assert!(d.retry_after > Duration::from_secs(3000), "{d:?}");
            }
        }
    }
    for (k, mut seen) in remaining.into_iter().enumerate() {
        seen.sort_unstable();
        assert_eq!(seen, (0..BURST).collect::<Vec<_>>(), "key {k}");
    }
}

/// Issue 15: `check()` used to return `Ok` with `allowed == false` on a rejection, so the
/// obvious `limiter.check().await?;` limited nothing.
async fn check_with_question_mark_limits(rg: Redguard) {
    async fn guarded(l: &Limiter) -> redguard::Result<&'static str> {
        l.check().await?;
        Ok("ran")
    }
    let l = limiter(&rg, "question-mark", Algorithm::Gcra, "2/min");
    assert_eq!(guarded(&l).await.unwrap(), "ran");
    assert_eq!(guarded(&l).await.unwrap(), "ran");
    let err = guarded(&l).await.unwrap_err();
    assert!(
        matches!(err, Error::RateLimited(d) if !d.allowed && d.retry_after > Duration::ZERO),
        "{err:?}"
    );
    // The same stacked: all-or-nothing, and `?` limits too.
    let other = limiter(&rg, "question-mark-2", Algorithm::Gcra, "10/min");
    assert!(matches!(
        l.clone().and(other.clone()).check().await,
        Err(Error::RateLimited(_))
    ));
    // A peek reports what would remain after one more call: 9 of 10 when nothing was charged.
    assert_eq!(
        other.peek().await.unwrap().remaining,
        9,
        "the other limit was charged"
    );
    // `decide` gives the decision either way.
    assert!(!l.decide().await.unwrap().allowed);
}

fn limiter(rg: &Redguard, name: &str, algorithm: Algorithm, rate: &str) -> Limiter {
    redguard::limiter(name)
        .on(rg)
        .algorithm(algorithm)
        .rate(rate)
}

async fn every_algorithm_admits_its_capacity_then_rejects(rg: Redguard) {
    for algorithm in Algorithm::ALL {
        let l = limiter(&rg, algorithm.as_str(), algorithm, "5/10s");
        for i in 0..5 {
            let d = l.decide().await.unwrap();
            assert!(d.allowed, "{algorithm}: call {i} rejected: {d:?}");
            assert_eq!(d.limit, 5, "{algorithm}");
            assert_eq!(d.remaining, 4 - i, "{algorithm}: {d:?}");
            assert_eq!(d.retry_after, Duration::ZERO, "{algorithm}");
        }
        let d = l.decide().await.unwrap();
        assert!(!d.allowed, "{algorithm}: sixth call admitted");
        assert_eq!(d.remaining, 0, "{algorithm}");
        // Within one period, except the sliding counter: its full previous window still
        // weighs in early in the next one (up to 1.2 periods here).
        let longest = if algorithm == Algorithm::SlidingCounter {
            12
        } else {
            10
        };
        assert!(
            d.retry_after > Duration::ZERO && d.retry_after <= Duration::from_secs(longest),
            "{algorithm}: {d:?}"
        );
        assert!(
            d.reset_after <= Duration::from_secs(20),
            "{algorithm}: {d:?}"
        );
        let err = l.check().await.unwrap_err();
        assert!(
            matches!(err, Error::RateLimited(d) if !d.allowed),
            "{err:?}"
        );
    }
}

async fn gcra_retry_after_is_the_emission_interval(rg: Redguard) {
    // 10/s: one unit every 100 ms; burst 3.
    let l = limiter(&rg, "gcra", Algorithm::Gcra, "10/s").burst(3);
    for _ in 0..3 {
        assert!(l.decide().await.unwrap().allowed);
    }
    let d = l.decide().await.unwrap();
    assert!(!d.allowed);
    // Some time passed between the calls, so a little less than 100 ms is left.
    assert!(
        d.retry_after <= Duration::from_millis(100) && d.retry_after > Duration::from_millis(20),
        "{d:?}"
    );
    assert!(d.reset_after <= Duration::from_millis(300), "{d:?}");
    assert_eq!(d.window, Duration::from_millis(300));
    tokio::time::sleep(d.retry_after + Duration::from_millis(5)).await;
    assert!(l.decide().await.unwrap().allowed);
}

async fn peek_does_not_count(rg: Redguard) {
    for algorithm in Algorithm::ALL {
        let l = limiter(&rg, "peek", algorithm, "2/min").scope(algorithm.as_str());
        for _ in 0..5 {
            let d = l.peek().await.unwrap();
            assert!(d.allowed && d.remaining == 1, "{algorithm}: {d:?}");
        }
        assert!(l.decide().await.unwrap().allowed);
        assert!(l.decide().await.unwrap().allowed);
        let d = l.peek().await.unwrap();
        assert!(!d.allowed && d.remaining == 0, "{algorithm}: {d:?}");
    }
}

async fn cost_counts_units_and_cost_above_burst_is_refused(rg: Redguard) {
    for algorithm in Algorithm::ALL {
        let l = limiter(&rg, "cost", algorithm, "10/min").scope(algorithm.as_str());
        let d = l.clone().cost(7).decide().await.unwrap();
        assert!(d.allowed && d.remaining == 3, "{algorithm}: {d:?}");
        let d = l.clone().cost(4).decide().await.unwrap();
        assert!(!d.allowed && d.remaining == 3, "{algorithm}: {d:?}");
        let d = l.clone().cost(3).decide().await.unwrap();
        assert!(d.allowed && d.remaining == 0, "{algorithm}: {d:?}");
        let err = l.clone().cost(11).decide().await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidLimit(ref m) if m.contains("exceeds the burst")),
            "{err}"
        );
    }
}

async fn stacked_rejection_by_user_does_not_charge_global(rg: Redguard) {
    for algorithm in Algorithm::ALL {
        let scope = algorithm.as_str();
        let global = limiter(&rg, "orders", algorithm, "100/min").scope(scope);
        let user = |id: u64| {
            limiter(&rg, "orders:user:", algorithm, "2/min")
                .key(redguard::key("orders:user:{user}").part("user", &id))
                .scope(scope)
        };
        let both = global.clone().and(user(1));
        assert!(both.check().await.is_ok());
        assert!(both.check().await.is_ok());
        for _ in 0..10 {
            let err = both.check().await.unwrap_err();
            assert!(matches!(err, Error::RateLimited(_)), "{err:?}");
            // The decisions say which limit said no.
            let ds = both.peek().await.unwrap();
            assert!(ds[0].allowed && !ds[1].allowed, "{ds:?}");
        }
        // Only the two admitted calls were charged to the global limit.
        assert_eq!(global.peek().await.unwrap().remaining, 97, "{algorithm}");
        // Another user still gets in.
        assert!(global.clone().and(user(2)).check().await.is_ok());
        assert_eq!(global.peek().await.unwrap().remaining, 96, "{algorithm}");
    }
}

async fn stacked_rejection_by_global_does_not_charge_user(rg: Redguard) {
    for algorithm in Algorithm::ALL {
        let scope = algorithm.as_str();
        let global = limiter(&rg, "search", algorithm, "3/min").scope(scope);
        let user = |id: u64| {
            limiter(&rg, "search:user:", algorithm, "10/min")
                .key(redguard::key("search:user:{user}").part("user", &id))
                .scope(scope)
        };
        for id in 1..=3 {
            assert!(global.clone().and(user(id)).check().await.is_ok());
        }
        for id in 1..=5 {
            let ds = global.clone().and(user(id)).decide().await.unwrap();
            assert!(!ds[0].allowed && ds[1].allowed, "{algorithm}: {ds:?}");
        }
        assert_eq!(user(1).peek().await.unwrap().remaining, 8, "{algorithm}");
        assert_eq!(user(4).peek().await.unwrap().remaining, 9, "{algorithm}");
    }
}

async fn block_rejects_without_counting_then_lifts(rg: Redguard) {
    // 10/s refills a unit every 100 ms; the 400 ms block is what keeps the key out after.
    let l = limiter(&rg, "login", Algorithm::Gcra, "10/s")
        .burst(2)
        .block(Duration::from_millis(400));
    assert!(l.decide().await.unwrap().allowed);
    assert!(l.decide().await.unwrap().allowed);
    let d = l.decide().await.unwrap();
    assert!(!d.allowed);
    assert!(d.retry_after >= Duration::from_millis(390), "{d:?}");
    tokio::time::sleep(Duration::from_millis(150)).await;
    for _ in 0..5 {
        let d = l.decide().await.unwrap();
        assert!(!d.allowed, "admitted while blocked");
        assert!(
            d.retry_after <= Duration::from_millis(260),
            "block extended: {d:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The rejected calls were not counted: the full burst is back.
    let d = l.decide().await.unwrap();
    assert!(d.allowed, "{d:?}");
    assert_eq!(d.remaining, 1);
}

/// A penalty belongs to the configuration that set it: a limit configured without one is
/// not held by one left behind (and does not read it).
async fn removing_the_penalty_lifts_it(rg: Redguard) {
    let blocked = limiter(&rg, "unblock", Algorithm::Gcra, "10/s")
        .burst(1)
        .block(Duration::from_secs(60));
    assert!(blocked.decide().await.unwrap().allowed);
    let d = blocked.decide().await.unwrap();
    assert!(
        !d.allowed && d.retry_after >= Duration::from_secs(59),
        "{d:?}"
    );
    // A unit refills after 100 ms; only the penalty still holds the key.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        !blocked.decide().await.unwrap().allowed,
        "the penalty did not hold"
    );
    let unblocked = limiter(&rg, "unblock", Algorithm::Gcra, "10/s").burst(1);
    let d = unblocked.decide().await.unwrap();
    assert!(d.allowed, "{d:?}");
}

/// The keys of stacked limits with different scopes or bodies have different hash tags, so on
/// a Cluster they sit in different slots and cannot share one script. Penalties must still
/// be what one script over every key decides (issue #12, item 6): on a Cluster a call
/// rejected before anything was charged used to return before writing any penalty, and the
/// third call below got a `retry_after` of 30 s there against 900 s on a single node.
async fn stacked_penalty_is_written_when_its_limit_rejects(rg: Redguard) {
    let block = Duration::from_secs(900);
    let ip = limiter(&rg, "login:ip:1", Algorithm::Gcra, "2/min")
        .scope("ip")
        .block(block);
    let user = limiter(&rg, "login:user:7", Algorithm::Gcra, "100/h").scope("user");
    let both = ip.clone().and(user.clone());
    for _ in 0..2 {
        assert!(both.decide().await.unwrap().iter().all(|d| d.allowed));
    }
    let ds = both.decide().await.unwrap();
    // Exact on every store: the penalty starts at this decision's own time.
    assert!(!ds[0].allowed, "{ds:?}");
    assert_eq!(ds[0].retry_after, block, "{ds:?}");
    assert_eq!(ds[0].reset_after, block, "{ds:?}");
    assert_eq!(ds[0].remaining, 0, "{ds:?}");
    assert!(ds[1].allowed && ds[1].retry_after.is_zero(), "{ds:?}");
    let err = both.check().await.unwrap_err();
    let Error::RateLimited(d) = err else {
        panic!("{err:?}")
    };
    assert!(
        d.retry_after <= block && d.retry_after > block - Duration::from_secs(60),
        "the penalty does not hold: {d:?}"
    );
    // The ip key stays blocked on its own, whatever the user limit says.
    let d = ip.decide().await.unwrap();
    assert!(
        !d.allowed && d.retry_after > block - Duration::from_secs(60),
        "{d:?}"
    );
    // Only the two admitted calls were charged to the user limit.
    let d = user.peek().await.unwrap();
    assert!(d.allowed && d.remaining == 97, "{d:?}");
}

/// Every limit that rejects a call writes its own penalty, whichever slot it is in.
async fn stacked_penalties_of_every_rejecting_limit(rg: Redguard) {
    let ip = limiter(&rg, "signup:ip:1", Algorithm::Gcra, "1/min")
        .scope("ip")
        .block(Duration::from_secs(600));
    let user = limiter(&rg, "signup:user:7", Algorithm::FixedWindow, "1/min")
        .scope("user")
        .block(Duration::from_secs(300));
    let global = limiter(&rg, "signup", Algorithm::SlidingWindow, "100/min").scope("global");
    let all = ip.clone().and(user.clone()).with(global.clone());
    assert!(all.decide().await.unwrap().iter().all(|d| d.allowed));
    let ds = all.decide().await.unwrap();
    assert!(!ds[0].allowed && !ds[1].allowed && ds[2].allowed, "{ds:?}");
    assert_eq!(ds[0].retry_after, Duration::from_secs(600), "{ds:?}");
    assert_eq!(ds[1].retry_after, Duration::from_secs(300), "{ds:?}");
    assert!(
        ds[2].retry_after.is_zero() && ds[2].remaining == 98,
        "{ds:?}"
    );
    let d = user.decide().await.unwrap();
    assert!(
        !d.allowed && d.retry_after > Duration::from_secs(240),
        "the user penalty was not written: {d:?}"
    );
    let d = ip.decide().await.unwrap();
    assert!(
        !d.allowed && d.retry_after > Duration::from_secs(540),
        "the ip penalty was not written: {d:?}"
    );
    // The global limit admitted both calls but was charged for the first only.
    let d = global.peek().await.unwrap();
    assert!(d.allowed && d.remaining == 98, "{d:?}");
}

/// A limit with a penalty that admits the call is not penalised because another limit (in
/// another slot) rejects it.
async fn stacked_penalty_is_not_written_when_another_limit_rejects(rg: Redguard) {
    let ip = limiter(&rg, "pay:ip:1", Algorithm::Gcra, "10/min")
        .scope("ip")
        .block(Duration::from_secs(900));
    let user = limiter(&rg, "pay:user:7", Algorithm::TokenBucket, "1/h").scope("user");
    let both = ip.clone().and(user);
    assert!(both.decide().await.unwrap().iter().all(|d| d.allowed));
    for _ in 0..3 {
        let ds = both.decide().await.unwrap();
        assert!(ds[0].allowed && !ds[1].allowed, "{ds:?}");
        assert!(
            ds[1].retry_after <= Duration::from_secs(3600)
                && ds[1].retry_after > Duration::from_secs(3500),
            "{ds:?}"
        );
    }
    let d = ip.decide().await.unwrap();
    assert!(d.allowed && d.remaining == 8, "{d:?}");
}

async fn lowering_the_limit_never_admits_beyond_it(rg: Redguard) {
    for algorithm in Algorithm::ALL {
        let scope = algorithm.as_str();
        let before = limiter(&rg, "cfg", algorithm, "10/min").scope(scope);
        for _ in 0..6 {
            assert!(before.decide().await.unwrap().allowed, "{algorithm}");
        }
        // Configuration now says 4/min: 6 were already admitted, so nothing more is.
        let after = limiter(&rg, "cfg", algorithm, "4/min").scope(scope);
        let d = after.decide().await.unwrap();
        assert!(
            !d.allowed,
            "{algorithm}: admitted beyond the lowered limit: {d:?}"
        );
        // Raising it again admits only up to the new capacity.
        let raised = limiter(&rg, "cfg", algorithm, "8/min").scope(scope);
        let mut admitted = 0;
        for _ in 0..10 {
            admitted += u32::from(raised.decide().await.unwrap().allowed);
        }
        assert_eq!(admitted, 2, "{algorithm}");
    }
}

/// GCRA counts in µs for intervals of whole µs and in ns below: a rate change between the
/// two keeps the debt in units, both ways.
async fn gcra_debt_is_kept_in_units_across_interval_units(rg: Redguard) {
    // 600,000 units owed at 1667 ns each (1.0002 s) are 600 s at 1000/s.
    let fast = limiter(&rg, "to-slow", Algorithm::Gcra, "600000/s");
    assert!(fast.clone().cost(600_000).decide().await.unwrap().allowed);
    let slow = limiter(&rg, "to-slow", Algorithm::Gcra, "1000/s").burst(600_000);
    let d = slow.peek().await.unwrap();
    assert!(
        d.reset_after > Duration::from_secs(500) && d.reset_after <= Duration::from_secs(600),
        "{d:?}"
    );
    // And back: 1000 units owed at 1 ms each (1 s) are 1.667 ms at 600,000/s.
    let slow = limiter(&rg, "to-fast", Algorithm::Gcra, "1000/s");
    assert!(slow.clone().cost(1000).decide().await.unwrap().allowed);
    let fast = limiter(&rg, "to-fast", Algorithm::Gcra, "600000/s").burst(1000);
    let d = fast.peek().await.unwrap();
    assert!(
        d.reset_after > Duration::from_millis(1) && d.reset_after <= Duration::from_micros(1667),
        "{d:?}"
    );
    // A billion units owed at 1 ns each are 82,000 years at 1 per 30 days: the debt is
    // capped at 2^52 µs (142 years), where every store still counts exactly.
    let fastest = limiter(&rg, "to-slowest", Algorithm::Gcra, "1000000000/s");
    assert!(
        fastest
            .clone()
            .cost(1_000_000_000)
            .decide()
            .await
            .unwrap()
            .allowed
    );
    let slowest = limiter(&rg, "to-slowest", Algorithm::Gcra, "1/30d");
    let d = slowest.decide().await.unwrap();
    assert!(!d.allowed, "{d:?}");
    assert_eq!(d.retry_after, Duration::from_micros(1 << 52), "{d:?}");
}

async fn changing_the_algorithm_replaces_state(rg: Redguard) {
    let mut previous: Option<Algorithm> = None;
    for algorithm in Algorithm::ALL.into_iter().chain([Algorithm::Gcra]) {
        let l = limiter(&rg, "switch", algorithm, "3/min");
        let d = l
            .decide()
            .await
            .unwrap_or_else(|e| panic!("{previous:?} -> {algorithm}: {e}"));
        assert!(d.allowed, "{previous:?} -> {algorithm}: {d:?}");
        previous = Some(algorithm);
    }
}

async fn bad_runtime_values_are_errors_not_panics(rg: Redguard) {
    let base = || redguard::limiter("cfg").on(&rg);
    for rate in ["0/s", "ten/s", "5/fortnight", "", "1/0s"] {
        let err = base().rate(rate).decide().await.unwrap_err();
        assert!(matches!(err, Error::InvalidLimit(_)), "{rate:?}: {err:?}");
    }
    let err = base().decide().await.unwrap_err();
    assert!(matches!(err, Error::InvalidLimit(_)), "{err:?}");
    let err = base().rate("5/s").burst(0).decide().await.unwrap_err();
    assert!(matches!(err, Error::InvalidLimit(_)), "{err:?}");
    let err = base().rate("5/s").cost(0).decide().await.unwrap_err();
    assert!(matches!(err, Error::InvalidLimit(_)), "{err:?}");
    let err = base()
        .rate("5/s")
        .algorithm(Algorithm::FixedWindow)
        .burst(9)
        .decide()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidLimit(_)), "{err:?}");
    let twice = base().rate("5/s").and(base().rate("10/s"));
    let err = twice.decide().await.unwrap_err();
    assert!(matches!(err, Error::InvalidLimit(_)), "{err:?}");
    let err = redguard::limiter(redguard::key("ip:{ip}").part("ip", "a b"))
        .on(&rg)
        .rate("5/s")
        .decide()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidKey { .. }), "{err:?}");
    let err = redguard::limiter(redguard::key("ip:{ip}").part("ip", &None::<String>))
        .on(&rg)
        .rate("5/s")
        .decide()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MissingKey { .. }), "{err:?}");
}

async fn decision_headers_for_a_rejection(rg: Redguard) {
    let l = limiter(&rg, "hdr", Algorithm::FixedWindow, "2/h");
    let allowed = l.decide().await.unwrap();
    let headers = allowed.headers();
    assert_eq!(headers.len(), 2, "{headers:?}");
    assert_eq!(
        headers[0],
        ("RateLimit-Policy", "\"default\";q=2;w=3600".to_owned())
    );
    assert!(
        headers[1].1.starts_with("\"default\";r=1;t="),
        "{headers:?}"
    );
    l.decide().await.unwrap();
    let rejected = l.decide().await.unwrap();
    let headers = rejected.headers();
    assert_eq!(headers[0].0, "Retry-After");
    let secs: u64 = headers[0].1.parse().unwrap();
    assert!((1..=3600).contains(&secs), "{headers:?}");
    assert!(
        headers[2].1.starts_with("\"default\";r=0;t="),
        "{headers:?}"
    );
    let _ = Rate::per_hour(2);
}
