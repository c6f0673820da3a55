//! The guarded business operations. Each guard sits on the smallest fn that needs it: rate
//! limits and idempotency on the submission, the stock lock on the order's write (taken
//! before the database's writer). Callers authenticate and validate first: nothing reaches
//! Redis before that.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use redguard::idempotency::track_replay;
use redguard::{dist_lock, idempotent, key::KeyBuilder};
use serde::{Deserialize, Serialize};
use tokio::sync::RwLock;
use tokio::time::Instant;

use crate::auth::Keys;
use crate::db::{self, Db, Order, Payment, PlaceError, Tx};
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
    /// Answered from a stored outcome (Redis's record, redguard's outcome row, or the order
    /// the unique (user, key) finds) rather than placed now: `Idempotent-Replayed: true`. Not
    /// stored: a replay from a record is marked anyway.
    #[serde(skip)]
    pub(crate) replayed: bool,
}

/// One order per (user, `Idempotency-Key`), placed under its SKU's lock (`reserve_stock`).
///
/// The outcome commits in the order's own SQLite transaction (`Idempotency::transaction`):
/// the stock decrement, the order row and redguard's outcome row commit together, or none of
/// them. So a retry is answered from the database whatever Redis lost: an order whose SUCCESS
/// never reached Redis (a stall, a failover, a crash right after the commit) is replayed at
/// once instead of `409 in_progress` until the record expires, and one whose transaction
/// never committed runs again at once. Past the Redis record's 10 minutes the outcome row
/// answers, and past the row (the job purges expired rows) the orders table's unique
/// (user, key) still does (`place`): the same intent is a replay, another is `422`.
///
/// The whole of it runs in a task of its own, so a client that disconnects does not strand
/// its order: its retry gets it. Not `Idempotency::detach`, which has no transactional form:
/// the transaction is taken from the instance's writer and must live in the task that runs
/// the guard. The task begins the guard as well (`detach` begins in the caller's future), so
/// a client that leaves at any point after its request was admitted gets its order placed.
///
/// Not `IdempotencyLayer`: the layer decides a replay from its own record only and keys on
/// the header and the request bytes; this route's record lives in the database too, and its
/// optional single-use token is consumed only when the order is placed (`place`). The payload
/// is the parsed request, so a retry that formats its JSON differently is still the same
/// intent. The database's waits end at `deadline`, the request's.
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
    let guard = redguard::idempotency(key)
        .scope("order-submit")
        .expire(Duration::from_secs(600))
        .payload(&req);
    let handle = redguard::Redguard::current()?;
    let (app, idem_key, token) = (app.clone(), idem_key.to_owned(), token.map(str::to_owned));
    let writing = app.writes.clone().read_owned().await;
    let order = async move {
        let placed = reserve_stock(
            &app,
            deadline,
            guard,
            user_id,
            &idem_key,
            token.as_deref(),
            &req,
        )
        .await;
        drop(writing);
        placed
    };
    let task = tokio::spawn(handle.scope(track_replay(order)));
    let (placed, replayed) = match task.await {
        Ok(done) => done,
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        Err(_) => return Err(redguard::Error::Cancelled.into()),
    };
    let mut placed = placed?;
    placed.replayed |= replayed;
    Ok(placed)
}

