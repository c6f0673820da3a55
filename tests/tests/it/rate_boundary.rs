//! The boundary burst: traffic hammering both sides of a window edge. A fixed window admits
//! its count on each side (up to 2× within a fraction of a window — documented); every other
//! algorithm stays within its own bound there.

use std::time::Duration;

use redguard::__private::store::{RateCheck, RateMode};
use redguard::{Algorithm, Rate, Redguard};

const LIMIT: u64 = 20;
/// Hammer from this long before a 1 s window edge to as long after it.
const HALF: Duration = Duration::from_millis(150);

/// Admitted calls when 4 tasks hammer `algorithm` back to back across a window edge.
async fn across_edge(rg: &Redguard, algorithm: Algorithm) -> usize {
    let limit =
        redguard::Limit::new(algorithm, Rate::per_second(LIMIT), None, 1, Duration::ZERO).unwrap();
    let body = redguard::KeyBuilder::new()
        .text(algorithm.as_str())
        .finish()
        .unwrap();
    let key = rg
        .key(redguard::GuardKind::RateLimit, "edge", &body)
        .unwrap();
    // Windows are aligned to the store's clock: wait until HALF before its next edge.
    let now = redguard::__private::store::of(rg).time().await.unwrap();
    let into = Duration::from_nanos((now.as_nanos() % 1_000_000_000) as u64);
    let mut wait = Duration::from_secs(1) - into;
    if wait < HALF + Duration::from_millis(20) {
        wait += Duration::from_secs(1);
    }
    tokio::time::sleep(wait - HALF).await;
    let stop = tokio::time::Instant::now() + 2 * HALF;
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (rg, key, limit) = (rg.clone(), key.clone(), limit.clone());
            tokio::spawn(async move {
                let mut admitted = 0;
                while tokio::time::Instant::now() < stop {
                    let checks = [RateCheck {
                        key: &key,
                        limit: &limit,
                    }];
                    let outcome = redguard::__private::store::of(&rg)
                        .rate_check(&checks, RateMode::Consume)
                        .await;
                    admitted += usize::from(outcome.unwrap().allowed());
                    tokio::task::yield_now().await;
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    admitted
}

async fn boundary_burst(rg: Redguard) {
    let limit = LIMIT as usize;
    for algorithm in Algorithm::ALL {
        let admitted = across_edge(&rg, algorithm).await;
        // What each algorithm allows within 2·HALF = 0.3 of its 1 s window.
        let bound = match algorithm {
            // Up to the count on each side of the edge.
            Algorithm::FixedWindow => 2 * limit,
            // Never more than the count in any window-long interval.
            Algorithm::SlidingWindow => limit,
            // The previous window's count, weighted by what is left of it, caps the new
            // window: at most 0.15 · count gets in after the edge (0.25 allowing 100 ms of
            // scheduling delay on a loaded machine: the store's time is what counts).
            Algorithm::SlidingCounter => limit + limit * 25 / 100 + 1,
            // burst + rate · t, t = 0.3 s plus the same 100 ms of slack.
            _ => limit + limit * 4 / 10 + 1,
        };
        println!("{algorithm:<16} admitted {admitted:>3} across the edge (bound {bound})");
        assert!(admitted <= bound, "{algorithm}: {admitted} > {bound}");
        if algorithm == Algorithm::FixedWindow {
            assert!(
                admitted > limit * 3 / 2,
                "the fixed window's boundary burst did not show: {admitted}"
            );
        } else {
            assert!(
                admitted < limit * 3 / 2,
                "{algorithm} let a boundary burst through: {admitted}"
            );
        }
    }
}

redguard_tests::conformance!(boundary_burst);
