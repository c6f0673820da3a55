//! A closed loop: `in_flight` tasks each run the operation back to back; warm-up, then a
//! measured window. Latencies are kept per task and merged afterwards (no shared counter on
//! the hot path).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One row of results (also what `peers.mjs` prints).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Sample {
    pub(crate) ops: u64,
    pub(crate) ops_per_sec: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) max_us: f64,
}

/// Operations every closed loop of this process started, warm-ups included (the next one's
/// `i`): what `bench/instructions.sh` divides the client's instructions by (coalesced checks
/// share one command, so commands no longer count operations). Read between loops, when
/// every operation started has completed.
pub(crate) static OPERATIONS: AtomicU64 = AtomicU64::new(0);

/// Runs `op(i)` from `in_flight` tasks, `i` unique across every loop of the run: cases on
/// "random keys" must not meet the keys of an earlier loop (an idempotent "first execution"
/// on a key a previous loop finished is a replay).
pub(crate) async fn closed_loop<F, Fut>(
    in_flight: usize,
    warmup: Duration,
    window: Duration,
    op: F,
) -> Sample
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let (op, measuring, stop) = (op.clone(), measuring.clone(), stop.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(1 << 16);
                while !stop.load(Ordering::Relaxed) {
                    let i = OPERATIONS.fetch_add(1, Ordering::Relaxed);
                    let started = Instant::now();
                    op(i).await;
                    if measuring.load(Ordering::Relaxed) {
                        latencies.push(started.elapsed().as_nanos() as u64);
                    }
                    // In-memory operations never yield on their own; without this a loop
                    // would starve the timer that ends the window.
                    if i.is_multiple_of(32) {
                        tokio::task::yield_now().await;
                    }
                }
                latencies
            })
        })
        .collect();
    let elapsed = window_of(warmup, window, &measuring, &stop).await;
    let mut all = Vec::new();
    for task in tasks {
        all.push(task.await.unwrap_or_default());
    }
    let all = all.into_iter().flatten().collect();
    sample(all, elapsed)
}

/// Percentiles of a set of latencies, in µs.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Latency {
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) max_us: f64,
}

impl Latency {
    fn of(mut ns: Vec<u64>) -> Self {
        ns.sort_unstable();
        let pct = |p: f64| {
            ns.get(((ns.len().saturating_sub(1)) as f64 * p) as usize)
                .map_or(0.0, |ns| *ns as f64 / 1000.0)
        };
        Latency {
            p50_us: pct(0.50),
            p99_us: pct(0.99),
            max_us: ns.last().map_or(0.0, |ns| *ns as f64 / 1000.0),
        }
    }
}

pub(crate) fn sample(latencies: Vec<u64>, elapsed: Duration) -> Sample {
    let ops = latencies.len() as u64;
    let latency = Latency::of(latencies);
    Sample {
        ops,
        ops_per_sec: ops as f64 / elapsed.as_secs_f64(),
        p50_us: latency.p50_us,
        p99_us: latency.p99_us,
        max_us: latency.max_us,
    }
}

/// `in_flight` contenders on one lock, each taking it (`acquire`), leaving at once
/// (`release`) and queueing again. The sample is critical sections per second and the wait
/// (call to entry); the second figure is the hand-off: the previous holder starting its
/// release to the next holder's entry.
pub(crate) async fn contended<A, AF, G, R, RF>(
    in_flight: usize,
    warmup: Duration,
    window: Duration,
    acquire: A,
    release: R,
) -> (Sample, Latency)
where
    A: Fn() -> AF + Send + Sync + 'static,
    AF: Future<Output = G> + Send,
    G: Send,
    R: Fn(G) -> RF + Send + Sync + 'static,
    RF: Future<Output = ()> + Send,
{
    let base = Instant::now();
    let ops = Arc::new((acquire, release));
    let released_at = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let (ops, released_at, measuring, stop) = (
                ops.clone(),
                released_at.clone(),
                measuring.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let (mut waits, mut handoffs) = (Vec::new(), Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let guard = (ops.0)().await;
                    let entered = base.elapsed().as_nanos() as u64;
                    if measuring.load(Ordering::Relaxed) {
                        waits.push(started.elapsed().as_nanos() as u64);
                        let previous = released_at.load(Ordering::Relaxed);
                        if previous > 0 {
                            handoffs.push(entered.saturating_sub(previous));
                        }
                    }
                    released_at.store(base.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    (ops.1)(guard).await;
                    tokio::task::yield_now().await;
                }
                (waits, handoffs)
            })
        })
        .collect();
    let elapsed = window_of(warmup, window, &measuring, &stop).await;
    let (mut waits, mut handoffs) = (Vec::new(), Vec::new());
    for task in tasks {
        let (w, h) = task.await.unwrap_or_default();
        waits.extend(w);
        handoffs.extend(h);
    }
    (sample(waits, elapsed), Latency::of(handoffs))
}

/// Warm-up, then the measured window (`measuring` set); then tells the tasks to stop.
/// Returns the window's real length.
async fn window_of(
    warmup: Duration,
    window: Duration,
    measuring: &AtomicBool,
    stop: &AtomicBool,
) -> Duration {
    tokio::time::sleep(warmup).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(window).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    elapsed
}
