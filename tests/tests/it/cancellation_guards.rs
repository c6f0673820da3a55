//! Every cancellation point of an idempotent call (plain and with a token), of a token
//! consumption and of a rate check that waits (issue 13, part 2), on the memory store and
//! on Redis (see `redguard_tests::cancel`).
//!
//! After each drop, once the cleanups it spawned have run (a dropped execution records what
//! it knows in a task of its own: UNKNOWN mid-body, the body's result after it), the state
//! is the one documented
//! for where the drop happened (TESTING.md lists them):
//!
//! | dropped                          | idempotency record    | a retry                 | token   |
//! |----------------------------------|-----------------------|-------------------------|---------|
//! | before the body started          | none (begin undone)   | runs the body           | unused  |
//! | in the body                      | UNKNOWN               | `OutcomeUnknown`, no run| used    |
//! | after the body, finish unanswered| SUCCESS               | replays                 | used    |
//! | never (completed)                | SUCCESS               | replays                 | used    |
//!
//! A detached body, once begun, runs to its end whenever its caller is dropped: the record is
//! then SUCCESS and the retry replays; before that, the begin is undone and the retry runs. A
//! call refused for a used token leaves no record, however it is dropped. A duplicate
//! dropped while it waits for a first execution (`wait`) leaves that execution's record as
//! it was: the first records SUCCESS, the duplicate's body never ran, a retry replays.
//!
//! The body runs once in all, original and retry together. A token consumption dropped (or
//! failed with a backend error) gives the token back. A rate check dropped before its second
//! check was sent is not charged; one whose check is unanswered may have been charged, at
//! most once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redguard::{Error, Redguard, key::KeyBuilder, rate::Algorithm};
use redguard_tests::cancel::{self, Attempt, Harness, Verdict};

const SCOPE: &str = "cx";
const SCENE: &str = "cx-submit";
const EXPIRE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn every_cancellation_point_on_memory() {
    let mut memory = Harness::memory();
    guard_operations(&mut memory).await;
    cancel::finish([memory]);
}

#[tokio::test]
async fn every_cancellation_point_on_redis() {
    let mut redis = Harness::redis().await;
    guard_operations(&mut redis).await;
    cancel::finish([redis]);
}

async fn guard_operations(h: &mut Harness) {
    h.sweep("idempotent call", |at| idempotent(at, false)).await;
    h.sweep("idempotent call with a token", |at| idempotent(at, true))
        .await;
    h.sweep("idempotent call with a used token", used_token)
        .await;
    h.sweep("idempotent call, detached", detached).await;
    h.sweep("idempotent duplicate waiting", waiting_duplicate)
        .await;
    h.sweep("token consume", consume).await;
    h.sweep("rate check with wait", rate_wait).await;
}

/// What the body of an idempotent call did.
#[derive(Debug, Default)]
struct Body {
    runs: AtomicUsize,
    started: AtomicBool,
    finished: AtomicBool,
}

/// One idempotent call of intent `key` (with `token` in token mode), whose body records
/// itself in `body` and awaits a few times.
async fn call(
    rg: &Redguard,
    key: &str,
    token: Option<&str>,
    body: Arc<Body>,
) -> Result<u32, Error> {
    let mut idem = redguard::idempotency(KeyBuilder::new().text(key).finish()?)
        .scope(SCOPE)
        .expire(EXPIRE);
    if let Some(token) = token {
        idem = idem.token(SCENE, token);
    }
    rg.scope(idem.run(async move {
        body.started.store(true, Ordering::SeqCst);
        body.runs.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        tokio::task::yield_now().await;
        body.finished.store(true, Ordering::SeqCst);
        Ok(7)
    }))
    .await
}

/// Where an idempotent call was dropped, or how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Dropped, or failed with a backend error, before the body started.
    BeforeBody,
    InBody,
    /// Dropped after the body returned: the finish was sent or about to be.
    Finishing,
    Completed,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::BeforeBody => "before the body",
            Phase::InBody => "in the body",
            Phase::Finishing => "finishing",
            Phase::Completed => "completed",
        }
    }

    /// The record states (`status` field) documented for this phase.
    fn statuses(self) -> &'static [Option<&'static str>] {
        match self {
            Phase::BeforeBody => &[None],
            Phase::InBody => &[Some("U")],
            Phase::Finishing => &[Some("S")],
            Phase::Completed => &[Some("S")],
        }
    }
}

