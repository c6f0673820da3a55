//! `cargo run --release -p redguard-bench [-- --quick]`
//!
//! Starts its own `redis-server` (pinned to core 0 when the machine has two or more cores;
//! the load runs on core 1), or uses `REDGUARD_REDIS_URL`'s server when set. For each case
//! it runs a closed loop of N operations in flight (N = 1, 16, 64), and measures Redis's own
//! ceiling for the same script with `redis-benchmark` in the same run. Prints a table and
//! writes `target/bench/results.{json,md}`.

mod baseline;
mod measure;

use std::fmt::Write as _;
use std::time::Duration;

use redguard::{Algorithm, Idempotency, KeyBuilder, Redguard, idempotent};
use serde::Serialize;

use crate::measure::{Sample, closed_loop};

/// Core for the load (this process, redis-benchmark); Redis gets core 0.
pub(crate) const LOAD_CORE: Option<&str> = Some("1");

#[derive(Debug, Serialize)]
struct Row {
    case: String,
    store: &'static str,
    in_flight: usize,
    #[serde(flatten)]
    sample: Sample,
    /// redis-benchmark of the same script at the same concurrency.
    baseline: Option<f64>,
    /// redis-benchmark `-c 16 -P 16`: the server's ceiling for the script.
    ceiling: Option<f64>,
}

struct Bench {
    rows: Vec<Row>,
    warmup: Duration,
    window: Duration,
    levels: Vec<usize>,
}

impl Bench {
    async fn run<F, Fut>(
        &mut self,
        case: &str,
        store: &'static str,
        baseline: Option<&[f64]>,
        ceiling: Option<f64>,
        op: F,
    ) where
        F: Fn(u64) -> Fut + Send + Sync + Clone + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        for (i, &in_flight) in self.levels.clone().iter().enumerate() {
            let sample = closed_loop(in_flight, self.warmup, self.window, op.clone()).await;
            let row = Row {
                case: case.to_owned(),
                store,
                in_flight,
                sample,
                baseline: baseline.and_then(|b| b.get(i).copied()),
                ceiling,
            };
            print_row(&row);
            self.rows.push(row);
        }
    }
}

fn print_header() {
    println!(
        "{:<34} {:<6} {:>4} {:>11} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "case", "store", "N", "ops/s", "p50 µs", "p99 µs", "max µs", "÷rb -cN", "÷ceiling"
    );
}

fn ratio(ops: f64, base: Option<f64>) -> String {
    base.filter(|b| *b > 0.0)
        .map_or("-".to_owned(), |b| format!("{:.2}", ops / b))
}

fn print_row(row: &Row) {
    let s = &row.sample;
    println!(
        "{:<34} {:<6} {:>4} {:>11.0} {:>9.1} {:>9.1} {:>9.0} {:>8} {:>8}",
        row.case,
        row.store,
        row.in_flight,
        s.ops_per_sec,
        s.p50_us,
        s.p99_us,
        s.max_us,
        ratio(s.ops_per_sec, row.baseline),
        ratio(s.ops_per_sec, row.ceiling)
    );
}

/// The same replay as the runtime-API case, through the attribute.
#[idempotent(key = "bench:{id}", expire = 600, scope = "bench")]
async fn annotated_replay(id: u64) -> redguard::Result<u64> {
    Ok(id)
}

fn idem_key(i: u64) -> redguard::KeyBody {
    KeyBuilder::new()
        .text("bench:")
        .part("id", &i)
        .finish()
        .expect("numeric key parts are valid")
}

async fn idem_first(i: u64) {
    let run = Idempotency::new("bench-first", idem_key(i))
        .expire(Duration::from_secs(60))
        .run(async move { Ok::<_, redguard::Error>(i) });
    run.await.expect("first execution");
}

