//! A separate OS process taking redguard locks against a shared Redis, for the multi-process
//! lock tests (`tests/tests/lock_processes.rs`). Reports what it saw on stdout, one fact a line.
//!
//! ```text
//! lock_worker <redis-url> mutex <name> <tasks> <iterations>
//!     each task enters `#[dist_lock(key = "mutex:{name}")]` <iterations> times and does a
//!     non-atomic read-modify-write of `counter:<name>` inside; prints
//!     `F <counter value read> <fence>` per section, then `OVERLAPS <n>` and `DONE <secs>`.
//! lock_worker <redis-url> fair <name> <tasks> <iterations>
//!     the same through a fair lock, `#[dist_lock(key = "fair:{name}", fair)]`.
//! lock_worker <redis-url> hold <name> <lease-ms>
//!     takes `hold:<name>` with that lease, prints `ACQUIRED <fence>`, then sleeps forever
//!     (the watchdog keeps renewing) until killed.
//! lock_worker <redis-url> job <name>
//!     runs a `skip_if_held`, `hold_at_least = "2s"` job once; prints `RAN` or `SKIPPED`.
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::AsyncCommands as _;
use redis::aio::MultiplexedConnection;

type Result<T> = std::result::Result<T, redguard::Error>;

fn backend(op: &'static str) -> impl Fn(redis::RedisError) -> redguard::Error {
    move |source| {
        let source = redguard::StoreFailure::new(source);
        redguard::BackendError::Failed { op, source }.into()
    }
}

#[redguard::dist_lock(key = "mutex:{name}", wait = "60s", lease = "5s", scope = "worker")]
async fn section(
    name: &str,
    conn: &mut MultiplexedConnection,
    overlaps: &AtomicU64,
) -> Result<(u64, u64)> {
    read_modify_write(name, conn, overlaps).await
}

#[redguard::dist_lock(
    key = "fair:{name}",
    fair,
    wait = "60s",
    lease = "5s",
    scope = "worker"
)]
async fn fair_section(
    name: &str,
    conn: &mut MultiplexedConnection,
    overlaps: &AtomicU64,
) -> Result<(u64, u64)> {
    read_modify_write(name, conn, overlaps).await
}

/// The section under test: a read-modify-write that loses updates unless exclusive, plus an
/// `inside` gauge that exceeds 1 whenever two holders overlap.
async fn read_modify_write(
    name: &str,
    conn: &mut MultiplexedConnection,
    overlaps: &AtomicU64,
) -> Result<(u64, u64)> {
    let inside: u64 = conn
        .incr(format!("inside:{name}"), 1)
        .await
        .map_err(backend("incr"))?;
    if inside != 1 {
        overlaps.fetch_add(1, Ordering::SeqCst);
    }
    let counter_key = format!("counter:{name}");
    let value: Option<u64> = conn.get(&counter_key).await.map_err(backend("get"))?;
    let value = value.unwrap_or(0);
    tokio::task::yield_now().await;
    let _: () = conn
        .set_ex(&counter_key, value + 1, 600)
        .await
        .map_err(backend("set"))?;
    let _: i64 = conn
        .decr(format!("inside:{name}"), 1)
        .await
        .map_err(backend("decr"))?;
    let _: bool = conn
        .expire(format!("inside:{name}"), 600)
        .await
        .map_err(backend("expire"))?;
    Ok((value, redguard::fence().unwrap_or(0)))
}

#[redguard::dist_lock(
    key = "job:{name}",
    skip_if_held,
    hold_at_least = "2s",
    scope = "worker"
)]
async fn job(name: &str) -> Result<()> {
    let _ = name;
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, mode, name, rest @ ..] = args.as_slice() else {
        eprintln!("usage: lock_worker <redis-url> <mode> <name> ...");
        std::process::exit(2);
    };
    let rg = redguard::Redguard::redis(url.clone())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect");
    rg.clone().install().expect("install");
    match mode.as_str() {
        "mutex" | "fair" => {
            let fair = mode == "fair";
            let tasks: usize = rest[0].parse().expect("tasks");
            let iterations: usize = rest[1].parse().expect("iterations");
            let client = redis::Client::open(url.as_str()).expect("client");
            let overlaps = Arc::new(AtomicU64::new(0));
            let started = Instant::now();
            let handles: Vec<_> = (0..tasks)
                .map(|_| {
                    let client = client.clone();
                    let name = name.clone();
                    let overlaps = Arc::clone(&overlaps);
                    tokio::spawn(async move {
                        let mut conn = client
                            .get_multiplexed_async_connection()
                            .await
                            .expect("connect");
                        let mut seen = Vec::with_capacity(iterations);
                        for _ in 0..iterations {
                            let entered = if fair {
                                fair_section(&name, &mut conn, &overlaps).await
                            } else {
                                section(&name, &mut conn, &overlaps).await
                            };
                            let (value, fence) = entered.expect("section");
                            seen.push((value, fence));
                        }
                        seen
                    })
                })
                .collect();
            let mut out = String::new();
            for handle in handles {
                for (value, fence) in handle.await.expect("task") {
                    out.push_str(&format!("F {value} {fence}\n"));
                }
            }
            print!("{out}");
            println!("OVERLAPS {}", overlaps.load(Ordering::SeqCst));
            println!("DONE {:.3}", started.elapsed().as_secs_f64());
        }
        "hold" => {
            let lease: u64 = rest[0].parse().expect("lease ms");
            let guard = rg
                .lock(format!("hold:{name}"))
                .scope("worker")
                .lease(Duration::from_millis(lease))
                .acquire()
                .await
                .expect("acquire");
            println!("ACQUIRED {}", guard.fence());
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(guard);
        }
        "job" => match job(name).await {
            Ok(()) => println!("RAN"),
            Err(redguard::Error::LockHeld { .. }) => println!("SKIPPED"),
            Err(other) => panic!("job: {other}"),
        },
        other => panic!("unknown mode {other}"),
    }
}
