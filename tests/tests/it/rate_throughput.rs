//! Throughput and latency of one rate-limit check per algorithm on a local Redis (debug
//! build, shared 2-core machine: the numbers are indicative, printed, not asserted), and of a
//! two-limit composite check.

use std::time::{Duration, Instant};

use redguard::{rate::Algorithm, rate::Rate};
use redguard_tests::RedisServer;

const TASKS: usize = 16;
const PER_TASK: usize = 250;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_per_second() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    println!("{TASKS} tasks × {PER_TASK} checks on one connection:");
    for (algorithm, stacked) in Algorithm::ALL
        .into_iter()
        .map(|a| (a, false))
        .chain([(Algorithm::Gcra, true)])
    {
        let started = Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let rg = rg.clone();
                tokio::spawn(async move {
                    let user = rg
                        .limiter(redguard::key("user:{id}").part("id", &task))
                        .algorithm(algorithm)
                        .rate(Rate::per_second(1000));
                    let global = redguard::limiter("all")
                        .on(&rg)
                        .algorithm(algorithm)
                        .rate(Rate::per_second(1000));
                    let both = global.and(user.clone());
                    let mut latencies = Vec::with_capacity(PER_TASK);
                    for _ in 0..PER_TASK {
                        let t = Instant::now();
                        if stacked {
                            both.decide().await.unwrap();
                        } else {
                            user.decide().await.unwrap();
                        }
                        latencies.push(t.elapsed());
                    }
                    latencies
                })
            })
            .collect();
        let mut latencies: Vec<Duration> = Vec::new();
        for task in tasks {
            latencies.extend(task.await.unwrap());
        }
        let elapsed = started.elapsed();
        latencies.sort_unstable();
        let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
        println!(
            "  {:<24} {:>7.0} checks/s  p50 {:>6.2?}  p99 {:>6.2?}",
            if stacked {
                "gcra (user + global)".to_owned()
            } else {
                algorithm.to_string()
            },
            latencies.len() as f64 / elapsed.as_secs_f64(),
            pct(0.5),
            pct(0.99),
        );
        assert_eq!(latencies.len(), TASKS * PER_TASK);
        // Let the keys of this round expire apart from the next one's.
        let _ = redis::cmd("FLUSHALL").query::<()>(&mut server.connection());
    }
}
