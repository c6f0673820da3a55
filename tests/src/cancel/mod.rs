//! Every cancellation point: an operation's future is dropped after its k-th poll, for every k
//! until it completes, and (on Redis) at a grid of times while Redis is paused, so the store
//! answers after the caller gave up; after each drop the harness checks what was left behind.
//!
//! A case is a fn taking an [`Attempt`]: it sets up fresh keys ([`Attempt::key`]), runs the
//! operation through [`Attempt::drive`] (which drops it at the attempt's point), lets the
//! cleanups the drop spawned run ([`Attempt::settle`]), and records its findings in a
//! [`Verdict`]. [`Harness::sweep`] runs the attempts and, after each one, checks what every
//! case must leave: no renewal task alive beyond the attempt's start
//! (the handle's [`redguard::Redguard::live_watchdogs`]), and on Redis no key without a
//! TTL. [`finish`] prints the counts and fails the
//! test on any violation.
//!
//! ```no_run
//! # async fn run() {
//! use redguard_tests::cancel::{Attempt, Harness, Verdict};
//!
//! async fn consume(at: Attempt) -> Verdict {
//!     let token = at.rg.tokens().issue("scene", std::time::Duration::from_secs(60)).await.unwrap();
//!     let outcome = at.drive(at.rg.tokens().consume("scene", &token)).await;
//!     at.settle().await;
//!     let mut verdict = Verdict::new(outcome.is_some());
//!     // Not consumed as far as the caller knows: the token must be there for its retry.
//!     if !matches!(outcome, Some(Ok(()))) {
//!         let retry = at.rg.tokens().consume("scene", &token).await;
//!         verdict.check(retry.is_ok(), || format!("the retry got {retry:?}"));
//!     }
//!     verdict
//! }
//!
//! let mut harness = Harness::redis().await;
//! harness.sweep("token consume", consume).await;
//! redguard_tests::cancel::finish([harness]);
//! # }
//! ```

mod drop_point;
mod lock_kind;
mod report;
mod view;

use std::future::Future;
use std::time::{Duration, Instant};

use redguard::Redguard;

pub use self::drop_point::{DropPoint, Stall, poll_at_most, poll_at_most_then_yield};
pub use self::lock_kind::{LEASE, LockKind, PERMITS};
pub use self::report::Verdict;
pub use self::view::View;

use self::report::Report;
use crate::RedisServer;

/// Bound on each Redis call of the handle under test: short, so a pause longer than it makes
/// calls time out (an outcome the runtime must treat as unknown).
pub const TIMEOUT: Duration = Duration::from_millis(150);

/// Beyond this many polls an operation that has not completed is reported as hanging.
const MAX_POLLS: usize = 1_000;

/// Stalls every attempt on Redis also runs, besides every poll: Redis paused from the
/// operation's start for less than [`TIMEOUT`] (the reply arrives after the drop) and for
/// longer (the call times out: unknown outcome), dropped early and late.
pub const STALLS: [Stall; 4] = [
    Stall::at(0, 60, 5),
    Stall::at(0, 60, 40),
    Stall::at(0, 300, 5),
    Stall::at(0, 300, 200),
];

/// One store under test, the attempts run on it, and what they found.
#[derive(Debug)]
pub struct Harness {
    rg: Redguard,
    /// The server (kept alive while the harness is) and a view of it.
    redis: Option<(RedisServer, View)>,
    report: Report,
    attempts: usize,
}

impl Harness {
    /// On a fresh in-memory store.
    pub fn memory() -> Harness {
        Harness {
            rg: Redguard::memory(),
            redis: None,
            report: Report::new("memory"),
            attempts: 0,
        }
    }

    /// On a fresh `redis-server` of its own, calls bounded by [`TIMEOUT`].
    pub async fn redis() -> Harness {
        let server = RedisServer::start();
        let rg = Redguard::redis(server.url())
            .timeout(TIMEOUT)
            .connect()
            .await
            .expect("connect to the test redis-server");
        let view = View::connect(&server).await;
        Harness {
            rg,
            redis: Some((server, view)),
            report: Report::new("redis"),
            attempts: 0,
        }
    }

    /// Runs `case` dropping after poll 1, 2, … until an attempt completes, once right after
    /// the poll and once after a turn of the runtime, then (on Redis) at each of [`STALLS`].
    pub async fn sweep<C, F>(&mut self, op: &str, case: C)
    where
        C: FnMut(Attempt) -> F,
        F: Future<Output = Verdict>,
    {
        self.sweep_stalls(op, &STALLS, case).await;
    }

