//! The database: the last line of defence. The guards keep duplicate and concurrent work away
//! from it; its constraints (a conditional stock decrement, a unique index per intent, a unique
//! payment id) make a slip impossible rather than unlikely.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::Serialize;

/// A connection shared by this instance's handlers. SQLite serialises writers anyway; several
/// instances share the file through WAL and a busy timeout.
#[derive(Debug, Clone)]
pub struct Db {
    conn: Arc<Mutex<Connection>>,
}

/// An order as stored.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Order {
    pub order_id: i64,
    pub user_id: u64,
    pub sku: String,
    pub qty: u32,
    /// `qty` × the SKU's price when ordered, in minor units: what a payment must be.
    pub total: u64,
    pub status: String,
    pub idempotency_key: String,
    pub fence: u64,
}

/// Why an order was not placed.
#[derive(Debug)]
pub enum PlaceError {
    OutOfStock,
    /// A holder with a newer fencing token already wrote: this one's lock had expired.
    StaleFence,
    /// The unique index found this intent's order (its idempotency record had expired).
    Duplicate(Order),
    /// The unique index found another order under this user's key.
    KeyReuse,
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for PlaceError {
    fn from(err: rusqlite::Error) -> Self {
        PlaceError::Sql(err)
    }
}

/// How a payment callback ended in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payment {
    /// Recorded; the order is paid.
    Applied,
    /// Recorded as owed back: the order was closed (or paid) before this payment arrived.
    RefundDue,
    /// The payment id is recorded for another order or amount.
    Conflict,
    /// The amount is not the order's total; nothing recorded.
    AmountMismatch,
    /// No such order; nothing recorded.
    NoOrder,
}

