//! `#[idempotent]` on every store: exactly-once, replay, retry after a business error, and
//! the unknown outcomes (timeout, indeterminate error, panic, cancellation) that must block
//! blind retries until the record expires.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redguard::{Classify, Error, ErrorClass, Redguard, idempotent, track_replay};
use serde::{Deserialize, Serialize};

redguard_tests::conformance!(
    concurrent_calls_with_one_key_run_once,
    business_error_allows_exactly_one_of_many_retries,
    unknown_outcomes_block_retries_until_expiry,
    payload_mismatch_is_key_reuse_and_replay_is_equal,
    token_mode_consumes_once,
    slow_owner_does_not_overwrite_a_taken_over_record,
    invalid_key_parts_are_rejected_before_the_store,
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
        if !is_in_progress(&result) {
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

async fn unknown_outcomes_block_retries_until_expiry(rg: Redguard) {
    let runs = counter();

    // An error classified indeterminate.
    let unknown = rg
        .scope(place("u-1", runs.clone(), Body::Indeterminate))
        .await;
    assert!(matches!(unknown, Err(OrderError::GatewayTimeout)));
    let blocked = rg.scope(place("u-1", runs.clone(), Body::Ok)).await;
    assert!(is_in_progress(&blocked), "{blocked:?}");

    // A panic in the body.
    let panicked = tokio::spawn(rg.scope(place("u-2", runs.clone(), Body::Panic))).await;
    assert!(panicked.unwrap_err().is_panic());
    let blocked = rg.scope(place("u-2", runs.clone(), Body::Ok)).await;
    assert!(is_in_progress(&blocked), "{blocked:?}");

    // The caller's future dropped mid-body.
    let dropped = tokio::time::timeout(
        Duration::from_millis(50),
        rg.scope(place("u-3", runs.clone(), Body::Slow(10_000))),
    )
    .await;
    assert!(dropped.is_err());
    let blocked = rg.scope(place("u-3", runs.clone(), Body::Ok)).await;
    assert!(is_in_progress(&blocked), "{blocked:?}");

    // The attribute's own timeout.
    let timed_out = rg.scope(pay(7, runs.clone(), 1_000)).await;
    assert!(
        matches!(timed_out, Err(OrderError::Guard(Error::Timeout { .. }))),
        "{timed_out:?}"
    );
    let blocked = rg.scope(pay(7, runs.clone(), 0)).await;
    assert!(
        matches!(blocked, Err(OrderError::Guard(Error::InProgress))),
        "{blocked:?}"
    );
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

async fn slow_owner_does_not_overwrite_a_taken_over_record(rg: Redguard) {
    let runs = counter();
    // The first execution outlives its record (expire = 1 s).
    let slow = tokio::spawn(rg.scope(place("t-1", runs.clone(), Body::Slow(1_600))));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waited = retry_after_expiry(&rg, "t-1", &runs).await;
    assert!(waited < Duration::from_millis(1_500));
    // The slow owner finishes later; its finish must not replace the newer record.
    let slow = slow.await.unwrap().unwrap();
    assert_eq!(slow.run, 1);
    let replay = rg
        .scope(place("t-1", runs.clone(), Body::Ok))
        .await
        .unwrap();
    assert_eq!(replay.run, 2, "the stale owner overwrote the record");
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
