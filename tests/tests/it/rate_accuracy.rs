//! Driven accuracy: every algorithm at 5× its rate, against the memory store (many tasks)
//! and against Redis (many tasks in each of 2 OS processes). What was admitted must stay
//! within the algorithm's bound everywhere, and reach at least 95% of what it allows.
//! A second set of runs hammers a window edge: only the fixed window may exceed its count
//! there (up to 2×).

use std::process::Command;
use std::time::Duration;

use redguard::{Redguard, rate::Algorithm, rate::Rate};
use redguard_tests::RedisServer;
use redguard_tests::rate::{Driven, Load, drive, verdict};

const RATE_PER_SEC: u64 = 100;
const BURST: u64 = 20;
const RUN: Duration = Duration::from_millis(3000);

fn load(algorithm: Algorithm, processes: usize) -> Load {
    Load {
        key: format!("load-{}", algorithm.as_str()),
        algorithm,
        rate: Rate::per_second(RATE_PER_SEC),
        burst: (!algorithm.is_window()).then_some(BURST),
        tasks: 8,
        // 5× the rate in total.
        offered_per_sec: (5 * RATE_PER_SEC) as f64 / processes as f64,
        duration: RUN,
    }
}

fn check(store: &str, load: &Load, driven: &Driven) {
    let v = verdict(&load.limit(), &driven.admitted);
    println!(
        "{store} {:<16} admitted {:>4} rejected {:>5} errors {} | nominal {:>6.1} ({:.1}%) | \
         worst interval {} excess {:.3}",
        load.algorithm.as_str(),
        v.admitted,
        driven.rejected,
        driven.errors,
        v.nominal,
        100.0 * v.admitted as f64 / v.nominal,
        v.worst_interval,
        v.worst_excess,
    );
    assert_eq!(driven.errors, 0, "{store} {}", load.algorithm);
    assert!(
        v.worst_excess <= 1e-6,
        "{store} {}: admitted beyond the bound: {v:?}",
        load.algorithm
    );
    assert!(
        v.admitted as f64 >= 0.95 * v.nominal,
        "{store} {}: admitted under 95% of the bound: {v:?}",
        load.algorithm
    );
    assert!(driven.rejected > 0, "the load must exceed the rate");
}

async fn memory_run(algorithm: Algorithm) {
    let rg = Redguard::memory();
    let load = load(algorithm, 1);
    let driven = drive(&rg, &load).await;
    check("memory", &load, &driven);
}

/// Runs `load` in 2 `rate_worker` processes on `server`, merging what they admitted.
fn redis_run(server: &RedisServer, algorithm: Algorithm) {
    let load = load(algorithm, 2);
    // Both processes run at once.
    let spawned: Vec<_> = (0..2)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_rate_worker"))
                .arg(server.url())
                .args(load.to_args())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn rate_worker")
        })
        .collect();
    let mut driven = Driven::default();
    for child in spawned {
        let out = child.wait_with_output().expect("rate_worker output");
        assert!(out.status.success(), "rate_worker failed");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            match line.split_once(' ') {
                Some(("rejected", n)) => driven.rejected += n.parse::<u64>().unwrap(),
                Some(("errors", n)) => driven.errors += n.parse::<u64>().unwrap(),
                _ => driven.admitted.push(line.parse().unwrap()),
            }
        }
    }
    driven.admitted.sort_unstable();
    check("redis ", &load, &driven);
}

macro_rules! per_algorithm {
    ($($name:ident => $algorithm:expr),* $(,)?) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    memory_run($algorithm).await;
                }
            )*
        }
        mod redis {
            use super::*;
            $(
                #[test]
                fn $name() {
                    let server = RedisServer::start();
                    redis_run(&server, $algorithm);
                    server.assert_every_key_has_ttl();
                }
            )*
        }
    };
}

per_algorithm!(
    gcra => Algorithm::Gcra,
    token_bucket => Algorithm::TokenBucket,
    leaky_bucket => Algorithm::LeakyBucket,
    sliding_window => Algorithm::SlidingWindow,
    sliding_counter => Algorithm::SlidingCounter,
    fixed_window => Algorithm::FixedWindow,
);
