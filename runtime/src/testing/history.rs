//! What a test's guarded bodies did, and the checkers that read it.
//!
//! Bodies record themselves (`History::run`, `History::held`, `History::effect`,
//! `History::admitted`); each record takes a sequence number from one counter, so "started
//! before that one ended" is exact whatever the clocks say. Times come from a [`Clock`] (the
//! store's, when it is a [`ManualClock`](crate::clock::ManualClock)) and serve the rate checker only.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::error::Error;

/// A recording of guarded calls, shared by clones (hand one to every task of a test).
///
/// ```
/// use redguard::testing::History;
///
/// let history = History::new();
/// history.effect("charge:7");
/// history.effect("charge:8");
/// history.assert_never_twice();
///
/// history.effect("charge:7"); // a second charge of order 7
/// assert!(history.check_never_twice().is_err());
/// ```
#[derive(Clone, Debug)]
pub struct History {
    inner: Arc<Recording>,
}

#[derive(Debug)]
struct Recording {
    clock: Arc<dyn Clock>,
    calls: Mutex<Calls>,
}

#[derive(Debug, Default)]
struct Calls {
    next_seq: u64,
    calls: Vec<Call>,
}

impl Calls {
    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }
}

/// What a recorded call was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// An idempotent body ([`History::run`]).
    Run,
    /// A side effect that must happen at most once per key ([`History::effect`]).
    Effect,
    /// A section run while holding a lock ([`History::held`]).
    Held,
    /// A call a rate limit admitted ([`History::admitted`]).
    Admitted,
}

/// How a recorded body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It returned `Ok`.
    Ok,
    /// It returned an error other than [`Error::LockLost`].
    Err,
    /// It returned [`Error::LockLost`]: it was told its lock was gone.
    LockLost,
    /// Its future was dropped before it ended (a lock's `run` cancels its body this way when
    /// the lock is lost).
    Dropped,
}

/// One recorded call: when it started and ended (sequence numbers and clock times), on which
/// key, with which fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Its index in the history.
    pub id: usize,
    /// What it was.
    pub kind: CallKind,
    /// The key it was recorded under.
    pub key: String,
    /// The fencing token it held ([`History::held`]).
    pub fence: Option<u64>,
    /// Sequence number of its start.
    pub start: u64,
    /// The clock's time at its start.
    pub at: Duration,
    /// Sequence number of its end and how it ended; `None` while it runs. Instant calls
    /// (effects, admissions) end where they start.
    pub end: Option<(u64, Outcome)>,
}

impl Call {
    /// Whether this call and `other` were both running at some point.
    fn overlaps(&self, other: &Call) -> bool {
        let end = |c: &Call| c.end.map_or(u64::MAX, |(seq, _)| seq);
        self.start < end(other) && other.start < end(self)
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            CallKind::Run => "run",
            CallKind::Effect => "effect",
            CallKind::Held => "held",
            CallKind::Admitted => "admitted",
        };
        write!(f, "#{} {kind} `{}`", self.id, self.key)?;
        if let Some(fence) = self.fence {
            write!(f, " fence {fence}")?;
        }
        write!(f, " at {:?} (seq {}", self.at, self.start)?;
        match self.end {
            Some((seq, _)) if seq == self.start => f.write_str(")"),
            Some((seq, outcome)) => write!(f, "..{seq}, {outcome:?})"),
            None => f.write_str("..still running)"),
        }
    }
}

