//! In-process GCRA: `Redguard::memory()` against governor's keyed `RateLimiter` (its
//! `DashMap` state store), the same quota, on 1 and 2 threads. The quota, one a minute with a
//! burst of 1,000, admits every check of these rows and keeps each key's state a minute: a
//! first row fills 1,000,000 keys, the next ones check random keys among them, so both
//! limiters hold a million live keys throughout.
//!
//! Both run in one harness: each thread a current-thread runtime looping over the check, its
//! latencies kept per thread. The threads may use both cores (Redis idles meanwhile).

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use redguard::{Algorithm, Redguard};

use crate::measure::{Sample, sample};
use crate::{Bench, Row};

/// Live keys of the rows.
const KEYS: u64 = 1_000_000;

/// The threads of the random-key rows.
const THREADS: [usize; 2] = [1, 2];

/// The quota: 1 per minute, bursts of 1,000.
const RATE: &str = "1/min";
const BURST: u32 = 1000;

fn governor() -> DefaultKeyedRateLimiter<String> {
    let burst = NonZeroU32::new(BURST).expect("the burst is not zero");
    let quota = Quota::per_minute(NonZeroU32::MIN).allow_burst(burst);
    RateLimiter::keyed(quota)
}

/// The key a user would build from a request, for both limiters' `i`.
fn key(i: u64) -> String {
    format!("r:i={i}")
}

async fn ours(memory: &Redguard, i: u64) {
    let decision = redguard::limiter("r:")
        .part("i", &i)
        .scope("bench")
        .rate(RATE)
        .burst(u64::from(BURST))
        .algorithm(Algorithm::Gcra)
        .on(memory)
        .decide()
        .await
        .expect("memory check");
    assert!(decision.allowed, "the quota admits every check of a row");
}

fn theirs(limiter: &DefaultKeyedRateLimiter<String>, i: u64) {
    assert!(
        limiter.check_key(&key(i)).is_ok(),
        "the quota admits every check of a row"
    );
}

/// Key `n` of a row's sequence: every key once (`fill`), or a random one of [`KEYS`].
fn pick(n: u64, fill: bool) -> u64 {
    if fill {
        return n;
    }
    // splitmix64: a different key each check, spread over the whole million.
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % KEYS
}