async fn idempotent(at: Attempt, with_token: bool) -> Verdict {
    let key = at.key("idem");
    let token = match with_token {
        true => Some(issue(&at.rg).await),
        false => None,
    };
    let first = Arc::new(Body::default());
    let outcome = at
        .drive(call(&at.rg, &key, token.as_deref(), first.clone()))
        .await;
    at.settle().await;
    let mut v = Verdict::new(outcome.is_some());
    let started = first.started.load(Ordering::SeqCst);
    let phase = match (&outcome, started, first.finished.load(Ordering::SeqCst)) {
        (Some(Ok(7)), _, _) => Phase::Completed,
        (Some(Err(Error::Backend(_))), false, _) | (None, false, _) => Phase::BeforeBody,
        (None, true, false) => Phase::InBody,
        (None, true, true) => Phase::Finishing,
        (Some(other), ..) => {
            v.check(false, || format!("the call ended with {other:?}"));
            return v;
        }
    };
    v.landed(phase.name());
    if let Some(view) = at.view() {
        let record = format!("redguard:idem:{{{SCOPE}:{key}}}");
        let status = view.field(&record, "status").await;
        v.check(phase.statuses().contains(&status.as_deref()), || {
            format!(
                "{phase:?}: record status {status:?}, documented {:?}",
                phase.statuses()
            )
        });
    }
    // The retry the caller (or its client) makes.
    let second = Arc::new(Body::default());
    let retry = call(&at.rg, &key, token.as_deref(), second.clone()).await;
    let reran = second.runs.load(Ordering::SeqCst) > 0;
    let documented = match phase {
        Phase::BeforeBody => matches!(retry, Ok(7)) && reran,
        Phase::InBody => matches!(retry, Err(Error::OutcomeUnknown)) && !reran,
        Phase::Finishing => matches!(retry, Ok(7)) && !reran,
        Phase::Completed => matches!(retry, Ok(7)) && !reran,
    };
    v.check(documented, || {
        format!("{phase:?}: the retry gave {retry:?}, its body ran: {reran}")
    });
    let runs = first.runs.load(Ordering::SeqCst) + second.runs.load(Ordering::SeqCst);
    v.check(runs == 1, || {
        format!("{phase:?}: the body ran {runs} times")
    });
    if let Some(token) = &token {
        // Whichever execution ran used it.
        let again = at.rg.tokens().consume(SCENE, token).await;
        v.check(matches!(again, Err(Error::TokenUsed)), || {
            format!("{phase:?}: after the runs, consuming the token gave {again:?}")
        });
    }
    v
}

/// A call carrying a token already used is refused, and the record begun for it goes, so the
/// same key with a valid token runs at once: also when the refused call is dropped on its way.
async fn used_token(at: Attempt) -> Verdict {
    let key = at.key("used");
    let used = issue(&at.rg).await;
    at.rg
        .tokens()
        .consume(SCENE, &used)
        .await
        .expect("use the token");
    let first = Arc::new(Body::default());
    let outcome = at
        .drive(call(&at.rg, &key, Some(&used), first.clone()))
        .await;
    at.settle().await;
    let mut v = Verdict::new(outcome.is_some());
    v.landed(if outcome.is_some() {
        "completed"
    } else {
        "dropped"
    });
    v.check(
        matches!(
            outcome,
            None | Some(Err(Error::TokenUsed | Error::Backend(_)))
        ),
        || format!("a call with a used token gave {outcome:?}"),
    );
    if let Some(view) = at.view() {
        let record = format!("redguard:idem:{{{SCOPE}:{key}}}");
        let status = view.field(&record, "status").await;
        v.check(status.is_none(), || {
            format!("the record begun for a refused token is still there: {status:?}")
        });
    }
    let valid = issue(&at.rg).await;
    let second = Arc::new(Body::default());
    let retry = call(&at.rg, &key, Some(&valid), second.clone()).await;
    let runs = first.runs.load(Ordering::SeqCst) + second.runs.load(Ordering::SeqCst);
    v.check(matches!(retry, Ok(7)) && runs == 1, || {
        format!("with a valid token the same key gave {retry:?}, the body ran {runs} times")
    });
    v
}

