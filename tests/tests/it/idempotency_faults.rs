//! Idempotency and tokens when Redis stalls: they refuse rather than let a duplicate through
//! (fail closed, the default), and a begin whose outcome is unknown does not strand the
//! intent once Redis answers again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redguard::{Error, Idempotency, KeyBuilder, Redguard};
use redguard_tests::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(100);

async fn connect(server: &RedisServer) -> Redguard {
    Redguard::redis(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .expect("connect to the test redis-server")
}

async fn place(rg: &Redguard, order: u64, runs: &Arc<AtomicUsize>) -> Result<u64, Error> {
    let key = KeyBuilder::new().part("order", &order).finish()?;
    let runs = runs.clone();
    rg.scope(
        Idempotency::new("orders", key)
            .expire(Duration::from_secs(600))
            .run(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(order)
            }),
    )
    .await
}

/// Waits until Redis has answered everything queued while it was stopped.
async fn settle(rg: &Redguard) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while redguard::__private::store::of(rg).time().await.is_err() {
        assert!(Instant::now() < deadline, "Redis did not come back");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_and_tokens_fail_closed_by_default() {
    let server = RedisServer::start();
    let rg = connect(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let token = rg
        .tokens()
        .issue("checkout", Duration::from_secs(60))
        .await
        .unwrap();
    server.pause();
    let refused = place(&rg, 1, &runs).await;
    assert!(matches!(refused, Err(Error::Backend(_))), "{refused:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body ran unprotected");
    let consumed = rg.tokens().consume("checkout", &token).await;
    assert!(matches!(consumed, Err(Error::Backend(_))), "{consumed:?}");
    server.resume();
    settle(&rg).await;
    // The token was not used by the refused call.
    rg.tokens().consume("checkout", &token).await.unwrap();
}

/// A begin that timed out ran when Redis resumed; it is undone, so the retry the 503 invites
/// runs at once instead of finding a PROCESSING record nobody will finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_that_timed_out_is_undone() {
    let server = RedisServer::start();
    let rg = connect(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    server.pause();
    let refused = place(&rg, 2, &runs).await;
    assert!(matches!(refused, Err(Error::Backend(_))), "{refused:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    settle(&rg).await;
    assert_eq!(place(&rg, 2, &runs).await.unwrap(), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    server.assert_every_key_has_ttl();
}

/// Same for a caller that gave up while the begin was in flight (its future dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_abandoned_in_flight_is_undone() {
    let server = RedisServer::start();
    let rg = Redguard::redis(server.url())
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    server.pause();
    let gave_up = tokio::time::timeout(Duration::from_millis(50), place(&rg, 3, &runs)).await;
    assert!(gave_up.is_err());
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.resume();
    settle(&rg).await;
    assert_eq!(place(&rg, 3, &runs).await.unwrap(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