    /// Like [`sweep`](Harness::sweep), with `stalls` instead of [`STALLS`].
    pub async fn sweep_stalls<C, F>(&mut self, op: &str, stalls: &[Stall], mut case: C)
    where
        C: FnMut(Attempt) -> F,
        F: Future<Output = Verdict>,
    {
        let started = Instant::now();
        for at_poll in [DropPoint::Poll, DropPoint::PollAndYield] {
            let mut completed = false;
            for polls in 1..=MAX_POLLS {
                if self.attempt(op, at_poll(polls), &mut case).await {
                    completed = true;
                    break;
                }
            }
            if !completed {
                self.report.violation(
                    op,
                    at_poll(MAX_POLLS),
                    format!("did not complete within {MAX_POLLS} polls"),
                );
            }
        }
        if self.redis.is_some() {
            for stall in stalls {
                self.attempt(op, DropPoint::Stalled(*stall), &mut case)
                    .await;
            }
        }
        self.report.took(op, started.elapsed());
    }

    /// One attempt and the checks every case shares; true when the operation completed.
    async fn attempt<C, F>(&mut self, op: &str, point: DropPoint, case: &mut C) -> bool
    where
        C: FnMut(Attempt) -> F,
        F: Future<Output = Verdict>,
    {
        self.attempts += 1;
        let watchdogs = self.rg.live_watchdogs();
        let attempt = Attempt {
            rg: self.rg.clone(),
            view: self.redis.as_ref().map(|(_, view)| view.clone()),
            point,
            id: self.attempts,
        };
        // On the heap: a case nests the runtime's futures several deep, too deep for a test
        // thread's stack in a debug build.
        let mut verdict = Box::pin(case(attempt.clone())).await;
        attempt.settle().await;
        let alive = self.rg.live_watchdogs();
        verdict.check(alive <= watchdogs, || {
            format!("{alive} renewal tasks alive, {watchdogs} before the attempt")
        });
        if let Some(view) = &attempt.view {
            let forever = view.keys_without_ttl().await;
            verdict.check(forever.is_empty(), || {
                format!("keys without a TTL: {forever:?}")
            });
        }
        self.report.record(op, point, &verdict);
        verdict.completed()
    }
}

/// Prints what each harness exercised, then fails the test listing every violation, if any.
pub fn finish(harnesses: impl IntoIterator<Item = Harness>) {
    let violations: Vec<String> = harnesses
        .into_iter()
        .flat_map(|harness| harness.report.finish())
        .collect();
    assert!(
        violations.is_empty(),
        "{} violations:\n  {}",
        violations.len(),
        violations.join("\n  ")
    );
}

/// One run of a case: the store, where to drop the operation, and a unique id for its keys.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The handle under test.
    pub rg: Redguard,
    view: Option<View>,
    point: DropPoint,
    id: usize,
}

impl Attempt {
    /// A key body (`[A-Za-z0-9.-]`) no other attempt uses.
    pub fn key(&self, name: &str) -> String {
        format!("cx.{}.{name}", self.id)
    }

    /// Direct reads of Redis (None on the memory store).
    pub fn view(&self) -> Option<&View> {
        self.view.as_ref()
    }

    /// Runs `future` until this attempt's drop point: its output if it completed first,
    /// `None` if it was dropped. With a stall, returns once Redis is no longer paused.
    pub async fn drive<F: Future>(&self, future: F) -> Option<F::Output> {
        match self.point {
            DropPoint::Poll(polls) => poll_at_most(future, polls).await,
            DropPoint::PollAndYield(polls) => poll_at_most_then_yield(future, polls).await,
            DropPoint::Stalled(stall) => {
                let view = self.view.as_ref().expect("stalls are run on Redis only");
                stall.drive(view, future).await
            }
        }
    }

    /// Lets what a drop left behind settle: the cleanups it spawned get the runtime (they
    /// queue their calls on the handle's one connection), then a round trip on that
    /// connection, three times over (a cleanup of two calls in a row, such as giving a token
    /// back and then undoing a begin, needs two). Redis answers one connection in order, so
    /// once the last round trip is back every call the cleanups made has been applied.
    pub async fn settle(&self) {
        for _ in 0..3 {
            for _ in 0..16 {
                tokio::task::yield_now().await;
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while redguard::__private::store::of(&self.rg)
                .time()
                .await
                .is_err()
            {
                assert!(Instant::now() < deadline, "the store did not answer again");
            }
        }
    }
}