/// A detached body runs to its end in its own task once begun, whenever its caller is
/// dropped: the intent is either not begun (undone: the retry runs it) or done (the retry
/// replays it).
async fn detached(at: Attempt) -> Verdict {
    let key = at.key("detached");
    let first = Arc::new(Body::default());
    let body = first.clone();
    let idem = redguard::idempotency(KeyBuilder::new().text(&key).finish().expect("key"))
        .scope(SCOPE)
        .expire(EXPIRE)
        .detach();
    let outcome = at
        .drive(at.rg.scope(idem.run(async move {
            body.runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok::<_, Error>(7)
        })))
        .await;
    // The detached body, if it started, finishes on its own.
    tokio::time::sleep(Duration::from_millis(50)).await;
    at.settle().await;
    let mut v = Verdict::new(outcome.is_some());
    let ran = first.runs.load(Ordering::SeqCst) == 1;
    v.landed(match (&outcome, ran) {
        (Some(_), _) => "completed",
        (None, true) => "dropped, body ran",
        (None, false) => "dropped, not begun",
    });
    v.check(
        matches!(outcome, None | Some(Ok(7)) | Some(Err(Error::Backend(_)))),
        || format!("the call ended with {outcome:?}"),
    );
    if let Some(view) = at.view() {
        let record = format!("redguard:idem:{{{SCOPE}:{key}}}");
        let status = view.field(&record, "status").await;
        let documented = if ran { Some("S") } else { None };
        v.check(status.as_deref() == documented, || {
            format!("body ran: {ran}, record status {status:?}, documented {documented:?}")
        });
    }
    let second = Arc::new(Body::default());
    let retry = call(&at.rg, &key, None, second.clone()).await;
    let runs = first.runs.load(Ordering::SeqCst) + second.runs.load(Ordering::SeqCst);
    v.check(matches!(retry, Ok(7)) && runs == 1, || {
        format!("the retry gave {retry:?}, the body ran {runs} times in all")
    });
    v
}