/// User ids are validated to fit SQLite's signed 64-bit integers at the API.
fn sql_id(id: u64) -> i64 {
    i64::try_from(id).unwrap_or(i64::MAX)
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Db {
    pub fn open(path: &Path) -> rusqlite::Result<Db> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS stock (
                 sku TEXT PRIMARY KEY,
                 available INTEGER NOT NULL CHECK (available >= 0),
                 price INTEGER NOT NULL CHECK (price >= 0),
                 fence INTEGER NOT NULL DEFAULT 0
             );
             CREATE TABLE IF NOT EXISTS orders (
                 order_id INTEGER PRIMARY KEY AUTOINCREMENT,
                 user_id INTEGER NOT NULL,
                 idempotency_key TEXT NOT NULL,
                 sku TEXT NOT NULL,
                 qty INTEGER NOT NULL,
                 total INTEGER NOT NULL,
                 status TEXT NOT NULL,
                 fence INTEGER NOT NULL,
                 created_ms INTEGER NOT NULL,
                 UNIQUE (user_id, idempotency_key)
             );
             CREATE TABLE IF NOT EXISTS ledger (
                 payment_id TEXT PRIMARY KEY,
                 order_id INTEGER NOT NULL,
                 amount INTEGER NOT NULL,
                 -- 'applied', or 'refund_due': money for an order that was closed or paid.
                 status TEXT NOT NULL,
                 created_ms INTEGER NOT NULL
             );
             CREATE TABLE IF NOT EXISTS job_runs (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 instance TEXT NOT NULL,
                 started_ms INTEGER NOT NULL,
                 ended_ms INTEGER NOT NULL,
                 fence INTEGER NOT NULL,
                 closed INTEGER NOT NULL
             );",
        )?;
        Ok(Db {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` on the connection off the async runtime.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> T + Send + 'static,
    ) -> T {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut conn)
        })
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))
    }

    pub async fn set_stock(&self, sku: String, available: u32, price: u32) -> rusqlite::Result<()> {
        self.with(move |conn| {
            conn.execute(
                "INSERT INTO stock (sku, available, price) VALUES (?1, ?2, ?3)
                 ON CONFLICT (sku) DO UPDATE SET available = excluded.available, price = excluded.price",
                params![sku, available, price],
            )
            .map(drop)
        })
        .await
    }

    /// Units available and the price of `sku`, if it is sold here.
    pub async fn stock(&self, sku: String) -> rusqlite::Result<Option<(i64, i64)>> {
        self.with(move |conn| {
            conn.query_row(
                "SELECT available, price FROM stock WHERE sku = ?1",
                [sku],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
        })
        .await
    }

    /// Decrements stock and records the order in one transaction. The decrement is
    /// conditional on enough stock *and* on `fence` being newer than the last writer's. An
    /// order already under (user, key) is this intent's when its SKU and quantity match.
    pub async fn place_order(
        &self,
        user_id: u64,
        key: String,
        sku: String,
        qty: u32,
        fence: u64,
    ) -> Result<Order, PlaceError> {
        self.with(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let existing = find_by_key(&tx, user_id, &key)?;
            if let Some(order) = existing {
                return Err(if (order.sku.as_str(), order.qty) == (sku.as_str(), qty) {
                    PlaceError::Duplicate(order)
                } else {
                    PlaceError::KeyReuse
                });
            }
            let fence_sql = i64::try_from(fence).unwrap_or(i64::MAX);
            let updated = tx.execute(
                "UPDATE stock SET available = available - ?1, fence = ?2
                 WHERE sku = ?3 AND available >= ?1 AND fence < ?2",
                params![qty, fence_sql, sku],
            )?;
            if updated == 0 {
                let last: Option<i64> = tx
                    .query_row("SELECT fence FROM stock WHERE sku = ?1", [&sku], |r| {
                        r.get(0)
                    })
                    .optional()?;
                return Err(match last {
                    Some(last) if last >= fence_sql => PlaceError::StaleFence,
                    _ => PlaceError::OutOfStock,
                });
            }
            let price: i64 =
                tx.query_row("SELECT price FROM stock WHERE sku = ?1", [&sku], |r| r.get(0))?;
            let total = price * i64::from(qty);
            tx.execute(
                "INSERT INTO orders (user_id, idempotency_key, sku, qty, total, status, fence, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'created', ?6, ?7)",
                params![sql_id(user_id), key, sku, qty, total, fence_sql, now_ms()],
            )?;
            let order_id = tx.last_insert_rowid();
            tx.commit()?;
            Ok(Order {
                order_id,
                user_id,
                sku,
                qty,
                total: u64::try_from(total).unwrap_or(0),
                status: "created".to_owned(),
                idempotency_key: key,
                fence,
            })
        })
        .await
    }

    pub async fn order(&self, order_id: i64) -> rusqlite::Result<Option<Order>> {
        self.with(move |conn| {
            conn.query_row(
                &format!("{SELECT_ORDER} WHERE order_id = ?1"),
                [order_id],
                order_row,
            )
            .optional()
        })
        .await
    }

    pub async fn orders_of(&self, user_id: u64) -> rusqlite::Result<Vec<Order>> {
        self.with(move |conn| {
            let mut stmt = conn.prepare(&format!(
                "{SELECT_ORDER} WHERE user_id = ?1 ORDER BY order_id"
            ))?;
            stmt.query_map([sql_id(user_id)], order_row)?.collect()
        })
        .await
    }

    /// Applies a payment once per `payment_id`. A payment id already in the ledger gets the
    /// answer it got then, or `Conflict` when it now names another order or amount.
    pub async fn record_payment(
        &self,
        payment_id: String,
        order_id: i64,
        amount: u64,
    ) -> rusqlite::Result<Payment> {
        self.with(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let recorded: Option<(i64, i64, String)> = tx
                .query_row(
                    "SELECT order_id, amount, status FROM ledger WHERE payment_id = ?1",
                    [&payment_id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            if let Some((recorded_order, recorded_amount, status)) = recorded {
                let same =
                    recorded_order == order_id && u64::try_from(recorded_amount) == Ok(amount);
                return Ok(match (same, status.as_str()) {
                    (false, _) => Payment::Conflict,
                    (true, "applied") => Payment::Applied,
                    (true, _) => Payment::RefundDue,
                });
            }
            let order: Option<(i64, String)> = tx
                .query_row(
                    "SELECT total, status FROM orders WHERE order_id = ?1",
                    [order_id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((total, status)) = order else {
                return Ok(Payment::NoOrder);
            };
            // Compared as u64: an amount beyond i64 is a mismatch, never a truncated match.
            if u64::try_from(total) != Ok(amount) {
                return Ok(Payment::AmountMismatch);
            }
            let applies = status == "created";
            tx.execute(
                "INSERT INTO ledger (payment_id, order_id, amount, status, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    payment_id,
                    order_id,
                    total,
                    if applies { "applied" } else { "refund_due" },
                    now_ms()
                ],
            )?;
            if applies {
                tx.execute(
                    "UPDATE orders SET status = 'paid' WHERE order_id = ?1",
                    [order_id],
                )?;
            }
            tx.commit()?;
            Ok(if applies {
                Payment::Applied
            } else {
                Payment::RefundDue
            })
        })
        .await
    }

    /// Closes unpaid orders created before `older_than_ms` and gives their stock back.
    pub async fn close_unpaid(&self, older_than_ms: i64) -> rusqlite::Result<usize> {
        self.with(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let stale: Vec<(i64, String, i64)> = {
                let mut stmt = tx.prepare(
                    "SELECT order_id, sku, qty FROM orders WHERE status = 'created' AND created_ms < ?1",
                )?;
                stmt.query_map([older_than_ms], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<rusqlite::Result<_>>()?
            };
            for (order_id, sku, qty) in &stale {
                tx.execute("UPDATE orders SET status = 'closed' WHERE order_id = ?1", [order_id])?;
                tx.execute(
                    "UPDATE stock SET available = available + ?1 WHERE sku = ?2",
                    params![qty, sku],
                )?;
            }
            tx.commit()?;
            Ok(stale.len())
        })
        .await
    }

    pub async fn record_job_run(
        &self,
        instance: String,
        started_ms: i64,
        ended_ms: i64,
        fence: u64,
        closed: usize,
    ) -> rusqlite::Result<()> {
        self.with(move |conn| {
            conn.execute(
                "INSERT INTO job_runs (instance, started_ms, ended_ms, fence, closed)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    instance,
                    started_ms,
                    ended_ms,
                    i64::try_from(fence).unwrap_or(i64::MAX),
                    i64::try_from(closed).unwrap_or(i64::MAX)
                ],
            )
            .map(drop)
        })
        .await
    }
}

const SELECT_ORDER: &str =
    "SELECT order_id, user_id, sku, qty, total, status, idempotency_key, fence FROM orders";

fn order_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Order> {
    Ok(Order {
        order_id: row.get(0)?,
        user_id: u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
        sku: row.get(2)?,
        qty: row.get(3)?,
        total: u64::try_from(row.get::<_, i64>(4)?).unwrap_or(0),
        status: row.get(5)?,
        idempotency_key: row.get(6)?,
        fence: u64::try_from(row.get::<_, i64>(7)?).unwrap_or(0),
    })
}

fn find_by_key(conn: &Connection, user_id: u64, key: &str) -> rusqlite::Result<Option<Order>> {
    conn.query_row(
        &format!("{SELECT_ORDER} WHERE user_id = ?1 AND idempotency_key = ?2"),
        params![sql_id(user_id), key],
        order_row,
    )
    .optional()
}
