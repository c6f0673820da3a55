//! The guarded business operations. Each guard sits on the smallest fn that needs it: rate
//! limits and idempotency on the submission, the lock on the stock section only. Callers
//! authenticate and validate first: nothing reaches Redis before that.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use redguard::{dist_lock, idempotent, key::KeyBuilder};
use serde::{Deserialize, Serialize};
use tokio::sync::RwLock;
use tokio::time::Instant;

use crate::auth::Keys;
use crate::db::{Db, Payment, PlaceError};
use crate::error::ApiError;

/// What handlers share.
#[derive(Debug)]
pub struct App {
    pub db: Db,
    pub config: crate::Config,
    pub store: &'static str,
    pub instance: String,
    pub(crate) keys: Keys,
    /// Held (shared) by every order being written, detached bodies included: shutdown takes
    /// it exclusively, so it waits for them.
    pub(crate) writes: Arc<RwLock<()>>,
}

/// Shared state as handlers hold it.
pub(crate) type Shared = Arc<App>;

/// The scene idempotency tokens for orders are issued for.
pub(crate) const ORDER_SCENE: &str = "order-submit";

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
    pub total: u64,
    pub fence: u64,
    /// Found by the database's unique key (the idempotency record had expired) rather than
    /// placed now: answered as a replay. Not stored: a replay from the record is marked anyway.
    #[serde(skip)]
    pub(crate) from_database: bool,
}

/// One order per (user, `Idempotency-Key`); a replay never takes the stock lock. The body
/// runs detached: a client that disconnects mid-write does not strand its order, and its
/// retry gets it. (Rate limits: the route's layer, in front; see `api::router`.)
///
/// Not `IdempotencyLayer`: the layer decides a replay from its own record only and keys on
/// the header and the request bytes. This route also has an optional single-use token, to be
/// consumed only when the body runs (`Idempotency::token`), and a database backstop that
/// outlives the record: an order the unique index finds is answered as a replay
/// (`Placed::from_database`) or `422`, which the layer cannot see. The payload is the parsed
/// request, so a retry that formats its JSON differently is still the same intent. The
/// database's waits end at `deadline`, the request's.
pub(crate) async fn submit_order(
    app: &Shared,
    deadline: Instant,
    user_id: u64,
    idem_key: &str,
    token: Option<&str>,
    req: OrderRequest,
) -> Result<Placed, ApiError> {
    let key = KeyBuilder::new()
        .part("user_id", &user_id)
        .text(":")
        .part("idem_key", idem_key)
        .finish()?;
    let mut guard = redguard::idempotency(key)
        .scope("order-submit")
        .expire(Duration::from_secs(600))
        .payload(&req);
    if let Some(token) = token {
        guard = guard.token(ORDER_SCENE, token);
    }
    let (app, idem_key) = (app.clone(), idem_key.to_owned());
    let writing = app.writes.clone().read_owned().await;
    guard
        .detach()
        .run(async move {
            let placed = reserve_stock(&app, deadline, &req.sku, req.qty, user_id, &idem_key).await;
            drop(writing);
            placed
        })
        .await
}

/// The critical section: decrement stock and record the order. The lock keeps concurrent
/// buyers of one SKU off the database; the conditional UPDATE and the fencing token make an
/// oversell impossible even if the lock were lost. `REQUEST_DEADLINE_MS` is below the lease,
/// so the write never starts after the lock expired.
#[dist_lock(key = "stock:{sku}", wait = "300ms", lease = "10s")]
async fn reserve_stock(
    app: &App,
    deadline: Instant,
    sku: &str,
    qty: u32,
    user_id: u64,
    idem_key: &str,
) -> Result<Placed, ApiError> {
    let fence = redguard::lock::fence().unwrap_or(0);
    let placed = app
        .db
        .place_order(
            deadline,
            user_id,
            idem_key.to_owned(),
            sku.to_owned(),
            qty,
            fence,
        )
        .await;
    let (order, from_database) = match placed {
        Ok(order) => (order, false),
        Err(PlaceError::Duplicate(order)) => (order, true),
        Err(PlaceError::KeyReuse) => return Err(redguard::Error::KeyReuse.into()),
        Err(PlaceError::OutOfStock) => return Err(ApiError::OutOfStock),
        Err(PlaceError::StaleFence) => {
            return Err(ApiError::Guard(redguard::Error::LockLost {
                key: format!("stock:{sku}"),
            }));
        }
        Err(PlaceError::Db(err)) => return Err(err.into()),
    };
    Ok(Placed {
        order_id: order.order_id,
        user_id: order.user_id,
        sku: order.sku,
        qty: order.qty,
        total: order.total,
        fence: order.fence,
        from_database,
    })
}

/// Idempotency tokens for the order form (limited per user and API-wide by the route's layer).
pub(crate) async fn issue_token() -> Result<String, ApiError> {
    Ok(redguard::tokens()
        .issue(ORDER_SCENE, Duration::from_secs(600))
        .await?)
}

/// `POST /payments/callback` body (after its signature is checked). `amount` in minor units,
/// a JSON integer that fits u64: anything else is refused, never rounded or truncated.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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

/// Payment providers retry callbacks; each payment is applied once, and every retry gets the
/// same answer. The guard keeps concurrent deliveries apart for an hour; the ledger's unique
/// payment id answers for good (and refuses the id for another order).
#[idempotent(key = "payment:{payment_id}", expire = "1h", payload = callback)]
pub(crate) async fn payment_callback(
    app: &App,
    deadline: Instant,
    payment_id: &str,
    callback: PaymentCallback,
) -> Result<Paid, ApiError> {
    let refund = "the order was closed or already paid before this payment arrived; the payment \
                  is recorded as refund_due and will be refunded";
    let outcome = app
        .db
        .record_payment(
            deadline,
            payment_id.to_owned(),
            callback.order_id,
            callback.amount,
        )
        .await?;
    match outcome {
        Payment::Applied => Ok(Paid {
            order_id: callback.order_id,
            status: "paid".to_owned(),
        }),
        Payment::RefundDue => Err(ApiError::Payment(
            StatusCode::CONFLICT,
            "order_closed",
            refund,
        )),
        Payment::Conflict => Err(ApiError::Payment(
            StatusCode::CONFLICT,
            "payment_conflict",
            "this payment id is recorded for another order or amount",
        )),
        Payment::AmountMismatch => Err(ApiError::Payment(
            StatusCode::UNPROCESSABLE_ENTITY,
            "amount_mismatch",
            "the amount is not the order's total",
        )),
        Payment::NoOrder => Err(ApiError::NotFound),
    }
}
