//! The exploring harness: one test body, many seeded fault schedules.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use super::faults::{At, Fault, Faults, Injected};
use super::history::History;
use crate::clock::ManualClock;
use crate::handle::Redguard;

/// Runs a test body many times, each on a fresh in-memory handle with a [`ManualClock`] (or,
/// with [`on`](Explore::on), on a Redis of yours under a key prefix of the run's own) and a
/// random fault schedule of its own seed, and stops at the first run that panics or breaks a
/// checker of its [`History`] (`never_twice`, `never_together` and `fences_increase` run after
/// each body; assert [`at_most`](History::assert_at_most) in the body).
///
/// ```
/// use redguard::idempotent;
/// use redguard::testing::{Explore, History};
///
/// #[idempotent(key = "{order}", expire = 60)]
/// async fn charge(history: &History, order: u64) -> redguard::Result<()> {
///     history.effect(&order.to_string());
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // A redelivered message, charged by a body with no backstop of its own.
/// let failure = Explore::new()
///     .runs(50)
///     .try_run(async |trial| {
///         let history = &trial.history;
///         let _ = trial.rg.scope(async {
///             let _ = charge(history, 7).await;
///             charge(history, 7).await
///         }).await;
///     })
///     .await
///     .unwrap_err(); // `run` would panic with the same report
/// // A schedule that lost the record between the deliveries: its seed and faults.
/// assert!(failure.to_string().contains("never_twice"));
/// assert!(!failure.schedule.is_empty());
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use = "an exploration does nothing until `.run(body).await`"]
pub struct Explore {
    runs: u32,
    time_limit: Duration,
    seed: u64,
    probability: f64,
    at: At,
    kinds: Vec<Fault>,
    on: Option<Redguard>,
}

/// One run of an exploration: what its body works with.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Trial {
    /// A fresh in-memory handle on `clock` (or the [`on`](Explore::on) handle's store under
    /// this run's own key prefix), behind this run's faults.
    pub rg: Redguard,
    /// The in-memory store's clock; `None` on a store that keeps its own time (Redis). Let
    /// leases, records and windows expire with [`advance`](Trial::advance), which works on
    /// both.
    pub clock: Option<ManualClock>,
    /// This run's history, timed by `clock`.
    pub history: History,
    /// This run's fault schedule.
    pub faults: Faults,
    /// The seed of this run's schedule: `Explore::new().seed(seed).runs(1)` runs it again.
    pub seed: u64,
}

/// What an exploration that found nothing did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Explored {
    /// Runs made (fewer than asked when the time limit came first).
    pub runs: u32,
    /// Faults injected over all runs.
    pub faults: usize,
}

/// The first run that failed: its seed, its schedule and what went wrong.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Failure {
    /// The run's seed.
    pub seed: u64,
    /// Which run it was (from 1).
    pub run: u32,
    /// The faults that struck in it.
    pub schedule: Vec<Injected>,
    /// The panic's message or the checker's counter-example.
    pub message: String,
}

impl Trial {
    /// Lets `by` pass on the run's store: the in-memory clock moves at once; on a store that
    /// keeps its own time (Redis), the run sleeps.
    pub async fn advance(&self, by: Duration) {
        match &self.clock {
            Some(clock) => clock.advance(by),
            None => tokio::time::sleep(by).await,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "run {} (seed {}) failed: {}",
            self.run, self.seed, self.message
        )?;
        writeln!(f, "fault schedule ({} injected):", self.schedule.len())?;
        for injected in &self.schedule {
            writeln!(f, "  {injected}")?;
        }
        write!(
            f,
            "run it again with Explore::new().seed({}).runs(1) (same faults and probability)",
            self.seed
        )
    }
}

impl std::error::Error for Failure {}

impl Default for Explore {
    fn default() -> Self {
        Explore::new()
    }
}

impl Explore {
    /// 100 runs within 20 s from seed 0, each operation faulted with probability 0.1 by one
    /// of [`Fault::each`] (stalls of 50 ms, early expiry after 10 ms of the store's clock).
    pub fn new() -> Explore {
        Explore {
            runs: 100,
            time_limit: Duration::from_secs(20),
            seed: 0,
            probability: 0.1,
            at: At::any(),
            kinds: Fault::each(Duration::from_millis(50), Duration::from_millis(10)),
            on: None,
        }
    }