pub(crate) async fn cases(bench: &mut Bench) {
    let names = [
        "gcra in-process, fill 1M keys (CPU time per check)",
        "gcra in-process, fill 1M keys",
        "gcra in-process, 1M live keys",
    ];
    if !names
        .iter()
        .any(|case| bench.selected(case, "memory") || bench.selected(case, "peer"))
    {
        return;
    }
    let (warmup, window) = (bench.warmup, bench.window);
    let memory = Redguard::memory();
    let limiter = Arc::new(governor());
    let peer_case = |case: &str| format!("peer governor {}", case.trim_start_matches("gcra "));
    let runs = [(names[0], 1, Run::Fill { cpu: true })]
        .into_iter()
        .chain([(names[1], 1, Run::Fill { cpu: false })])
        .chain(THREADS.map(|n| (names[2], n, Run::Window { warmup, window })));
    for (case, n, run) in runs {
        // The CPU-time fill fills limiters of its own, dropped after it.
        let (limiter, memory) = match run {
            Run::Fill { cpu: true } => (Arc::new(governor()), Redguard::memory()),
            _ => (limiter.clone(), memory.clone()),
        };
        // Governor first at each level, as the Redis peers run right before ours.
        let theirs = threads(n, run, move |each| {
            let limiter = limiter.clone();
            runtime().block_on(each.check(|i| {
                theirs(&limiter, i);
                std::future::ready(())
            }))
        });
        let ours = threads(n, run, move |each| {
            let memory = memory.clone();
            runtime().block_on(each.check(|i| ours(&memory, i)))
        });
        bench.push(Row::plain(&peer_case(case), "peer", n, theirs.clone()));
        let mut row = Row::plain(case, "memory", n, ours);
        row.peer = Some(theirs.ops_per_sec);
        bench.push(row);
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// How long a row runs.
#[derive(Debug, Clone, Copy)]
enum Run {
    /// Until every one of [`KEYS`] was checked once, all of it measured; `cpu`: in the
    /// thread's CPU time, which a preemption does not stop (a stall the limiter causes, as
    /// a map growing, shows; the wait for a core on a loaded machine does not).
    Fill {
        cpu: bool,
    },
    Window {
        warmup: Duration,
        window: Duration,
    },
}

/// What the threads of a row share: the next block of keys, and whether to measure or stop.
struct Each {
    fill: bool,
    cpu: bool,
    next: AtomicU64,
    measuring: AtomicBool,
    stop: AtomicBool,
}

impl Each {
    /// `op(key)` back to back until the row ends; the latencies measured.
    async fn check<F, Fut>(&self, mut op: F) -> Vec<u64>
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut latencies = Vec::with_capacity(1 << 20);
        // Keys in blocks of 1,024 per thread: no shared counter per check.
        while !self.stop.load(Ordering::Relaxed) {
            let first = self.next.fetch_add(1024, Ordering::Relaxed);
            for n in first..first + 1024 {
                if self.fill && n >= KEYS {
                    return latencies;
                }
                let started = Instant::now();
                let cpu = if self.cpu { thread_cpu_ns() } else { 0 };
                op(pick(n, self.fill)).await;
                if self.measuring.load(Ordering::Relaxed) {
                    latencies.push(if self.cpu {
                        thread_cpu_ns() - cpu
                    } else {
                        started.elapsed().as_nanos() as u64
                    });
                }
            }
        }
        latencies
    }
}

/// `worker` on `n` threads, each calling [`Each::check`] on a runtime of its own.
fn threads<W>(n: usize, run: Run, worker: W) -> Sample
where
    W: Fn(&Each) -> Vec<u64> + Send + Sync + 'static,
{
    let fill = matches!(run, Run::Fill { .. });
    let each = Arc::new(Each {
        fill,
        cpu: matches!(run, Run::Fill { cpu: true }),
        next: AtomicU64::new(0),
        measuring: AtomicBool::new(fill),
        stop: AtomicBool::new(false),
    });
    let worker = Arc::new(worker);
    tokio::task::block_in_place(|| measure_threads(n, run, &each, &worker))
}

fn measure_threads<W>(n: usize, run: Run, each: &Arc<Each>, worker: &Arc<W>) -> Sample
where
    W: Fn(&Each) -> Vec<u64> + Send + Sync + 'static,
{
    let started = Instant::now();
    let workers: Vec<_> = (0..n)
        .map(|_| {
            let (each, worker) = (each.clone(), worker.clone());
            std::thread::spawn(move || {
                use_every_core();
                worker(&each)
            })
        })
        .collect();
    let Run::Window { warmup, window } = run else {
        let all = join(workers);
        return sample(all, started.elapsed());
    };
    std::thread::sleep(warmup);
    each.measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    std::thread::sleep(window);
    each.measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    each.stop.store(true, Ordering::Relaxed);
    sample(join(workers), elapsed)
}

fn join(workers: Vec<std::thread::JoinHandle<Vec<u64>>>) -> Vec<u64> {
    workers
        .into_iter()
        .flat_map(|worker| worker.join().expect("a worker"))
        .collect()
}

/// Lets the calling thread run on every core: the bench pins itself to the load core, and
/// two threads on one core would measure the scheduler.
fn use_every_core() {
    let Ok(me) = std::fs::read_link("/proc/thread-self") else {
        return;
    };
    let Some(tid) = me.file_name().and_then(|tid| tid.to_str()) else {
        return;
    };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let all = format!("0-{}", cores.saturating_sub(1));
    let _ = std::process::Command::new("taskset")
        .args(["-cp", &all, tid])
        .output();
}

/// The calling thread's CPU time, ns (std has no thread CPU clock).
#[allow(unsafe_code)]
fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write; the clock id is a constant of the platform.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}