/// The order under its SKU's lock: the lock first, then the instance's single writer (and
/// SQLite's write lock), then the idempotent outcome in that writer's transaction. The lock
/// keeps concurrent buyers of one SKU apart; the fence (`write_stock`) makes an oversell
/// impossible even if the lock were lost.
///
/// Lock first, writer after: an order that waits for the database (another connection holds
/// SQLite's lock) keeps only its own SKU waiting. A buyer of that SKU is answered `503 busy`
/// at the lock's 300 ms wait, and one of another SKU takes its own lock and waits for the
/// writer, up to its deadline, behind no lock wait. Taken the other way round, the writer
/// held through a lock wait stalled every order of the instance behind one contended SKU.
///
/// The transaction is taken before redguard knows whether the body runs, so a retry of an
/// order takes the SKU's lock and the writer too: a replay waits behind a buyer of its SKU
/// (at most the lock's wait, then `503 busy`, its retry replayed) and holds the writer for
/// the Redis round trip that finds the record, then rolls back. SQLite has one writer at a
/// time anyway; on Postgres a pool of several connections makes that cost nothing.
///
/// The lock is released after redguard committed (or rolled back) the transaction, so two
/// holders' transactions never overlap; the fence row orders them anyway if a lease lapses.
#[dist_lock(key = "stock:{req.sku}", wait = "300ms", lease = "10s")]
async fn reserve_stock(
    app: &App,
    deadline: Instant,
    guard: redguard::idempotency::Idempotency,
    user_id: u64,
    idem_key: &str,
    token: Option<&str>,
    req: &OrderRequest,
) -> Result<Placed, ApiError> {
    // A lock that failed open has no fence: nothing orders this write, so it is refused.
    let fence = redguard::lock::fence().ok_or_else(|| redguard::Error::LockLost {
        key: format!("stock:{}", req.sku),
    })?;
    // BEGIN IMMEDIATE: the wait for SQLite's lock is ours, bounded by the deadline and
    // answered `503 busy`. A deferred transaction would meet it at redguard's claim of
    // the outcome row, which cannot tell a busy database from an execution in flight.
    let mut writer = app.db.writer(deadline).await?;
    let tx = db::begin_immediate(&mut writer).await?;
    guard
        .transaction(tx)
        .run(async |mut tx| {
            let placed = place(&mut tx, fence, user_id, idem_key, token, req).await;
            (tx, placed)
        })
        .await
}

/// The order's body, in its transaction. An order already under (user, key) is this intent's
/// when its SKU and quantity match: redguard's outcome row answers such a retry before the
/// body runs while the row lives, this check after it expired (rows are purged, orders are
/// kept). The token is consumed last, after everything that can refuse the order, because
/// nothing gives it back: a request refused with `409 out_of_stock` or `503 busy` keeps it,
/// and one the token refuses rolls back.
async fn place(
    tx: &mut Tx<'_>,
    fence: u64,
    user_id: u64,
    idem_key: &str,
    token: Option<&str>,
    req: &OrderRequest,
) -> Result<Placed, ApiError> {
    if let Some(order) = db::find_by_key(tx, user_id, idem_key).await? {
        if (order.sku.as_str(), order.qty) != (req.sku.as_str(), req.qty) {
            return Err(redguard::Error::KeyReuse.into());
        }
        return Ok(placed(order, true));
    }
    let order = write_stock(tx, fence, &req.sku, req.qty, user_id, idem_key).await?;
    if let Some(token) = token {
        redguard::tokens().consume(ORDER_SCENE, token).await?;
    }
    Ok(placed(order, false))
}

fn placed(order: Order, replayed: bool) -> Placed {
    Placed {
        order_id: order.order_id,
        user_id: order.user_id,
        sku: order.sku,
        qty: order.qty,
        total: order.total,
        fence: order.fence,
        replayed,
    }
}

/// The fenced write: decrement stock and record the order, committed only if `fence` is the
/// newest the SKU has seen. `begin_fenced` opens a savepoint of the order's transaction whose
/// first statement is the fence, so no stock write can come before it: holders lock the fence
/// row first and the stock row after, in one order. Earlier in the transaction is only
/// redguard's claim of this intent's own outcome row. On SQLite the transaction holds the
/// database's write lock from its BEGIN anyway; on a database with row locks (Postgres) the
/// fence row is what orders two holders' writes.
async fn write_stock(
    tx: &mut Tx<'_>,
    fence: u64,
    sku: &str,
    qty: u32,
    user_id: u64,
    idem_key: &str,
) -> Result<Order, ApiError> {
    let mut fenced =
        redguard::lock::begin_fenced(&mut **tx, &format!("stock:{sku}"), fence).await?;
    let order = match db::place_order(&mut fenced, user_id, idem_key, sku, qty, fence).await {
        Ok(order) => order,
        Err(PlaceError::OutOfStock) => return Err(ApiError::OutOfStock),
        Err(PlaceError::Db(err)) => return Err(err.into()),
    };
    fenced.commit().await?;
    Ok(order)
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