    /// Runs each trial on `handle`'s store (a Redis, a Cluster) instead of a fresh in-memory
    /// one: with `handle`'s settings, every key of run `n` under `<prefix>:explore-<id>-<n>`
    /// (`id` drawn once per exploration), so no run sees what another left, and the store's own
    /// time ([`Trial::clock`] is `None`; [`Trial::advance`] sleeps). Leftover keys expire with
    /// their TTLs. Lock waiters keep their release notifications: the run's keys stay under
    /// `<prefix>:*`.
    ///
    /// ```no_run
    /// # async fn demo() -> redguard::Result<()> {
    /// use redguard::Redguard;
    /// use redguard::testing::Explore;
    ///
    /// let redis = Redguard::redis("redis://127.0.0.1:6379").connect().await?;
    /// Explore::new()
    ///     .on(&redis)
    ///     .runs(20)
    ///     .run(async |trial| {
    ///         let _ = trial.rg.scope(async { /* the code under test */ }).await;
    ///     })
    ///     .await;
    /// # Ok(()) }
    /// ```
    pub fn on(mut self, handle: &Redguard) -> Self {
        self.on = Some(handle.clone());
        self
    }

    /// At most `runs` runs.
    pub fn runs(mut self, runs: u32) -> Self {
        self.runs = runs;
        self
    }

    /// No new run starts after `limit` (wall-clock time) has passed.
    pub fn time_limit(mut self, limit: Duration) -> Self {
        self.time_limit = limit;
        self
    }

    /// The first run's seed; run `i` uses `seed + i`.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The probability that an operation is faulted.
    pub fn probability(mut self, probability: f64) -> Self {
        self.probability = probability;
        self
    }

    /// Fault only the operations `at` matches.
    pub fn at(mut self, at: At) -> Self {
        self.at = at;
        self
    }

    /// The kinds of fault drawn from.
    pub fn faults(mut self, kinds: Vec<Fault>) -> Self {
        self.kinds = kinds;
        self
    }

    /// Runs `body` until a run fails, `runs` runs passed or the time limit came; panics with
    /// the failed run's seed and schedule.
    pub async fn run<F>(self, body: F) -> Explored
    where
        F: AsyncFnMut(Trial),
    {
        match self.try_run(body).await {
            Ok(explored) => explored,
            Err(failure) => panic!("{failure}"),
        }
    }

    /// [`run`](Explore::run), returning the failed run instead of panicking.
    pub async fn try_run<F>(self, mut body: F) -> Result<Explored, Failure>
    where
        F: AsyncFnMut(Trial),
    {
        let started = Instant::now();
        let exploration = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let mut explored = Explored { runs: 0, faults: 0 };
        while explored.runs < self.runs && started.elapsed() < self.time_limit {
            let run = explored.runs + 1;
            let seed = self.seed.wrapping_add(u64::from(explored.runs));
            let faults = Faults::new().random_at(
                self.at.clone(),
                seed,
                self.probability,
                self.kinds.clone(),
            );
            let failure = |message: String, faults: &Faults| Failure {
                seed,
                run,
                schedule: faults.injected(),
                message,
            };
            let (rg, clock, history) = match &self.on {
                Some(handle) => {
                    let prefix = format!("{}:explore-{exploration}-{run}", handle.prefix());
                    (handle.under_prefix(prefix), None, History::new())
                }
                None => {
                    let clock = ManualClock::new();
                    let rg = Redguard::memory_builder()
                        .clock(clock.clone())
                        .connect()
                        .await
                        .map_err(|err| failure(format!("no memory handle: {err}"), &faults))?;
                    (rg, Some(clock.clone()), History::with_clock(clock))
                }
            };
            let trial = Trial {
                rg: super::faulty(&rg, faults.clone()),
                clock,
                history: history.clone(),
                faults: faults.clone(),
                seed,
            };
            if let Err(panic) = AssertUnwindSafe(body(trial)).catch_unwind().await {
                return Err(failure(panic_message(&panic), &faults));
            }
            let checked = history
                .check_never_twice()
                .and_then(|()| history.check_never_together())
                .and_then(|()| history.check_fences_increase());
            if let Err(violation) = checked {
                return Err(failure(violation.to_string(), &faults));
            }
            explored.runs = run;
            explored.faults += faults.injected().len();
        }
        Ok(explored)
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(message) = panic.downcast_ref::<String>() {
        message.clone()
    } else if let Some(message) = panic.downcast_ref::<&str>() {
        (*message).to_owned()
    } else {
        "the body panicked".to_owned()
    }
}
