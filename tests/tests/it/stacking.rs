//! Stacked guards apply outside-in in the order written. The documented recipe —
//! `#[rate_limit]` above `#[idempotent]` above `#[dist_lock]` — means a replay still costs a
//! rate-limit point but never takes the lock, and a rate-limited call never reaches the
//! idempotency record.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use redguard::{Error, Redguard, dist_lock, idempotent, rate_limit};

#[rate_limit(key = "submit:{user}", rate = "3/h", burst = 3)]
#[idempotent(key = "{user}:{request}", expire = 600)]
#[dist_lock(key = "stock:{sku}", wait = "1s")]
async fn submit(
    user: u64,
    request: &str,
    sku: &str,
    runs: Arc<AtomicUsize>,
) -> redguard::Result<Option<u64>> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(redguard::lock::fence())
}

/// The other order: the lock is taken before the idempotency record is looked at, so even a
/// replay waits for the lock. The expansion warns about it; this fn means it.
#[allow(deprecated)]
#[dist_lock(key = "stock:{sku}", wait = "100ms")]
#[idempotent(key = "{request}", expire = 600)]
async fn lock_first(request: &str, sku: &str) -> redguard::Result<u64> {
    Ok(redguard::lock::fence().unwrap_or(0))
}

async fn written_order_is_execution_order(rg: Redguard) {
    let runs = Arc::new(AtomicUsize::new(0));
    let first = rg
        .scope(submit(1, "r-1", "SK-1", runs.clone()))
        .await
        .unwrap();
    assert!(first.is_some(), "the body runs under the lock");

    // Hold the stock lock elsewhere: a replay must still answer, since it never takes it.
    let held = rg
        .lock("stock:SK-1")
        .scope(concat!(module_path!(), "::submit"))
        .acquire()
        .await
        .unwrap();
    let replay = rg
        .scope(submit(1, "r-1", "SK-1", runs.clone()))
        .await
        .unwrap();
    assert_eq!(replay, first, "the replay returns the first result");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Replays cost rate-limit points: 2 calls so far, the third is admitted, the fourth not.
    rg.scope(submit(1, "r-1", "SK-1", runs.clone()))
        .await
        .unwrap();
    let limited = rg.scope(submit(1, "r-1", "SK-1", runs.clone())).await;
    assert!(matches!(limited, Err(Error::RateLimited(_))), "{limited:?}");
    // A rate-limited call never reached the record or the body.
    let other_user = rg
        .scope(submit(2, "r-9", "SK-2", runs.clone()))
        .await
        .unwrap();
    assert!(other_user.is_some());
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // With the lock written first, even a replay waits for it.
    held.release().await.unwrap();
    rg.scope(lock_first("r-2", "SK-3")).await.unwrap();
    let held = rg
        .lock("stock:SK-3")
        .scope(concat!(module_path!(), "::lock_first"))
        .acquire()
        .await
        .unwrap();
    let blocked = rg.scope(lock_first("r-2", "SK-3")).await;
    assert!(
        matches!(blocked, Err(Error::LockTimeout { .. })),
        "{blocked:?}"
    );
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory() {
    written_order_is_execution_order(Redguard::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis() {
    let server = redguard_tests::RedisServer::start();
    written_order_is_execution_order(redguard_tests::connect(&server).await).await;
    server.assert_every_key_has_ttl();
}
