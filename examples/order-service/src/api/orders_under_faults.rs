//! `POST /orders` when Redis loses the outcome of an order that committed: the order's
//! outcome row, committed in its transaction (`Idempotency::transaction`), answers the retry.

use std::time::Duration;

use axum::body::to_bytes;
use axum::http::StatusCode;
use redguard::Redguard;
use redguard::testing::{At, Fault, Faults, Point};
use tokio::time::Instant;
use tower::ServiceExt as _;

use super::limits_under_faults::{order, service};
use crate::Db;

/// The order commits, then recording its SUCCESS in Redis fails (an error reply, or a stall
/// past the handle's timeout), so Redis keeps the record PROCESSING. The retry is answered at
/// once, as a replay of the same order, from the outcome row: before the outcome was in the
/// transaction it was `409 in_progress` until the record expired.
#[tokio::test]
async fn an_order_whose_success_redis_lost_is_replayed_at_once() {
    for fault in [Fault::Fail, Fault::Stall(Duration::from_secs(5))] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (router, _) = service(&dir).await;
        let faults = Faults::new().inject(At::point(Point::IdemFinish).nth(1), fault);
        let rg = redguard::testing::faulty(&Redguard::memory(), faults.clone());
        let (first, retry) = rg
            .scope(async {
                let first = router.clone().oneshot(order(1)).await.expect("infallible");
                let retry = router.clone().oneshot(order(1)).await.expect("infallible");
                (first, retry)
            })
            .await;
        assert_eq!(faults.injected().len(), 1, "{fault:?}");
        assert_eq!(first.status(), StatusCode::CREATED, "{fault:?}");
        assert_eq!(retry.status(), StatusCode::CREATED, "{fault:?}: the retry");
        assert_eq!(retry.headers()["idempotent-replayed"], "true", "{fault:?}");
        let body = |response: axum::response::Response| to_bytes(response.into_body(), 1 << 16);
        assert_eq!(
            body(first).await.expect("body"),
            body(retry).await.expect("body"),
            "{fault:?}"
        );
        let db = Db::open(&dir.path().join("orders.db")).await.expect("db");
        let deadline = Instant::now() + Duration::from_secs(5);
        let orders = db.orders_of(deadline, 7).await.expect("orders");
        assert_eq!(orders.len(), 1, "{fault:?}");
        let (available, _) = db
            .stock(deadline, "SK-1".into())
            .await
            .expect("stock")
            .expect("sku");
        assert_eq!(available, 100_000 - 1, "{fault:?}");
    }
}
