//! A closed loop: `in_flight` tasks each run the operation back to back; warm-up, then a
//! measured window. Latencies are kept per task and merged afterwards (no shared counter on
//! the hot path).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// One row of results.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Sample {
    pub(crate) ops: u64,
    pub(crate) ops_per_sec: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) max_us: f64,
}

/// Runs `op(i)` (i = a counter unique across tasks) from `in_flight` tasks.
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
    let counter = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let (op, counter, measuring, stop) =
                (op.clone(), counter.clone(), measuring.clone(), stop.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(1 << 16);
                while !stop.load(Ordering::Relaxed) {
                    let i = counter.fetch_add(1, Ordering::Relaxed);
                    let started = Instant::now();
                    op(i).await;
                    if measuring.load(Ordering::Relaxed) {
                        latencies.push(started.elapsed().as_nanos() as u64);
                    }
                    // In-memory operations never yield on their own; without this a loop
                    // would starve the timer that ends the window.
                    if i % 32 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(warmup).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(window).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap_or_default());
    }
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len().saturating_sub(1)) as f64 * p) as usize)
            .map_or(0.0, |ns| *ns as f64 / 1000.0)
    };
    Sample {
        ops: all.len() as u64,
        ops_per_sec: all.len() as f64 / elapsed.as_secs_f64(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        max_us: all.last().map_or(0.0, |ns| *ns as f64 / 1000.0),
    }
}