/// A duplicate (with `wait`) of an execution that runs until the duplicate was dropped or
/// gave up waiting: however it ends, the first's record is the first's, and its outcome is
/// what a retry gets.
async fn waiting_duplicate(at: Attempt) -> Verdict {
    let key = at.key("wait");
    let intent = || {
        redguard::idempotency(KeyBuilder::new().text(&key).finish().expect("key"))
            .scope(SCOPE)
            .expire(EXPIRE)
    };
    let (started, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let first = {
        let (started, release) = (started.clone(), release.clone());
        tokio::spawn(at.rg.scope(intent().run(async move {
            started.notify_one();
            release.notified().await;
            Ok::<_, Error>(7)
        })))
    };
    started.notified().await;
    let duplicate = Arc::new(Body::default());
    let body = duplicate.clone();
    let outcome = at
        .drive(
            at.rg
                .scope(intent().wait(Duration::from_millis(200)).run(async move {
                    body.runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(8)
                })),
        )
        .await;
    at.settle().await;
    release.notify_one();
    let first = first.await.expect("the first execution's task");
    let mut v = Verdict::new(outcome.is_some());
    v.landed(match &outcome {
        Some(_) => "completed",
        None => "dropped",
    });
    v.check(
        matches!(
            outcome,
            None | Some(Err(Error::InProgress)) | Some(Err(Error::Backend(_)))
        ),
        || format!("the duplicate ended with {outcome:?} while the first ran"),
    );
    v.check(matches!(first, Ok(7)), || {
        format!("the first execution ended with {first:?}")
    });
    if let Some(view) = at.view() {
        let record = format!("redguard:idem:{{{SCOPE}:{key}}}");
        let status = view.field(&record, "status").await;
        v.check(status.as_deref() == Some("S"), || {
            format!("the first's record is {status:?}, not SUCCESS")
        });
    }
    let retry = call(&at.rg, &key, None, Arc::new(Body::default())).await;
    let runs = duplicate.runs.load(Ordering::SeqCst);
    v.check(matches!(retry, Ok(7)) && runs == 0, || {
        format!("the retry gave {retry:?}; the duplicate's body ran {runs} times")
    });
    v
}

async fn consume(at: Attempt) -> Verdict {
    let token = issue(&at.rg).await;
    let outcome = at.drive(at.rg.tokens().consume(SCENE, &token)).await;
    at.settle().await;
    let mut v = Verdict::new(outcome.is_some());
    let again = at.rg.tokens().consume(SCENE, &token).await;
    v.landed(match &outcome {
        Some(Ok(())) => "consumed",
        Some(Err(_)) => "failed",
        None => "dropped",
    });
    match outcome {
        Some(Ok(())) => v.check(matches!(again, Err(Error::TokenUsed)), || {
            format!("consumed, then consumed again: {again:?}")
        }),
        // The caller was not told it got the token: it must be there for the retry.
        None | Some(Err(Error::Backend(_))) => v.check(again.is_ok(), || {
            format!("{outcome:?}, then the retry's consume gave {again:?}")
        }),
        Some(Err(other)) => v.check(false, || format!("consume failed: {other:?}")),
    }
    v
}

/// The sliding window (a log of admitted calls) shows exactly how many calls it charged.
const WINDOW: Duration = Duration::from_millis(400);

/// A check that is rejected, waits for the window to free a slot, and checks again.
async fn rate_wait(at: Attempt) -> Verdict {
    let limiter = redguard::limiter(at.key("rate"))
        .rate("2/400ms")
        .algorithm(Algorithm::SlidingWindow)
        .wait(WINDOW + Duration::from_millis(200))
        .on(&at.rg);
    for _ in 0..2 {
        let filled = limiter.decide().await.expect("fill the window");
        assert!(filled.allowed, "the window was not empty");
    }
    let filled = Instant::now();
    let outcome = at.drive(limiter.check()).await;
    at.settle().await;
    // The two calls above have left the window by then; a charge of this call has not.
    tokio::time::sleep_until((filled + WINDOW + Duration::from_millis(40)).into()).await;
    let peek = limiter.peek().await.expect("peek");
    let mut v = Verdict::new(outcome.is_some());
    v.check(filled.elapsed() < 2 * WINDOW, || {
        format!(
            "measured {:?} after the window was filled: too late to tell",
            filled.elapsed()
        )
    });
    // A peek reports what would remain after one more call, when it would be admitted.
    let charged = peek.limit - peek.remaining - u64::from(peek.allowed);
    v.check(charged <= 1, || {
        format!("charged {charged} times for one call")
    });
    v.landed(match (&outcome, charged) {
        (Some(_), _) => "completed",
        (None, 0) => "dropped, not charged",
        (None, _) => "dropped, charged",
    });
    match &outcome {
        // Admitted by the store (a fail-open admission, when it did not answer in time,
        // leaves the full limit and may or may not have been charged when it did).
        Some(Ok(decision)) if decision.remaining < decision.limit => {
            v.check(charged == 1, || format!("admitted, charged {charged}"));
        }
        Some(Ok(_)) => {}
        Some(Err(Error::RateLimited(_))) => {
            v.check(charged == 0, || format!("rejected, charged {charged}"));
        }
        Some(Err(other)) => v.check(false, || format!("the check failed: {other:?}")),
        // On the memory store a check is never in flight: a drop is during the wait.
        None if at.view().is_none() => {
            v.check(charged == 0, || {
                format!("dropped while waiting, charged {charged}")
            });
        }
        None => {}
    }
    v
}

async fn issue(rg: &Redguard) -> String {
    rg.tokens()
        .issue(SCENE, EXPIRE)
        .await
        .expect("issue a token")
}
