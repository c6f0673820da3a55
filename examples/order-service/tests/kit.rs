//! The service's guarded writes under `redguard::testing`'s faults: the guards as
//! `src/orders.rs` stacks them over the service's own database (`Db`), so the backstops they
//! rely on (the stock's fence in `redguard_fences`, the ledger's unique payment id) are what
//! is tested. The
//! service never charges twice, never oversells, and a handler that captures a payment before
//! recording it is caught.

use std::path::PathBuf;
use std::time::Duration;

use order_service::db::{Tx, begin_immediate, place_order};
use order_service::{Db, Payment};
use redguard::clock::ManualClock;
use redguard::testing::{At, Explore, Fault, Faults, History, Point};
use redguard::{Redguard, dist_lock, idempotent};
use tokio::sync::oneshot;
use tokio::time::Instant;

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

/// A database with `sku` in stock and one order of it (order id 1, total 100) for user 1.
async fn shop(dir: &tempfile::TempDir, stock: u32) -> (Db, PathBuf) {
    let path = dir.path().join("orders.db");
    let db = Db::open(&path).await.expect("database");
    db.set_stock(deadline(), "sku-1".into(), stock, 100)
        .await
        .expect("stock");
    (db, path)
}

/// Places user 1's order of one `sku-1` under `key`, as the stock section writes it.
async fn place(db: &Db, key: &str, fence: u64) -> i64 {
    let mut writer = db.writer(deadline()).await.expect("writer");
    let mut tx = begin_immediate(&mut writer).await.expect("begin");
    let order = place_order(&mut tx, 1, key, "sku-1", 1, fence)
        .await
        .expect("order");
    tx.commit().await.expect("commit");
    order.order_id
}

async fn paid_order(db: &Db) -> i64 {
    place(db, "k-1", 1).await
}

/// The payment callback as the service handles it, with a capture at the provider: the
/// ledger first (its unique payment id claims the payment and marks the order paid), the
/// capture only when this delivery is the one that paid the order.
#[idempotent(key = "capture:{payment_id}", expire = "1h")]
async fn record_then_capture(
    db: &Db,
    provider: &History,
    payment_id: &str,
    order_id: i64,
) -> redguard::Result<()> {
    let unpaid = order_status(db, order_id).await? == "created";
    let applied = db
        .record_payment(deadline(), payment_id.to_owned(), order_id, 100)
        .await
        .map_err(db_error)?;
    if unpaid && applied == Payment::Applied {
        provider.effect(payment_id);
    }
    Ok(())
}

async fn order_status(db: &Db, order_id: i64) -> redguard::Result<String> {
    let order = db.order(deadline(), order_id).await.map_err(db_error)?;
    Ok(order.map(|order| order.status).unwrap_or_default())
}

fn db_error(err: order_service::DbError) -> redguard::Error {
    redguard::Error::Config(err.to_string())
}

/// The deliberately broken handler: it captures (acks to the provider) before the outcome is
/// recorded, so a redelivery the idempotency record no longer stops captures again, even
/// though the ledger refuses the second record.
#[idempotent(key = "capture:{payment_id}", expire = "1h")]
async fn capture_then_record(
    db: &Db,
    provider: &History,
    payment_id: &str,
    order_id: i64,
) -> redguard::Result<()> {
    provider.effect(payment_id);
    db.record_payment(deadline(), payment_id.to_owned(), order_id, 100)
        .await
        .map_err(db_error)?;
    Ok(())
}

/// The provider's callback delivered three times; the first outcome recorded is lost in a
/// failover (the record acknowledged, then gone), so the second delivery runs the body again.
async fn deliver_three_times(broken: bool) -> History {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, _) = shop(&dir, 5).await;
    let order_id = paid_order(&db).await;
    let provider = History::new();
    let faults = Faults::new().inject(At::point(Point::IdemFinish).nth(1), Fault::LoseWrite);
    let rg = redguard::testing::faulty(&Redguard::memory(), faults.clone());
    rg.scope(async {
        for _ in 0..3 {
            let delivered = if broken {
                capture_then_record(&db, &provider, "pay-1", order_id).await
            } else {
                record_then_capture(&db, &provider, "pay-1", order_id).await
            };
            delivered.expect("delivered");
        }
    })
    .await;
    assert_eq!(faults.injected().len(), 1, "the record was lost once");
    provider
}

#[tokio::test]
async fn a_payment_is_captured_once_when_its_record_is_lost() {
    deliver_three_times(false).await.assert_never_twice();
}

