//! The database: the last line of defence. The guards keep duplicate and concurrent work away
//! from it; its constraints (a conditional stock decrement, a unique index per intent, a unique
//! payment id) make a slip impossible rather than unlikely.
//!
//! Each call waits at most until its caller's deadline, first for a connection, then for
//! SQLite's lock; past it the call fails with [`DbError::Busy`] having written nothing. Reads
//! and writes have their own connections: in WAL mode a reader never waits behind a write, and
//! SQLite takes one writer at a time anyway, so an instance's writes queue for its one writer
//! connection in arrival order.

use std::path::Path;
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Read connections per instance. Reads are point lookups that hold a connection for
/// microseconds, never across an await: a few serve any number of requests.
const READERS: usize = 4;

/// This instance's connections to the database file; several instances share the file
/// through WAL.
#[derive(Debug, Clone)]
pub struct Db {
    writer: Arc<Pool>,
    readers: Arc<Pool>,
}

/// Why a database call failed.
#[derive(Debug)]
pub enum DbError {
    /// The deadline passed while the call waited for a connection or for SQLite's lock (held
    /// by another instance, the job, or any other process): nothing was written.
    Busy,
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for DbError {
    fn from(err: rusqlite::Error) -> Self {
        match err.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy) => DbError::Busy,
            _ => DbError::Sql(err),
        }
    }
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DbError::Busy => f.write_str("the database stayed busy until the deadline"),
            DbError::Sql(err) => err.fmt(f),
        }
    }
}

impl std::error::Error for DbError {}

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
    Db(DbError),
}

impl From<rusqlite::Error> for PlaceError {
    fn from(err: rusqlite::Error) -> Self {
        PlaceError::Db(err.into())
    }
}

