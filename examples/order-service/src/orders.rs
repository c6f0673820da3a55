//! The guarded business operations. Each guard sits on the smallest fn that needs it: rate
//! limits and idempotency on the submission, the lock on the stock section only.

use std::sync::Arc;

use redguard::{dist_lock, idempotent, rate_limit};
use serde::{Deserialize, Serialize};

use crate::db::{Db, PlaceError};
use crate::error::ApiError;

/// What handlers share.
#[derive(Debug)]
pub struct App {
    pub db: Db,
    pub config: crate::Config,
    pub store: &'static str,
}

/// `POST /orders` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderRequest {
    pub sku: String,
    pub qty: u32,
}

/// `201` body of `POST /orders`; replays return it unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placed {
    pub order_id: i64,
    pub user_id: u64,
    pub sku: String,
    pub qty: u32,
    pub fence: u64,
}

/// One order per (user, Idempotency-Key). The API-wide limit is checked first, then the
/// user's: a request refused by either is charged to neither. A replay costs a rate-limit
/// point (a retry storm is load too) but never takes the stock lock.
#[rate_limit(key = "order:submit", rate = app.config.api_rate.as_str(), burst = app.config.api_burst())]
#[rate_limit(key = "order:submit:user:{user_id}", rate = app.config.user_rate.as_str(), burst = app.config.user_burst)]
#[idempotent(key = "{user_id}:{idem_key}", expire = "10m", payload = req)]
pub async fn submit_order(
    app: &App,
    user_id: u64,
    idem_key: &str,
    req: OrderRequest,
) -> Result<Placed, ApiError> {
    reserve_stock(app, &req.sku, req.qty, user_id, idem_key).await
}

/// The critical section: decrement stock and record the order. The lock keeps concurrent
/// buyers of one SKU off the database; the conditional UPDATE and the fencing token make an
/// oversell impossible even if the lock were lost.
#[dist_lock(key = "stock:{sku}", wait = "300ms", lease = "10s")]
async fn reserve_stock(
    app: &App,
    sku: &str,
    qty: u32,
    user_id: u64,
    idem_key: &str,
) -> Result<Placed, ApiError> {
    let fence = redguard::fence().unwrap_or(0);
    let placed = app
        .db
        .place_order(user_id, idem_key.to_owned(), sku.to_owned(), qty, fence)
        .await;
    match placed {
        Ok(order) | Err(PlaceError::Duplicate(order)) => Ok(Placed {
            order_id: order.order_id,
            user_id: order.user_id,
            sku: order.sku,
            qty: order.qty,
            fence: order.fence,
        }),
        Err(PlaceError::OutOfStock) => Err(ApiError::OutOfStock),
        Err(PlaceError::StaleFence) => Err(ApiError::Guard(redguard::Error::LockLost {
            key: format!("stock:{sku}"),
        })),
        Err(PlaceError::Sql(err)) => Err(err.into()),
    }
}

/// `POST /payments/callback` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PaymentCallback {
    pub payment_id: String,
    pub order_id: i64,
    pub amount: u64,
}

/// `200` body of a payment callback.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Paid {
    pub order_id: i64,
    pub status: String,
}

/// Payment providers retry callbacks; each payment is recorded once, and every retry gets the
/// same answer. The ledger's unique payment id is the backstop.
#[idempotent(key = "payment:{payment_id}", expire = "1d", payload = callback)]
pub async fn payment_callback(
    app: &App,
    payment_id: &str,
    callback: PaymentCallback,
) -> Result<Paid, ApiError> {
    let found = app
        .db
        .record_payment(payment_id.to_owned(), callback.order_id, callback.amount)
        .await?;
    if !found {
        return Err(ApiError::NotFound);
    }
    Ok(Paid {
        order_id: callback.order_id,
        status: "paid".to_owned(),
    })
}

/// Shared state as handlers hold it.
pub(crate) type Shared = Arc<App>;