#[tokio::test]
async fn capturing_before_recording_is_caught() {
    let provider = deliver_three_times(true).await;
    let twice = provider.check_never_twice().expect_err("captured twice");
    assert_eq!(twice.calls.len(), 2, "{twice}");
}

/// The stock section as the service writes it (`write_stock`): under the lock,
/// `begin_fenced` then the conditional decrement, in one transaction begun inside the lock,
/// as the service's is (`reserve_stock`): a holder stalled past its lease begins its write
/// only after the next holder's committed, and its older fence is refused.
#[dist_lock(key = "stock:{sku}", wait = "300ms", lease = "10s")]
async fn reserve(
    db: &Db,
    writes: &History,
    sku: &str,
    user: u64,
    stalled: Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>,
) -> redguard::Result<bool> {
    let fence = redguard::lock::fence().expect("inside the lock");
    if let Some((holding, resume)) = stalled {
        let _ = holding.send(());
        let _ = resume.await; // a pause past the lock's (early) expiry
    }
    let mut writer = db.writer(deadline()).await.map_err(db_error)?;
    let mut tx = begin_immediate(&mut writer).await.map_err(db_error)?;
    if let Err(lost) = fenced_write(&mut tx, sku, user, fence).await {
        assert!(matches!(lost, redguard::Error::LockLost { .. }), "{lost}");
        return Ok(false);
    }
    tx.commit().await.map_err(|err| db_error(err.into()))?;
    writes
        .held(sku, fence, async { Ok::<_, redguard::Error>(()) })
        .await?;
    Ok(true)
}

async fn fenced_write(tx: &mut Tx<'_>, sku: &str, user: u64, fence: u64) -> redguard::Result<()> {
    let mut fenced =
        redguard::lock::begin_fenced(&mut **tx, &format!("stock:{sku}"), fence).await?;
    place_order(&mut fenced, user, &format!("k-{user}"), sku, 1, fence)
        .await
        .map_err(|err| redguard::Error::Config(format!("{err:?}")))?;
    fenced.commit().await
}

/// The first buyer's lock expires early while it is stalled; the second takes the lock and
/// buys. The first's write comes late with the older fence and `begin_fenced` refuses it
/// (`LockLost`, rolled back): the stock and the writes' fences stay right.
#[tokio::test]
async fn stock_is_not_oversold_when_a_lock_expires_early() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, _) = shop(&dir, 2).await;
    let clock = ManualClock::new();
    let faults = Faults::new().inject(
        At::point(Point::LockAcquire).nth(1),
        Fault::ExpireEarly(Duration::from_secs(1)),
    );
    let rg = Redguard::memory_builder()
        .clock(clock.clone())
        .connect()
        .await
        .expect("memory handle");
    let rg = redguard::testing::faulty(&rg, faults.clone());
    let writes = History::new();
    let (holding, held) = oneshot::channel();
    let (resume, stalled) = oneshot::channel();
    let (first, second) = rg
        .scope(async {
            let first = reserve(&db, &writes, "sku-1", 1, Some((holding, stalled)));
            let second = async {
                let _ = held.await; // the first holds the lock now
                clock.advance(Duration::from_secs(2));
                let bought = reserve(&db, &writes, "sku-1", 2, None).await;
                let _ = resume.send(());
                bought
            };
            tokio::join!(first, second)
        })
        .await;
    assert_eq!(faults.injected().len(), 1);
    assert!(
        second.expect("second buyer"),
        "the second buyer holds the lock"
    );
    assert!(
        !first.unwrap_or(false),
        "the stale holder's write was refused"
    );
    let (available, _) = db
        .stock(deadline(), "sku-1".into())
        .await
        .expect("stock")
        .expect("sku");
    assert_eq!(available, 1);
    writes.assert_fences_increase();
}

/// The payment path across seeded fault schedules: never captured twice.
#[tokio::test]
async fn payments_survive_explored_faults() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (db, _) = shop(&dir, 100).await;
    let mut payments = 0u32;
    let explored = Explore::new()
        .runs(40)
        .probability(0.3)
        .run(async |trial| {
            payments += 1;
            let order_id = place(&db, &format!("e-{payments}"), u64::from(payments) + 1).await;
            let payment = format!("pay-{payments}");
            trial
                .rg
                .scope(async {
                    for _ in 0..3 {
                        let _ = record_then_capture(&db, &trial.history, &payment, order_id).await;
                        trial.advance(Duration::from_millis(20)).await;
                    }
                })
                .await;
        })
        .await;
    assert_eq!(explored.runs, 40);
}
