//! Driving rate limits at a known offered load, and checking what they admitted against each
//! algorithm's bound. Used in-process (memory store) and by the `rate_worker` binary
//! (several OS processes on one Redis).

use std::time::{Duration, Instant};

use redguard::__private::store::{RateCheck, RateMode};
use redguard::{Algorithm, GuardKind, KeyBuilder, Limit, Rate, Redguard};

/// One driven run: which limit, how hard, how long.
#[derive(Debug, Clone)]
pub struct Load {
    /// The key (scope `driven`).
    pub key: String,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// The rate.
    pub rate: Rate,
    /// The burst (None for window algorithms).
    pub burst: Option<u64>,
    /// Concurrent tasks in this process.
    pub tasks: usize,
    /// Requests per second this process offers, spread over its tasks.
    pub offered_per_sec: f64,
    /// How long to drive.
    pub duration: Duration,
}

impl Load {
    /// The validated limit.
    pub fn limit(&self) -> Limit {
        Limit::new(self.algorithm, self.rate, self.burst, 1, Duration::ZERO).expect("valid limit")
    }

    /// As command-line arguments for `rate_worker`.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            self.key.clone(),
            self.algorithm.as_str().to_owned(),
            self.rate.count().to_string(),
            self.rate.period().as_millis().to_string(),
            self.burst.map_or("-".to_owned(), |b| b.to_string()),
            self.tasks.to_string(),
            self.offered_per_sec.to_string(),
            self.duration.as_millis().to_string(),
        ]
    }

    /// Parses what [`Load::to_args`] wrote.
    pub fn from_args(args: &[String]) -> Load {
        let n = |i: usize| args[i].parse::<u64>().expect("integer argument");
        Load {
            key: args[0].clone(),
            algorithm: args[1].parse().expect("algorithm"),
            rate: Rate::new(n(2), Duration::from_millis(n(3))).expect("rate"),
            burst: (args[4] != "-").then(|| n(4)),
            tasks: n(5) as usize,
            offered_per_sec: args[6].parse().expect("offered"),
            duration: Duration::from_millis(n(7)),
        }
    }
}

/// What one driven run saw: store timestamps (µs) of admitted and rejected calls, and
/// backend errors.
#[derive(Debug, Default)]
pub struct Driven {
    /// Store time of each admitted call.
    pub admitted: Vec<u64>,
    /// Number of rejected calls.
    pub rejected: u64,
    /// Store errors.
    pub errors: u64,
}

/// Offers `load` against `rg` from `load.tasks` tasks, each pacing itself with jitter, and
/// records the store's time of every admitted call.
pub async fn drive(rg: &Redguard, load: &Load) -> Driven {
    let limit = load.limit();
    let body = KeyBuilder::new().text(&load.key).finish().expect("key");
    let key = rg.key(GuardKind::RateLimit, "driven", &body).expect("key");
    let per_task = load.offered_per_sec / load.tasks as f64;
    let gap = Duration::from_secs_f64(1.0 / per_task);
    let deadline = Instant::now() + load.duration;
    let tasks: Vec<_> = (0..load.tasks)
        .map(|_| {
            let rg = rg.clone();
            let key = key.clone();
            let limit = limit.clone();
            tokio::spawn(async move {
                let mut seen = Driven::default();
                let mut next = Instant::now() + gap.mul_f64(fastrand::f64());
                while Instant::now() < deadline {
                    tokio::time::sleep_until(next.into()).await;
                    // Jittered pacing: irregular arrivals averaging the offered rate.
                    next += gap.mul_f64(0.5 + fastrand::f64());
                    let checks = [RateCheck {
                        key: &key,
                        limit: &limit,
                    }];
                    match redguard::__private::store::of(&rg)
                        .rate_check(&checks, RateMode::Consume)
                        .await
                    {
                        Ok(outcome) if outcome.allowed() => {
                            seen.admitted.push(outcome.now.as_micros() as u64)
                        }
                        Ok(_) => seen.rejected += 1,
                        Err(_) => seen.errors += 1,
                    }
                }
                seen
            })
        })
        .collect();
    let mut all = Driven::default();
    for task in tasks {
        let seen = task.await.expect("driver task");
        all.admitted.extend(seen.admitted);
        all.rejected += seen.rejected;
        all.errors += seen.errors;
    }
    all.admitted.sort_unstable();
    all
}

/// The most admitted in any interval, checked against the algorithm's bound.
#[derive(Debug)]
pub struct Verdict {
    /// Admitted calls.
    pub admitted: usize,
    /// What the algorithm allows over the run (the bound's nominal value).
    pub nominal: f64,
    /// Largest excess over the bound found (≤ 0 means the bound held everywhere).
    pub worst_excess: f64,
    /// Largest count in any window-length interval (window algorithms) or the count in the
    /// worst interval against `burst + rate·t` (bucket algorithms).
    pub worst_interval: usize,
}

/// Checks sorted admission timestamps against the bound of `limit`'s algorithm:
/// - GCRA / token bucket / leaky bucket: any interval [a, b] holds ≤ burst + rate·(b − a);
/// - sliding window log: any window-length interval holds ≤ count;
/// - fixed window: each aligned window ≤ count (across an edge up to 2·count);
/// - sliding counter: each aligned window ≤ count and any window-length interval < 2·count.
pub fn verdict(limit: &Limit, admitted: &[u64]) -> Verdict {
    let count = limit.rate().count() as f64;
    let period = limit.rate().period().as_micros() as u64;
    let burst = limit.burst() as f64;
    let n = admitted.len();
    let span = match (admitted.first(), admitted.last()) {
        (Some(a), Some(b)) => b - a,
        _ => 0,
    };
    let mut worst_excess = f64::NEG_INFINITY;
    let mut worst_interval = 0;
    if limit.algorithm().is_window() {
        // Sliding window-length intervals (t - W, t].
        let mut lo = 0;
        for hi in 0..n {
            while admitted[hi] - admitted[lo] >= period {
                lo += 1;
            }
            worst_interval = worst_interval.max(hi - lo + 1);
        }
        // Aligned windows.
        let mut per_window = std::collections::BTreeMap::<u64, usize>::new();
        for at in admitted {
            *per_window.entry(at / period).or_default() += 1;
        }
        let worst_aligned = per_window.values().copied().max().unwrap_or(0) as f64;
        worst_excess = match limit.algorithm() {
            Algorithm::SlidingWindow => worst_interval as f64 - count,
            Algorithm::FixedWindow => {
                (worst_aligned - count).max(worst_interval as f64 - 2.0 * count)
            }
            _ => (worst_aligned - count).max(worst_interval as f64 - (2.0 * count - 1.0)),
        };
        Verdict {
            admitted: n,
            // The long-run allowance over the run; window edges can add up to one count.
            nominal: count * span as f64 / period as f64,
            worst_excess,
            worst_interval,
        }
    } else {
        let per_us = count / period as f64;
        for i in 0..n {
            for j in i..n {
                let allowed = burst + per_us * (admitted[j] - admitted[i]) as f64;
                let excess = (j - i + 1) as f64 - allowed;
                if excess > worst_excess {
                    worst_excess = excess;
                    worst_interval = j - i + 1;
                }
            }
        }
        Verdict {
            admitted: n,
            nominal: burst + per_us * span as f64,
            worst_excess,
            worst_interval,
        }
    }
}