/// A checker's counter-example: the fewest calls that break the property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The checker that failed (`never_twice`, …).
    pub check: &'static str,
    /// What is wrong, in a sentence.
    pub reason: String,
    /// The calls that show it, in order.
    pub calls: Vec<Call>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.check, self.reason)?;
        for call in &self.calls {
            write!(f, "\n  {call}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Violation {}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    /// An empty history timed by the system clock.
    pub fn new() -> History {
        History::with_clock(SystemClock)
    }

    /// An empty history timed by `clock`: give it the store's clock (a
    /// [`ManualClock`](crate::clock::ManualClock) you advance) so admissions are timed as the store
    /// decided them.
    pub fn with_clock(clock: impl Clock) -> History {
        History {
            inner: Arc::new(Recording {
                clock: Arc::new(clock),
                calls: Mutex::new(Calls::default()),
            }),
        }
    }

    fn calls_mut(&self) -> std::sync::MutexGuard<'_, Calls> {
        // Every change is one push or one field set: a panicking test cannot leave it torn.
        self.inner
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn start(&self, kind: CallKind, key: &str, fence: Option<u64>) -> usize {
        let at = self.inner.clock.now();
        let mut calls = self.calls_mut();
        let start = calls.seq();
        let id = calls.calls.len();
        calls.calls.push(Call {
            id,
            kind,
            key: key.to_owned(),
            fence,
            start,
            at,
            end: None,
        });
        id
    }

    fn end(&self, id: usize, outcome: Outcome) {
        let mut calls = self.calls_mut();
        let seq = calls.seq();
        if let Some(call) = calls.calls.get_mut(id) {
            call.end = Some((seq, outcome));
        }
    }

    fn instant(&self, kind: CallKind, key: &str) {
        let id = self.start(kind, key, None);
        let mut calls = self.calls_mut();
        if let Some(call) = calls.calls.get_mut(id) {
            call.end = Some((call.start, Outcome::Ok));
        }
    }

    /// Runs an idempotent body, recording its start and how it ended. Without
    /// [`effect`](History::effect)s on `key`, each run that returned `Ok` counts as the key's
    /// effect for [`assert_never_twice`](History::assert_never_twice).
    pub async fn run<T, E: 'static>(
        &self,
        key: &str,
        body: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        self.span(CallKind::Run, key, None, body).await
    }

    /// Runs a section under the lock at `key` with fencing token `fence` (from
    /// [`redguard::lock::fence()`](crate::lock::fence) or the guard), recording its start and end, for
    /// [`assert_never_together`](History::assert_never_together) and
    /// [`assert_fences_increase`](History::assert_fences_increase).
    pub async fn held<T, E: 'static>(
        &self,
        key: &str,
        fence: u64,
        body: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        self.span(CallKind::Held, key, Some(fence), body).await
    }

    async fn span<T, E: 'static>(
        &self,
        kind: CallKind,
        key: &str,
        fence: Option<u64>,
        body: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        struct Ending<'a>(&'a History, usize, Outcome);
        impl Drop for Ending<'_> {
            fn drop(&mut self) {
                self.0.end(self.1, self.2);
            }
        }
        let mut ending = Ending(self, self.start(kind, key, fence), Outcome::Dropped);
        let result = body.await;
        ending.2 = match &result {
            Ok(_) => Outcome::Ok,
            Err(err) if is_lock_lost(err) => Outcome::LockLost,
            Err(_) => Outcome::Err,
        };
        result
    }

    /// Records the side effect of `key` (a charge, a shipment, a message sent): what
    /// [`assert_never_twice`](History::assert_never_twice) counts.
    pub fn effect(&self, key: &str) {
        self.instant(CallKind::Effect, key);
    }

    /// Records a call a rate limit on `key` admitted, at the clock's time now, for
    /// [`assert_at_most`](History::assert_at_most).
    pub fn admitted(&self, key: &str) {
        self.instant(CallKind::Admitted, key);
    }

    /// Every call recorded so far, in start order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls_mut().calls.clone()
    }

    fn by_key(&self, kind: CallKind) -> Vec<(String, Vec<Call>)> {
        let mut keys: Vec<(String, Vec<Call>)> = Vec::new();
        for call in self.calls().into_iter().filter(|c| c.kind == kind) {
            match keys.iter_mut().find(|(key, _)| *key == call.key) {
                Some((_, calls)) => calls.push(call),
                None => keys.push((call.key.clone(), vec![call])),
            }
        }
        keys
    }

    /// Each key's effect happened at most once: its [`effect`](History::effect)s, or, for a
    /// key with none, its [`run`](History::run)s that returned `Ok`.
    pub fn check_never_twice(&self) -> Result<(), Violation> {
        let effects = self.by_key(CallKind::Effect);
        let runs = self.by_key(CallKind::Run).into_iter().map(|(key, calls)| {
            let ok = calls
                .into_iter()
                .filter(|c| matches!(c.end, Some((_, Outcome::Ok))))
                .collect();
            (key, ok)
        });
        let runs: Vec<(String, Vec<Call>)> = runs
            .filter(|(key, _)| !effects.iter().any(|(k, _)| k == key))
            .collect();
        for (key, calls) in effects.iter().chain(&runs) {
            if let [first, second, ..] = calls.as_slice() {
                return Err(Violation {
                    check: "never_twice",
                    reason: format!("the effect of `{key}` happened twice"),
                    calls: vec![first.clone(), second.clone()],
                });
            }
        }
        Ok(())
    }

    /// No two sections [`held`](History::held) under one key ran at the same time, except
    /// after the earlier one was told its lock was lost (it ended with [`Outcome::LockLost`]
    /// or was [dropped](Outcome::Dropped), as a lock's `run` does to its body): the window
    /// the fencing token is for.
    pub fn check_never_together(&self) -> Result<(), Violation> {
        for (key, calls) in self.by_key(CallKind::Held) {
            for (i, first) in calls.iter().enumerate() {
                let lost = matches!(first.end, Some((_, Outcome::LockLost | Outcome::Dropped)));
                if lost {
                    continue;
                }
                if let Some(second) = calls[i + 1..].iter().find(|c| first.overlaps(c)) {
                    return Err(Violation {
                        check: "never_together",
                        reason: format!("two holders of `{key}` ran at the same time"),
                        calls: vec![first.clone(), second.clone()],
                    });
                }
            }
        }
        Ok(())
    }

    /// Each key's sections [`held`](History::held) carry strictly increasing fencing
    /// tokens, in the order they started.
    pub fn check_fences_increase(&self) -> Result<(), Violation> {
        for (key, calls) in self.by_key(CallKind::Held) {
            for pair in calls.windows(2) {
                if pair[1].fence <= pair[0].fence {
                    return Err(Violation {
                        check: "fences_increase",
                        reason: format!("a later holder of `{key}` got a fence no greater"),
                        calls: pair.to_vec(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Each key has at most `limit` [admissions](History::admitted) in any span of `window`
    /// (half-open, on the history's clock). Give the bound the algorithm promises: a window
    /// or sliding-window limit of N per W keeps N per W; a token bucket or GCRA of rate N per
    /// W with burst B admits up to B + N − 1 in a span of W.
    pub fn check_at_most(&self, limit: usize, window: Duration) -> Result<(), Violation> {
        let mut worst: Option<(Duration, String, Vec<Call>)> = None;
        for (key, mut calls) in self.by_key(CallKind::Admitted) {
            calls.sort_by_key(|c| (c.at, c.start));
            for run in calls.windows(limit.saturating_add(1)) {
                let span = run[limit].at - run[0].at;
                let tighter = worst.as_ref().is_none_or(|(w, _, _)| span < *w);
                if span < window && tighter {
                    worst = Some((span, key.clone(), run.to_vec()));
                }
            }
        }
        match worst {
            None => Ok(()),
            Some((span, key, calls)) => Err(Violation {
                check: "at_most",
                reason: format!(
                    "`{key}` admitted {} calls within {span:?}, more than {limit} per {window:?}",
                    calls.len()
                ),
                calls,
            }),
        }
    }

    /// Panics with the counter-example of [`check_never_twice`](History::check_never_twice).
    #[track_caller]
    pub fn assert_never_twice(&self) {
        fail_on(self.check_never_twice());
    }

    /// Panics with the counter-example of
    /// [`check_never_together`](History::check_never_together).
    #[track_caller]
    pub fn assert_never_together(&self) {
        fail_on(self.check_never_together());
    }

    /// Panics with the counter-example of
    /// [`check_fences_increase`](History::check_fences_increase).
    #[track_caller]
    pub fn assert_fences_increase(&self) {
        fail_on(self.check_fences_increase());
    }

    /// Panics with the counter-example of [`check_at_most`](History::check_at_most).
    #[track_caller]
    pub fn assert_at_most(&self, limit: usize, window: Duration) {
        fail_on(self.check_at_most(limit, window));
    }
}

#[track_caller]
fn fail_on(result: Result<(), Violation>) {
    if let Err(violation) = result {
        panic!("{violation}");
    }
}

fn is_lock_lost<E: 'static>(err: &E) -> bool {
    let err: &dyn Any = err;
    matches!(err.downcast_ref::<Error>(), Some(Error::LockLost { .. }))
}