impl From<DbError> for PlaceError {
    fn from(err: DbError) -> Self {
        PlaceError::Db(err)
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
    /// Opens (and if needed creates) the database: its writer, then its readers.
    pub fn open(path: &Path) -> rusqlite::Result<Db> {
        let writer = Connection::open(path)?;
        // At startup only: instances starting together wait their turn for the schema.
        writer.busy_timeout(Duration::from_secs(10))?;
        writer.pragma_update(None, "journal_mode", "WAL")?;
        writer.pragma_update(None, "synchronous", "NORMAL")?;
        writer.execute_batch(
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
        let readers = (0..READERS)
            .map(|_| {
                let reader = Connection::open(path)?;
                // A write through a reader would be a bug here: make it fail loudly.
                reader.pragma_update(None, "query_only", true)?;
                Ok(reader)
            })
            .collect::<rusqlite::Result<_>>()?;
        Ok(Db {
            writer: Pool::new(vec![writer]),
            readers: Pool::new(readers),
        })
    }

    /// Runs `f` on a reader, which never waits behind a write.
    async fn read<T: Send + 'static>(
        &self,
        deadline: Instant,
        f: impl FnOnce(&mut Connection) -> Result<T, DbError> + Send + 'static,
    ) -> Result<T, DbError> {
        self.readers.run(deadline, f).await
    }

    /// Runs `f` on the writer, after the instance's writes that came before it.
    async fn write<T, E>(
        &self,
        deadline: Instant,
        f: impl FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<DbError> + From<rusqlite::Error> + Send + 'static,
    {
        self.writer.run(deadline, f).await
    }

    pub async fn set_stock(
        &self,
        deadline: Instant,
        sku: String,
        available: u32,
        price: u32,
    ) -> Result<(), DbError> {
        self.write(deadline, move |conn| {
            conn.execute(
                "INSERT INTO stock (sku, available, price) VALUES (?1, ?2, ?3)
                 ON CONFLICT (sku) DO UPDATE SET available = excluded.available, price = excluded.price",
                params![sku, available, price],
            )?;
            Ok(())
        })
        .await
    }

    /// Units available and the price of `sku`, if it is sold here.
    pub async fn stock(
        &self,
        deadline: Instant,
        sku: String,
    ) -> Result<Option<(i64, i64)>, DbError> {
        self.read(deadline, move |conn| {
            let stock = conn
                .query_row(
                    "SELECT available, price FROM stock WHERE sku = ?1",
                    [sku],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            Ok(stock)
        })
        .await
    }

    /// Decrements stock and records the order in one transaction. The decrement is
    /// conditional on enough stock *and* on `fence` being newer than the last writer's. An
    /// order already under (user, key) is this intent's when its SKU and quantity match.
    pub async fn place_order(
        &self,
        deadline: Instant,
        user_id: u64,
        key: String,
        sku: String,
        qty: u32,
        fence: u64,
    ) -> Result<Order, PlaceError> {
        self.write(deadline, move |conn| {
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

    pub async fn order(&self, deadline: Instant, order_id: i64) -> Result<Option<Order>, DbError> {
        self.read(deadline, move |conn| {
            let order = conn
                .query_row(
                    &format!("{SELECT_ORDER} WHERE order_id = ?1"),
                    [order_id],
                    order_row,
                )
                .optional()?;
            Ok(order)
        })
        .await
    }

    pub async fn orders_of(&self, deadline: Instant, user_id: u64) -> Result<Vec<Order>, DbError> {
        self.read(deadline, move |conn| {
            let mut stmt = conn.prepare(&format!(
                "{SELECT_ORDER} WHERE user_id = ?1 ORDER BY order_id"
            ))?;
            let orders = stmt
                .query_map([sql_id(user_id)], order_row)?
                .collect::<rusqlite::Result<_>>()?;
            Ok(orders)
        })
        .await
    }

    /// Applies a payment once per `payment_id`. A payment id already in the ledger gets the
    /// answer it got then, or `Conflict` when it now names another order or amount.
    pub async fn record_payment(
        &self,
        deadline: Instant,
        payment_id: String,
        order_id: i64,
        amount: u64,
    ) -> Result<Payment, DbError> {
        self.write(deadline, move |conn| {
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
    pub async fn close_unpaid(
        &self,
        deadline: Instant,
        older_than_ms: i64,
    ) -> Result<usize, DbError> {
        self.write(deadline, move |conn| {
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
        deadline: Instant,
        instance: String,
        started_ms: i64,
        ended_ms: i64,
        fence: u64,
        closed: usize,
    ) -> Result<(), DbError> {
        self.write(deadline, move |conn| {
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
            )?;
            Ok(())
        })
        .await
    }
}

/// Connections handed out one caller each, in arrival order (tokio's semaphore is fair).
#[derive(Debug)]
struct Pool {
    conns: Vec<Mutex<Connection>>,
    /// One permit per connection not in use.
    free: Arc<Semaphore>,
}

impl Pool {
    fn new(conns: Vec<Connection>) -> Arc<Pool> {
        Arc::new(Pool {
            free: Arc::new(Semaphore::new(conns.len())),
            conns: conns.into_iter().map(Mutex::new).collect(),
        })
    }

    /// Runs `f` on a free connection, off the async runtime. Waiting for the connection and
    /// SQLite's own wait for its lock (the connection's busy timeout) both end at `deadline`.
    async fn run<T, E>(
        self: &Arc<Self>,
        deadline: Instant,
        f: impl FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<DbError> + From<rusqlite::Error> + Send + 'static,
    {
        let Ok(permit) = tokio::time::timeout_at(deadline, self.free.clone().acquire_owned()).await
        else {
            return Err(DbError::Busy.into());
        };
        let permit = permit.expect("the pool's semaphore is never closed");
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            // Declared first, dropped last: the connection is unlocked before its permit frees.
            let _permit = permit;
            let mut conn = pool
                .conns
                .iter()
                .find_map(|conn| match conn.try_lock() {
                    Ok(conn) => Some(conn),
                    // A panic mid-call rolled its transaction back: the connection is sound.
                    Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
                    Err(TryLockError::WouldBlock) => None,
                })
                .expect("a permit is a free connection");
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(DbError::Busy.into());
            }
            conn.busy_timeout(left)?;
            f(&mut conn)
        })
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))
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
