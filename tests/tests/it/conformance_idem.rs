//! `#[idempotent]` on every store: exactly-once, replay, retry after a business error, and
//! the unknown outcomes (timeout, indeterminate error, panic, cancellation) that must block
//! blind retries until an operator resolves them or the record expires.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redguard::__private::store::{Begin, Finish, IdemBegin, IdemFinish, IdemFinished};
use redguard::{Classify, Error, ErrorClass, Redguard, idempotent, track_replay};
use serde::{Deserialize, Serialize};

redguard_tests::conformance!(
    concurrent_calls_with_one_key_run_once,
    business_error_allows_exactly_one_of_many_retries,
    unknown_outcomes_block_retries_until_expiry,
    payload_mismatch_is_key_reuse_and_replay_is_equal,
    token_mode_consumes_once,
    a_lost_record_is_not_overwritten_by_its_old_owner,
    invalid_key_parts_are_rejected_before_the_store,
    a_long_body_is_not_run_twice,
    an_unreplayable_result_is_not_recorded,
    a_failed_body_gives_its_token_back,
    a_retried_token_submission_replays,
    derived_classify_sees_through_guard_errors,
    a_detached_body_finishes_after_its_caller_is_dropped,
    a_body_that_blocks_its_thread_is_not_run_twice,
    a_failed_request_releases_its_key_for_a_corrected_payload,
    an_operator_resolves_an_unknown_outcome,
);

#[derive(Debug)]
enum OrderError {
    OutOfStock,
    GatewayTimeout,
    Guard(Error),
}

impl From<Error> for OrderError {
    fn from(err: Error) -> Self {
        OrderError::Guard(err)
    }
}