async fn idem_replay(_: u64) {
    let run = Idempotency::new("bench", idem_key(0))
        .expire(Duration::from_secs(600))
        .run(async { Ok::<_, redguard::Error>(0u64) });
    run.await.expect("replay");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let quick = std::env::args().any(|a| a == "--quick");
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let pin = cores >= 2;
    if pin {
        // This process is the load: keep it off Redis's core.
        let _ = std::process::Command::new("taskset")
            .args([
                "-a",
                "-cp",
                LOAD_CORE.unwrap_or("1"),
                &std::process::id().to_string(),
            ])
            .output();
    }
    let server = redguard_tests::RedisServer::start_pinned(pin.then_some("0"));
    let port = server.port();
    let rg = Redguard::redis(server.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await?
        .install()?;
    let memory = Redguard::memory();

    let mut bench = Bench {
        rows: Vec::new(),
        warmup: Duration::from_millis(if quick { 200 } else { 1000 }),
        window: Duration::from_millis(if quick { 500 } else { 3000 }),
        levels: vec![1, 16, 64],
    };
    let requests = if quick { 20_000 } else { 200_000 };
    println!(
        "redguard-bench: redis-server {} on core 0, load on core 1 ({} cores), window {:?}",
        port, cores, bench.window
    );

    // Seed the record every replay case reads.
    idem_replay(0).await;
    rg.scope(async { annotated_replay(0).await.map(drop) })
        .await
        .map_err(|e| format!("{e:?}"))?;

    // Redis's own numbers for the replay script: idem_begin on a SUCCESS record.
    let begin_sha = redis::Script::new(include_str!(
        "../../runtime/src/store/redis/scripts/idem_begin.lua"
    ))
    .get_hash()
    .to_owned();
    let replay_key = "redguard:idem:{bench:bench:0}".to_owned();
    let replay_args: Vec<String> = ["EVALSHA", &begin_sha, "1", &replay_key, "o", "", "600000"]
        .map(str::to_owned)
        .to_vec();
    let rb = |clients, pipeline| {
        baseline::redis_benchmark(port, clients, pipeline, requests, &replay_args)
    };
    let replay_base: Vec<f64> = bench
        .levels
        .iter()
        .map(|&n| rb(n, 1).unwrap_or(0.0))
        .collect();
    let replay_ceiling = rb(16, 16);

    print_header();
    bench
        .run(
            "idempotency replay (runtime API)",
            "redis",
            Some(&replay_base),
            replay_ceiling,
            idem_replay,
        )
        .await;
    bench
        .run(
            "idempotency replay (#[idempotent])",
            "redis",
            Some(&replay_base),
            replay_ceiling,
            |_| async {
                annotated_replay(0).await.expect("replay");
            },
        )
        .await;
    // The same kind of connection the runtime uses.
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(server.url())?).await?;
    let raw_args = replay_args.clone();
    bench
        .run(
            "idempotency replay (raw EVALSHA)",
            "redis",
            Some(&replay_base),
            replay_ceiling,
            move |_| {
                let mut conn = conn.clone();
                let args = raw_args.clone();
                async move {
                    let _: redis::Value = redis::cmd(&args[0])
                        .arg(&args[1..])
                        .query_async(&mut conn)
                        .await
                        .expect("EVALSHA");
                }
            },
        )
        .await;
    bench
        .run(
            "idempotency first (begin+finish)",
            "redis",
            None,
            replay_ceiling,
            idem_first,
        )
        .await;
    let m = memory.clone();
    bench
        .run(
            "idempotency replay (runtime API)",
            "memory",
            None,
            None,
            move |i| {
                let m = m.clone();
                async move { m.scope(idem_replay(i)).await }
            },
        )
        .await;
    let m = memory.clone();
    bench
        .run(
            "idempotency first (begin+finish)",
            "memory",
            None,
            None,
            move |i| {
                let m = m.clone();
                async move { m.scope(idem_first(i)).await }
            },
        )
        .await;

    // Rate limits: the same script redis-benchmark runs, on random keys (the allowed path),
    // one hot key that always admits, and one hot key that always rejects.
    let rate_sha = redis::Script::new(include_str!(
        "../../runtime/src/store/redis/scripts/rate_check.lua"
    ))
    .get_hash()
    .to_owned();
    let rate_args = |algorithm: &str, key: &str, count: &str, burst: &str| -> Vec<String> {
        [
            "EVALSHA",
            &rate_sha,
            "2",
            key,
            &format!("{key}:block"),
            "0",
            "benchbenchbe",
            algorithm,
            count,
            "1000000",
            burst,
            "1",
            "0",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingCounter,
        Algorithm::SlidingWindow,
    ] {
        let name = algorithm.as_str();
        let burst = if algorithm.is_window() {
            "1000000"
        } else {
            "1000"
        };
        let args = rate_args(
            name,
            "redguard:rate:{bench:r:__rand_int__}",
            "1000000",
            burst,
        );
        let base: Vec<f64> = bench
            .levels
            .iter()
            .map(|&n| baseline::redis_benchmark(port, n, 1, requests, &args).unwrap_or(0.0))
            .collect();
        let ceiling = baseline::redis_benchmark(port, 16, 16, requests, &args);
        let limiter = move |i: u64| {
            let limiter = redguard::limiter("r:")
                .part("i", &i)
                .scope("bench")
                .rate("1000000/s")
                .algorithm(algorithm);
            if algorithm.is_window() {
                limiter
            } else {
                limiter.burst(1000)
            }
        };
        let rg2 = rg.clone();
        bench
            .run(
                &format!("rate {name} random keys"),
                "redis",
                Some(&base),
                ceiling,
                move |i| {
                    let check = limiter(i).on(&rg2);
                    async move {
                        check.check().await.expect("rate check");
                    }
                },
            )
            .await;
        if algorithm == Algorithm::Gcra {
            let m = memory.clone();
            bench
                .run(
                    &format!("rate {name} random keys"),
                    "memory",
                    None,
                    None,
                    move |i| {
                        let check = limiter(i).on(&m);
                        async move {
                            check.check().await.expect("rate check");
                        }
                    },
                )
                .await;
            for (case, rate, burst) in [("allowed", "1000000/s", 1000), ("denied", "1/h", 1)] {
                let rg2 = rg.clone();
                let hot = move || {
                    redguard::limiter("hot:")
                        .part("case", case)
                        .scope("bench")
                        .rate(rate)
                        .burst(burst)
                        .on(&rg2)
                };
                bench
                    .run(
                        &format!("rate gcra one hot key, {case}"),
                        "redis",
                        None,
                        ceiling,
                        move |_| {
                            let check = hot();
                            async move {
                                check.check().await.expect("rate check");
                            }
                        },
                    )
                    .await;
            }
        }
    }

    // Locks: acquire + release on random keys (uncontended), then contenders on one key.
    let rg2 = rg.clone();
    bench
        .run(
            "lock acquire+release random keys",
            "redis",
            None,
            None,
            move |i| {
                let lock = rg2.lock(KeyBuilder::new().text("l:").part("i", &i));
                async move {
                    lock.acquire()
                        .await
                        .expect("acquire")
                        .release()
                        .await
                        .expect("release");
                }
            },
        )
        .await;
    let m = memory.clone();
    bench
        .run(
            "lock acquire+release random keys",
            "memory",
            None,
            None,
            move |i| {
                let lock = m.lock(KeyBuilder::new().text("l:").part("i", &i));
                async move {
                    lock.acquire()
                        .await
                        .expect("acquire")
                        .release()
                        .await
                        .expect("release");
                }
            },
        )
        .await;
    let levels = std::mem::replace(&mut bench.levels, vec![16, 64]);
    for fair in [false, true] {
        let rg2 = rg.clone();
        let case = if fair {
            "lock one key, fair (sections/s, wait)"
        } else {
            "lock one key, default (sections/s, wait)"
        };
        bench
            .run(case, "redis", None, None, move |_| {
                let lock = rg2.lock("contended").wait(Duration::from_secs(10));
                let lock = if fair { lock.fair() } else { lock };
                async move {
                    lock.acquire()
                        .await
                        .expect("acquire")
                        .release()
                        .await
                        .expect("release");
                }
            })
            .await;
    }
    bench.levels = levels;

    write_reports(&bench.rows)?;
    Ok(())
}

fn write_reports(rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(rows)?,
    )?;
    let mut md = String::from(
        "| case | store | N | ops/s | p50 µs | p99 µs | max µs | ÷ redis-benchmark -c N | ÷ ceiling (-c 16 -P 16) |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let s = &row.sample;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.0} | {} | {} |",
            row.case,
            row.store,
            row.in_flight,
            s.ops_per_sec,
            s.p50_us,
            s.p99_us,
            s.max_us,
            ratio(s.ops_per_sec, row.baseline),
            ratio(s.ops_per_sec, row.ceiling)
        );
    }
    std::fs::write(dir.join("results.md"), md)?;
    println!("wrote {}", dir.join("results.{json,md}").display());
    Ok(())
}
