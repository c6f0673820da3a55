//! How the guards spread over a Redis Cluster: the same operations on the single node and on
//! a 3-master Cluster (with a replica each), with the Redis CPU each operation costs and how
//! it splits between the masters.
//!
//! A 2-core machine cannot show throughput growing with masters: every node shares core 0.
//! What it can measure is what decides the growth on real hardware: the server CPU per
//! operation on each master (`INFO cpu` before and after each loop). With a core per master
//! the busiest master saturates first, so the projected ceiling is the operations divided by
//! the busiest master's CPU seconds; for the single node, by its own.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redguard::{Redguard, key::KeyBuilder, rate::Algorithm};
use redguard_tests::RedisCluster;

use crate::Bench;
use crate::measure::{OPERATIONS, closed_loop};

/// Distinct idempotency records the replay case reads, so replays spread over the slots.
const RECORDS: u64 = 1024;

/// One loop of the scaling table.
struct Spread {
    case: &'static str,
    store: &'static str,
    in_flight: usize,
    ops_per_sec: f64,
    /// Redis CPU µs per operation, all masters together.
    cpu_us: f64,
    /// The busiest master's share of that CPU.
    busiest: f64,
    /// Operations per second when the busiest master has a core to itself.
    ceiling: f64,
}

/// `used_cpu_user + used_cpu_sys` of each master, in seconds.
fn cpu(masters: &[String]) -> Vec<f64> {
    masters
        .iter()
        .map(|url| {
            let mut conn = redis::Client::open(url.as_str())
                .and_then(|client| client.get_connection())
                .expect("connect to a master for INFO");
            let info: String = redis::cmd("INFO")
                .arg("cpu")
                .query(&mut conn)
                .expect("INFO cpu");
            info.lines()
                .filter_map(|line| line.split_once(':'))
                .filter(|(name, _)| matches!(*name, "used_cpu_user" | "used_cpu_sys"))
                .map(|(_, value)| value.trim().parse::<f64>().expect("a CPU figure"))
                .sum()
        })
        .collect()
}

/// The operations of the table, each on random keys.
#[derive(Debug, Clone, Copy)]
enum Op {
    Gcra,
    Lock,
    Replay,
}

impl Op {
    const ALL: [Op; 3] = [Op::Gcra, Op::Lock, Op::Replay];

    fn case(self) -> &'static str {
        match self {
            Op::Gcra => "gcra random keys (runtime API)",
            Op::Lock => "lock acquire+release random keys (runtime API)",
            Op::Replay => "idempotency replay, 1024 records (runtime API)",
        }
    }

    async fn run(self, rg: Redguard, i: u64) {
        match self {
            Op::Gcra => crate::rate::check(crate::rate::limiter(Algorithm::Gcra, i).on(&rg)).await,
            Op::Lock => crate::lock::section(rg, i).await,
            Op::Replay => {
                let replay = redguard::idempotency(record(i))
                    .scope("bench-scale")
                    .expire(Duration::from_secs(600))
                    .run(async { Ok::<_, redguard::Error>(0u64) });
                rg.scope(replay).await.expect("replay");
            }
        }
    }
}

fn record(i: u64) -> redguard::key::KeyBody {
    KeyBuilder::new()
        .text("s:")
        .part("id", &(i % RECORDS))
        .finish()
        .expect("numeric key parts are valid")
}

pub(crate) async fn cases(bench: &mut Bench, single: &Redguard, single_url: &str) {
    if !Op::ALL
        .iter()
        .any(|op| bench.selected(op.case(), "cluster"))
    {
        return;
    }
    let mut cluster = RedisCluster::start();
    if crate::LOAD_CORE.is_some() {
        // Every node on Redis's core, as the single node is: the masters share it.
        for i in 0..6 {
            if let Some(pid) = cluster.node(i).pid() {
                let _ = std::process::Command::new("taskset")
                    .args(["-a", "-cp", "0", &pid.to_string()])
                    .output();
            }
        }
    }
    let masters = cluster.master_urls();
    let clustered = Redguard::redis_cluster(cluster.urls())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect to the bench Cluster");
    for rg in [single, &clustered] {
        for i in 0..RECORDS {
            Op::Replay.run(rg.clone(), i).await;
        }
    }
    let mut spreads = Vec::new();
    for op in Op::ALL {
        let case = op.case();
        for (store, rg, nodes) in [
            ("redis", single, vec![single_url.to_owned()]),
            ("cluster", &clustered, masters.clone()),
        ] {
            for in_flight in bench.levels.clone() {
                let before = (cpu(&nodes), OPERATIONS.load(Ordering::Relaxed));
                let rg = rg.clone();
                let sample = closed_loop(in_flight, bench.warmup, bench.window, move |i| {
                    op.run(rg.clone(), i)
                })
                .await;
                let ops = (OPERATIONS.load(Ordering::Relaxed) - before.1) as f64;
                let used: Vec<f64> = cpu(&nodes)
                    .iter()
                    .zip(&before.0)
                    .map(|(after, before)| after - before)
                    .collect();
                let total: f64 = used.iter().sum();
                let busiest = used.iter().copied().fold(0.0, f64::max);
                let spread = Spread {
                    case,
                    store,
                    in_flight,
                    ops_per_sec: sample.ops_per_sec,
                    cpu_us: total / ops * 1e6,
                    busiest: busiest / total,
                    ceiling: ops / busiest,
                };
                print_spread(&spread);
                spreads.push(spread);
                if store == "cluster" {
                    bench.push(crate::Row::plain(case, store, in_flight, sample));
                }
            }
        }
    }
    write_table(&spreads);
}

fn print_spread(s: &Spread) {
    println!(
        "  scale: {:<48} {:<7} {:>3} {:>9.0} ops/s  {:>5.1} µs Redis CPU/op  busiest master {:>4.0}%  ceiling {:>8.0}/s",
        s.case,
        s.store,
        s.in_flight,
        s.ops_per_sec,
        s.cpu_us,
        s.busiest * 100.0,
        s.ceiling
    );
}

/// `target/bench/scaling.md`: each row beside the single node's at the same N.
fn write_table(spreads: &[Spread]) {
    let mut md = String::from(
        "| case | store | N | ops/s | ÷ single node | Redis CPU µs/op | busiest master | ceiling, a core per master (ops/s) | ÷ single node's ceiling |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in spreads {
        let single = spreads
            .iter()
            .find(|o| o.store == "redis" && o.case == s.case && o.in_flight == s.in_flight);
        let vs = |f: fn(&Spread) -> f64| {
            single.map_or("-".to_owned(), |o| format!("{:.2}", f(s) / f(o)))
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} | {} | {:.1} | {:.0}% | {:.0} | {} |",
            s.case,
            s.store,
            s.in_flight,
            s.ops_per_sec,
            vs(|s| s.ops_per_sec),
            s.cpu_us,
            s.busiest * 100.0,
            s.ceiling,
            vs(|s| s.ceiling),
        );
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("scaling.md");
    match std::fs::write(&path, md) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(err) => eprintln!("could not write {}: {err}", path.display()),
    }
}