impl Classify for OrderError {
    fn class(&self) -> ErrorClass {
        match self {
            OrderError::OutOfStock => ErrorClass::Business,
            OrderError::GatewayTimeout => ErrorClass::Indeterminate,
            OrderError::Guard(err) => err.class(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order: String,
    run: usize,
}

#[derive(Debug, Clone, Copy)]
enum Body {
    Ok,
    Business,
    Indeterminate,
    Panic,
    Slow(u64),
}

/// Counts runs of the body; `then` says how the body ends.
#[idempotent(key = "order:{order}", expire = 1)]
async fn place(order: &str, runs: Arc<AtomicUsize>, then: Body) -> Result<Receipt, OrderError> {
    place_body(order, runs, then).await
}

async fn place_body(
    order: &str,
    runs: Arc<AtomicUsize>,
    then: Body,
) -> Result<Receipt, OrderError> {
    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
    match then {
        Body::Ok => {}
        Body::Business => return Err(OrderError::OutOfStock),
        Body::Indeterminate => return Err(OrderError::GatewayTimeout),
        Body::Panic => panic!("body panicked"),
        Body::Slow(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
    }
    Ok(Receipt {
        order: order.to_owned(),
        run,
    })
}

#[idempotent(key = "pay:{payment}", expire = "10m", timeout = "100ms")]
async fn pay(payment: u64, runs: Arc<AtomicUsize>, took_ms: u64) -> Result<u64, OrderError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(took_ms)).await;
    Ok(payment)
}

#[derive(Debug, Serialize)]
struct Submit {
    sku: String,
    qty: u32,
}

#[idempotent(key = "{user}:{request}", expire = 600, payload = req)]
async fn submit(
    user: u64,
    request: &str,
    req: Submit,
    runs: Arc<AtomicUsize>,
) -> Result<String, OrderError> {
    let run = runs.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{user}/{request}/{}x{}#{run}", req.qty, req.sku))
}

#[idempotent(token = "{token}", scene = "order-submit")]
async fn submit_with_token(token: &str, runs: Arc<AtomicUsize>) -> Result<(), OrderError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(())
}

fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

fn is_in_progress<T: std::fmt::Debug>(result: &Result<T, OrderError>) -> bool {
    matches!(result, Err(OrderError::Guard(Error::InProgress)))
}

fn is_unknown<T: std::fmt::Debug>(result: &Result<T, OrderError>) -> bool {
    matches!(result, Err(OrderError::Guard(Error::OutcomeUnknown)))
}

async fn concurrent_calls_with_one_key_run_once(rg: Redguard) {
    let runs = counter();
    let calls: Vec<_> = (0..50)
        .map(|_| {
            let runs = runs.clone();
            tokio::spawn(rg.scope(track_replay(async move {
                place("o-1", runs, Body::Slow(100)).await
            })))
        })
        .collect();
    let (mut first, mut in_progress, mut replayed) = (0, 0, 0);
    for call in calls {
        match call.await.unwrap() {
            (Ok(receipt), false) => {
                assert_eq!(receipt.run, 1);
                first += 1;
            }
            (Ok(receipt), true) => {
                assert_eq!(receipt.run, 1);
                replayed += 1;
            }
            (result, _) if is_in_progress(&result) => in_progress += 1,
            (other, _) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body ran more than once"
    );
    assert_eq!(first, 1);
    assert_eq!(first + in_progress + replayed, 50);
    println!("50 concurrent calls: 1 ran, {in_progress} in progress, {replayed} replayed");

    // Once finished, every retry is a replay of the first result.
    let (again, was_replayed) = rg
        .scope(track_replay(place("o-1", runs.clone(), Body::Ok)))
        .await;
    assert!(was_replayed);
    assert_eq!(
        again.unwrap(),
        Receipt {
            order: "o-1".into(),
            run: 1
        }
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn business_error_allows_exactly_one_of_many_retries(rg: Redguard) {
    let runs = counter();
    let failed = rg.scope(place("o-2", runs.clone(), Body::Business)).await;
    assert!(matches!(failed, Err(OrderError::OutOfStock)), "{failed:?}");

    let retries: Vec<_> = (0..20)
        .map(|_| tokio::spawn(rg.scope(place("o-2", runs.clone(), Body::Slow(100)))))
        .collect();
    let mut succeeded = 0;
    for retry in retries {
        match retry.await.unwrap() {
            Ok(receipt) => {
                assert_eq!(receipt.run, 2);
                succeeded += 1;
            }
            result if is_in_progress(&result) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(succeeded >= 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "exactly one retry must run");
}

/// Polls until the record has expired and a retry runs; returns how long that took.
async fn retry_after_expiry(rg: &Redguard, order: &str, runs: &Arc<AtomicUsize>) -> Duration {
    let started = std::time::Instant::now();
    loop {
        let result = rg.scope(place(order, runs.clone(), Body::Ok)).await;
        if !is_unknown(&result) {
            result.unwrap();
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "record never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The retry of an execution whose outcome is being recorded in a task of its own (its
/// future was dropped, or it panicked): `InProgress` until that lands, then `OutcomeUnknown`.
async fn unknown_once_recorded(rg: &Redguard, order: &str, runs: &Arc<AtomicUsize>) {
    let started = std::time::Instant::now();
    loop {
        let blocked = rg.scope(place(order, runs.clone(), Body::Ok)).await;
        if is_unknown(&blocked) {
            return;
        }
        assert!(is_in_progress(&blocked), "{order}: {blocked:?}");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{order}: the unknown outcome was never recorded"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn unknown_outcomes_block_retries_until_expiry(rg: Redguard) {
    let runs = counter();

    // An error classified indeterminate.
    let unknown = rg
        .scope(place("u-1", runs.clone(), Body::Indeterminate))
        .await;
    assert!(matches!(unknown, Err(OrderError::GatewayTimeout)));
    let blocked = rg.scope(place("u-1", runs.clone(), Body::Ok)).await;
    assert!(is_unknown(&blocked), "{blocked:?}");

    // A panic in the body.
    let panicked = tokio::spawn(rg.scope(place("u-2", runs.clone(), Body::Panic))).await;
    assert!(panicked.unwrap_err().is_panic());
    unknown_once_recorded(&rg, "u-2", &runs).await;

    // The caller's future dropped mid-body.
    let dropped = tokio::time::timeout(
        Duration::from_millis(50),
        rg.scope(place("u-3", runs.clone(), Body::Slow(10_000))),
    )
    .await;
    assert!(dropped.is_err());
    unknown_once_recorded(&rg, "u-3", &runs).await;

    // The attribute's own timeout.
    let timed_out = rg.scope(pay(7, runs.clone(), 1_000)).await;
    assert!(
        matches!(timed_out, Err(OrderError::Guard(Error::Timeout { .. }))),
        "{timed_out:?}"
    );
    let blocked = rg.scope(pay(7, runs.clone(), 0)).await;
    assert!(is_unknown(&blocked), "{blocked:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        4,
        "blocked retries must not run"
    );

    // `expire = 1`: after a second the unknown outcomes may be retried.
    for order in ["u-1", "u-2", "u-3"] {
        let waited = retry_after_expiry(&rg, order, &runs).await;
        assert!(
            waited < Duration::from_millis(1_500),
            "{order} waited {waited:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 7);
}

async fn payload_mismatch_is_key_reuse_and_replay_is_equal(rg: Redguard) {
    let runs = counter();
    let req = || Submit {
        sku: "SK-1".into(),
        qty: 2,
    };
    let first = rg
        .scope(submit(9, "r-1", req(), runs.clone()))
        .await
        .unwrap();
    let replay = rg
        .scope(submit(9, "r-1", req(), runs.clone()))
        .await
        .unwrap();
    assert_eq!(first, replay);
    let other = Submit {
        sku: "SK-1".into(),
        qty: 3,
    };
    let reused = rg.scope(submit(9, "r-1", other, runs.clone())).await;
    assert!(
        matches!(reused, Err(OrderError::Guard(Error::KeyReuse))),
        "{reused:?}"
    );
    // The same request id of another user is another intent.
    rg.scope(submit(10, "r-1", req(), runs.clone()))
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

async fn token_mode_consumes_once(rg: Redguard) {
    let runs = counter();
    let token = rg
        .tokens()
        .issue("order-submit", Duration::from_secs(60))
        .await
        .unwrap();
    rg.scope(submit_with_token(&token, runs.clone()))
        .await
        .unwrap();
    let again = rg.scope(submit_with_token(&token, runs.clone())).await;
    assert!(
        matches!(again, Err(OrderError::Guard(Error::TokenUsed))),
        "{again:?}"
    );
    let forged = rg
        .scope(submit_with_token(
            "00000000000000000000000000000000",
            runs.clone(),
        ))
        .await;
    assert!(
        matches!(forged, Err(OrderError::Guard(Error::TokenUnknown))),
        "{forged:?}"
    );
    let malformed = rg.scope(submit_with_token("x:y", runs.clone())).await;
    assert!(
        matches!(malformed, Err(OrderError::Guard(Error::TokenUnknown))),
        "{malformed:?}"
    );
    let other_scene = rg
        .tokens()
        .issue("signup", Duration::from_secs(60))
        .await
        .unwrap();
    let mismatch = rg
        .scope(submit_with_token(&other_scene, runs.clone()))
        .await;
    assert!(
        matches!(mismatch, Err(OrderError::Guard(Error::TokenMismatch))),
        "{mismatch:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A double click: two concurrent submits with one token, one runs.
    let token = rg
        .tokens()
        .issue("order-submit", Duration::from_secs(60))
        .await
        .unwrap();
    let clicks: Vec<_> = (0..2)
        .map(|_| {
            let token = token.clone();
            let runs = runs.clone();
            tokio::spawn(rg.scope(async move { submit_with_token(&token, runs).await }))
        })
        .collect();
    let mut ok = 0;
    for click in clicks {
        match click.await.unwrap() {
            Ok(()) => ok += 1,
            Err(OrderError::Guard(Error::TokenUsed)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(ok, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// An execution whose record was lost (expired while its renewals could not reach the store)
/// and begun again by another cannot overwrite the newer record when it finishes.
async fn a_lost_record_is_not_overwritten_by_its_old_owner(rg: Redguard) {
    let body = redguard::KeyBuilder::new().text("lost").finish().unwrap();
    let key = rg
        .key(redguard::GuardKind::Idempotency, "conf", &body)
        .unwrap();
    let store = redguard::__private::store::of(&rg);
    let short = Duration::from_millis(200);
    assert_eq!(
        store.idem_begin(begin(&key, "old", short)).await.unwrap(),
        IdemBegin::Started
    );
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    assert!(!store.idem_renew(&key, "old", short).await.unwrap());
    assert_eq!(
        store.idem_begin(begin(&key, "new", LONG)).await.unwrap(),
        IdemBegin::Started
    );
    let late = store
        .idem_finish(Finish {
            key: &key,
            owner: "old",
            outcome: IdemFinish::Success(b"1"),
            ttl: LONG,
            replicas: None,
        })
        .await
        .unwrap();
    assert_eq!(late, IdemFinished::NotOwner);
    let done = store
        .idem_finish(Finish {
            key: &key,
            owner: "new",
            outcome: IdemFinish::Success(b"2"),
            ttl: LONG,
            replicas: None,
        })
        .await
        .unwrap();
    assert_eq!(done, IdemFinished::Recorded);
    assert_eq!(
        store.idem_begin(begin(&key, "later", LONG)).await.unwrap(),
        IdemBegin::Done(b"2".to_vec())
    );
}

const LONG: Duration = Duration::from_secs(60);

fn begin<'a>(key: &'a redguard::Key, owner: &'a str, ttl: Duration) -> Begin<'a> {
    Begin {
        key,
        owner,
        fingerprint: "",
        ttl,
        replicas: None,
    }
}

/// A body that runs longer than `expire` keeps its record: a retry meanwhile is told the
/// intent is in progress, never runs it a second time.
async fn a_long_body_is_not_run_twice(rg: Redguard) {
    let runs = counter();
    let first = tokio::spawn(rg.scope(place("long-1", runs.clone(), Body::Slow(2_500))));
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let retry = rg.scope(place("long-1", runs.clone(), Body::Ok)).await;
        assert!(is_in_progress(&retry), "{retry:?}");
    }
    assert_eq!(first.await.unwrap().unwrap().run, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the intent ran twice");
    let replay = rg.scope(place("long-1", runs.clone(), Body::Ok)).await;
    assert_eq!(replay.unwrap().run, 1);
}

#[idempotent(key = "{id}", expire = 600)]
async fn measure(id: u64, runs: Arc<AtomicUsize>) -> Result<f64, OrderError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(if id == 0 { f64::NAN } else { 1.5 })
}

/// A value that serializes but does not read back (NaN is written as `null`) is not
/// recorded as a success that every replay would then fail on: the caller gets it, and the
/// record is UNKNOWN (the outcome cannot be replayed, so retries must not re-run it).
async fn an_unreplayable_result_is_not_recorded(rg: Redguard) {
    let runs = counter();
    let first = rg.scope(measure(0, runs.clone())).await.unwrap();
    assert!(first.is_nan());
    let retry = rg.scope(measure(0, runs.clone())).await;
    assert!(is_unknown(&retry), "{retry:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(rg.scope(measure(1, runs.clone())).await.unwrap(), 1.5);
    assert_eq!(rg.scope(measure(1, runs.clone())).await.unwrap(), 1.5);
}

#[idempotent(token = "{token}", scene = "order-submit")]
async fn submit_or_fail(token: &str, fail: bool) -> Result<u32, OrderError> {
    if fail {
        return Err(OrderError::Guard(Error::LockTimeout {
            key: "stock".into(),
            waited: Duration::from_millis(300),
        }));
    }
    Ok(7)
}

/// A refused or failed body (a lock timeout, out of stock) gives its token back, so the retry
/// its error invites can use the same token.
async fn a_failed_body_gives_its_token_back(rg: Redguard) {
    let token = rg
        .tokens()
        .issue("order-submit", Duration::from_secs(60))
        .await
        .unwrap();
    let busy = rg.scope(submit_or_fail(&token, true)).await;
    assert!(
        matches!(busy, Err(OrderError::Guard(Error::LockTimeout { .. }))),
        "{busy:?}"
    );
    assert_eq!(rg.scope(submit_or_fail(&token, false)).await.unwrap(), 7);
    let again = rg.scope(submit_or_fail(&token, false)).await;
    assert!(
        matches!(again, Err(OrderError::Guard(Error::TokenUsed))),
        "{again:?}"
    );
}

#[idempotent(
    key = "{request}",
    expire = 600,
    token = "{token}",
    scene = "order-submit"
)]
async fn submit_keyed(
    request: &str,
    token: &str,
    runs: Arc<AtomicUsize>,
) -> Result<usize, OrderError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

/// With a key and a token, the retry of a successful submission (its response was lost)
/// replays the first result instead of reporting the token used; another request with the
/// used token is refused.
async fn a_retried_token_submission_replays(rg: Redguard) {
    let runs = counter();
    let token = rg
        .tokens()
        .issue("order-submit", Duration::from_secs(60))
        .await
        .unwrap();
    let first = rg.scope(submit_keyed("req-1", &token, runs.clone())).await;
    assert_eq!(first.unwrap(), 1);
    let (retry, replayed) = rg
        .scope(track_replay(submit_keyed("req-1", &token, runs.clone())))
        .await;
    assert_eq!((retry.unwrap(), replayed), (1, true));
    let other = rg.scope(submit_keyed("req-2", &token, runs.clone())).await;
    assert!(
        matches!(other, Err(OrderError::Guard(Error::TokenUsed))),
        "{other:?}"
    );
    // A refused token leaves no record behind: the key is free for a valid token.
    let fresh = rg
        .tokens()
        .issue("order-submit", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        rg.scope(submit_keyed("req-2", &fresh, runs.clone()))
            .await
            .unwrap(),
        2
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[derive(Debug, redguard::Classify)]
enum PayError {
    Declined,
    #[classify(indeterminate)]
    GatewayTimeout,
    Guard(redguard::Error),
}

impl From<Error> for PayError {
    fn from(err: Error) -> Self {
        PayError::Guard(err)
    }
}

#[idempotent(key = "{id}", expire = 600)]
async fn charge(id: u64, then: u8, runs: Arc<AtomicUsize>) -> Result<(), PayError> {
    runs.fetch_add(1, Ordering::SeqCst);
    match then {
        0 => Err(PayError::Declined),
        1 => Err(PayError::GatewayTimeout),
        _ => Err(PayError::Guard(Error::LockLost { key: "k".into() })),
    }
}

/// `#[derive(Classify)]`: a wrapped guard error classifies itself (a lock lost mid-body is an
/// unknown outcome), a marked variant is indeterminate, the rest are business errors.
async fn derived_classify_sees_through_guard_errors(rg: Redguard) {
    assert_eq!(PayError::Declined.class(), ErrorClass::Business);
    assert_eq!(PayError::GatewayTimeout.class(), ErrorClass::Indeterminate);
    assert_eq!(
        PayError::Guard(Error::LockLost { key: "k".into() }).class(),
        ErrorClass::Indeterminate
    );
    assert_eq!(
        PayError::Guard(Error::InProgress).class(),
        ErrorClass::Business
    );
    let runs = counter();
    for (id, then, retry_runs) in [(1, 0, true), (2, 1, false), (3, 2, false)] {
        let _ = rg.scope(charge(id, then, runs.clone())).await;
        let before = runs.load(Ordering::SeqCst);
        let retry = rg.scope(charge(id, then, runs.clone())).await;
        assert_eq!(
            runs.load(Ordering::SeqCst) > before,
            retry_runs,
            "case {id}: {retry:?}"
        );
    }
}

/// Opt-in: the body runs in its own task, so a caller that goes away (a client that
/// disconnected) does not strand its intent: the body completes, its outcome is recorded,
/// and the retry gets it.
async fn a_detached_body_finishes_after_its_caller_is_dropped(rg: Redguard) {
    let runs = counter();
    let call = |runs: Arc<AtomicUsize>| {
        let key = redguard::KeyBuilder::new()
            .text("detached")
            .finish()
            .unwrap();
        redguard::Idempotency::new("conf", key)
            .expire(Duration::from_secs(600))
            .detach()
            .run(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) + 1)
            })
    };
    let dropped =
        tokio::time::timeout(Duration::from_millis(50), rg.scope(call(runs.clone()))).await;
    assert!(dropped.is_err(), "the caller was not dropped mid-body");
    let started = std::time::Instant::now();
    let outcome = loop {
        match rg.scope(track_replay(call(runs.clone()))).await {
            (Err(Error::InProgress), _) => tokio::time::sleep(Duration::from_millis(50)).await,
            (outcome, replayed) => break (outcome.unwrap(), replayed),
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "the detached body never finished"
        );
    };
    assert_eq!(outcome, (1, true));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn invalid_key_parts_are_rejected_before_the_store(rg: Redguard) {
    let runs = counter();
    let long = "x".repeat(65);
    for bad in [long.as_str(), "a:b", "{tag}", "a b", ""] {
        let result = rg.scope(place(bad, runs.clone(), Body::Ok)).await;
        match result {
            Err(OrderError::Guard(Error::InvalidKey { part, .. })) => assert_eq!(part, "order"),
            Err(OrderError::Guard(Error::MissingKey { part })) => {
                assert!(bad.is_empty());
                assert_eq!(part, "order");
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[idempotent(key = "block:{id}", expire = 1)]
async fn blocking(id: u64, runs: Arc<AtomicUsize>, block_ms: u64) -> Result<usize, OrderError> {
    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
    // A synchronous driver: the thread is blocked, nothing else of this task runs meanwhile.
    std::thread::sleep(Duration::from_millis(block_ms));
    Ok(run)
}

/// A body that blocks its thread past `expire` keeps its record: the keep-alive runs in a
/// task of its own, which the blocked body cannot starve (issue 25, finding 5).
async fn a_body_that_blocks_its_thread_is_not_run_twice(rg: Redguard) {
    let runs = counter();
    let first = tokio::spawn(rg.scope(blocking(1, runs.clone(), 2_500)));
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let retry = rg.scope(blocking(1, runs.clone(), 0)).await;
    assert!(is_in_progress(&retry), "{retry:?}");
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the intent ran twice");
    assert_eq!(rg.scope(blocking(1, runs.clone(), 0)).await.unwrap(), 1);
}

#[idempotent(key = "{user}:{request}", expire = 600, payload = req)]
async fn submit_checked(
    user: u64,
    request: &str,
    req: Submit,
    runs: Arc<AtomicUsize>,
) -> Result<String, OrderError> {
    runs.fetch_add(1, Ordering::SeqCst);
    if req.qty == 0 {
        // Invalid input: a business failure, the client corrects it and retries.
        return Err(OrderError::OutOfStock);
    }
    Ok(format!("{user}/{request}/{}x{}", req.qty, req.sku))
}

/// A FAIL record releases its key for any payload: the corrected retry of a refused request
/// runs (the guide: "the record is released"), and from then on the key is bound to the payload
/// that ran.
async fn a_failed_request_releases_its_key_for_a_corrected_payload(rg: Redguard) {
    let runs = counter();
    let req = |qty| Submit {
        sku: "SK-1".into(),
        qty,
    };
    let refused = rg
        .scope(submit_checked(9, "r-9", req(0), runs.clone()))
        .await;
    assert!(
        matches!(refused, Err(OrderError::OutOfStock)),
        "{refused:?}"
    );
    let corrected = rg
        .scope(submit_checked(9, "r-9", req(2), runs.clone()))
        .await;
    assert_eq!(corrected.unwrap(), "9/r-9/2xSK-1");
    let replay = rg
        .scope(submit_checked(9, "r-9", req(2), runs.clone()))
        .await;
    assert_eq!(replay.unwrap(), "9/r-9/2xSK-1");
    let reused = rg
        .scope(submit_checked(9, "r-9", req(3), runs.clone()))
        .await;
    assert!(
        matches!(reused, Err(OrderError::Guard(Error::KeyReuse))),
        "{reused:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// `place`, with records that outlive the test.
#[idempotent(key = "order:{order}", expire = 600, scope = "conf::resolve")]
async fn settle(order: &str, runs: Arc<AtomicUsize>, then: Body) -> Result<Receipt, OrderError> {
    place_body(order, runs, then).await
}

/// `Admin::resolve`: an UNKNOWN record marked failed lets the next retry run; one marked
/// succeeded replays the operator's value; a live PROCESSING or a SUCCESS record is refused
/// (nothing written) unless forced, and a missing one is refused.
async fn an_operator_resolves_an_unknown_outcome(rg: Redguard) {
    use redguard::admin::{Admin, Resolution};
    let runs = counter();
    let admin = Admin::new(rg.clone());
    let key = |order: &str| {
        admin
            .key(
                redguard::GuardKind::Idempotency,
                "conf::resolve",
                &format!("order:{order}"),
            )
            .unwrap()
    };

    // Failed: the next retry runs the body.
    let _ = rg
        .scope(settle("r-1", runs.clone(), Body::Indeterminate))
        .await;
    assert!(is_unknown(
        &rg.scope(settle("r-1", runs.clone(), Body::Ok)).await
    ));
    let done = admin
        .resolve(&key("r-1"), Resolution::Failed, false)
        .await
        .unwrap();
    assert_eq!((done.was, done.now), ("unknown", "fail"));
    let retried = rg
        .scope(settle("r-1", runs.clone(), Body::Ok))
        .await
        .unwrap();
    assert_eq!(retried.run, 2);

    // Succeeded: retries replay the operator's value, the body does not run.
    let _ = rg
        .scope(settle("r-2", runs.clone(), Body::Indeterminate))
        .await;
    let value = serde_json::json!({"order": "r-2", "run": 99});
    let done = admin
        .resolve(&key("r-2"), Resolution::Succeeded(value), false)
        .await
        .unwrap();
    assert_eq!((done.was, done.now), ("unknown", "success"));
    let (replay, replayed) = rg
        .scope(track_replay(settle("r-2", runs.clone(), Body::Ok)))
        .await;
    assert_eq!((replay.unwrap().run, replayed), (99, true));
    let seen = admin.inspect(&key("r-2")).await.unwrap().record.unwrap();
    assert!(seen.ttl_ms.is_some_and(|ttl| ttl <= 600_000), "{seen:?}");

    // A SUCCESS record is refused without force, and kept.
    let refused = admin.resolve(&key("r-2"), Resolution::Failed, false).await;
    assert!(matches!(refused, Err(Error::Config(_))), "{refused:?}");
    assert_eq!(
        rg.scope(settle("r-2", runs.clone(), Body::Ok))
            .await
            .unwrap()
            .run,
        99
    );

    // A live PROCESSING record is refused without force; forced, its execution cannot
    // overwrite the verdict.
    let live = tokio::spawn(rg.scope(settle("r-3", runs.clone(), Body::Slow(300))));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = admin.resolve(&key("r-3"), Resolution::Failed, false).await;
    assert!(matches!(refused, Err(Error::Config(_))), "{refused:?}");
    let forced = serde_json::json!({"order": "r-3", "run": 42});
    let done = admin
        .resolve(&key("r-3"), Resolution::Succeeded(forced), true)
        .await
        .unwrap();
    assert_eq!(done.was, "processing");
    live.await.unwrap().unwrap();
    assert_eq!(
        rg.scope(settle("r-3", runs.clone(), Body::Ok))
            .await
            .unwrap()
            .run,
        42
    );

    let missing = admin.resolve(&key("r-4"), Resolution::Failed, false).await;
    assert!(matches!(missing, Err(Error::Config(_))), "{missing:?}");
    assert!(admin.inspect(&key("r-4")).await.unwrap().record.is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}
