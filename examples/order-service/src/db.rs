//! The database: the last line of defence. The guards keep duplicate and concurrent work away
//! from it; its constraints (a conditional stock decrement, a unique index per intent, a unique
//! payment id) make a slip impossible rather than unlikely, and redguard's own tables
//! (`redguard_outcomes`, `redguard_fences`, from `redguard::idempotency::SQLITE_MIGRATION`)
//! hold each order's outcome and each SKU's newest fencing token in the order's transaction.
//!
//! SQLite through `sqlx`, so the example runs with no database server to install; `sqlx`
//! runs each connection on a thread of its own, so no SQLite call blocks the async runtime.
//! The same code runs on Postgres with `sqlx::Postgres` and its migration.
//!
//! Each call waits at most until its caller's deadline, first for a connection, then for
//! SQLite's lock (the connection's busy timeout, set to what is left); past it the call fails
//! with [`DbError::Busy`] having written nothing. Reads and writes have their own pools: in
//! WAL mode a reader never waits behind a write, and SQLite takes one writer at a time anyway,
//! so an instance's writes queue for its one writer connection in arrival order (the pool is
//! fair).

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Connection as _, Row as _, Sqlite};
use tokio::time::Instant;

/// Read connections per instance. Reads are point lookups that hold a connection for
/// microseconds: a few serve any number of requests.
const READERS: u32 = 4;

/// This instance's connections to the database file; several instances share the file
/// through WAL.
#[derive(Debug, Clone)]
pub struct Db {
    writer: SqlitePool,
    readers: SqlitePool,
}

/// A transaction on the writer connection, as an order runs in it.
pub type Tx<'c> = sqlx::Transaction<'c, Sqlite>;

/// The writer connection, held for one call (or one order's transaction).
pub type Writer = PoolConnection<Sqlite>;

/// Why a database call failed.
#[derive(Debug)]
pub enum DbError {
    /// The deadline passed while the call waited for a connection or for SQLite's lock (held
    /// by another instance, the job, or any other process): nothing was written.
    Busy,
    Sql(sqlx::Error),
}

impl From<sqlx::Error> for DbError {
    fn from(err: sqlx::Error) -> Self {
        // SQLITE_BUSY and SQLITE_LOCKED, with their extended codes: the busy timeout ran out.
        let busy = err
            .as_database_error()
            .and_then(|db| db.code())
            .and_then(|code| code.parse::<i32>().ok())
            .is_some_and(|code| matches!(code & 0xff, 5 | 6));
        if busy {
            DbError::Busy
        } else {
            DbError::Sql(err)
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
    Db(DbError),
}

impl From<DbError> for PlaceError {
    fn from(err: DbError) -> Self {
        PlaceError::Db(err)
    }
}

impl From<sqlx::Error> for PlaceError {
    fn from(err: sqlx::Error) -> Self {
        PlaceError::Db(err.into())
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

/// The service's tables. `orders` keeps its unique (user, key) for good: redguard's outcome
/// rows expire (and the job purges them), an order's key does not.
const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS stock (
        sku TEXT PRIMARY KEY,
        available INTEGER NOT NULL CHECK (available >= 0),
        price INTEGER NOT NULL CHECK (price >= 0)
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
    );";

impl Db {
    /// Opens (and if needed creates) the database and its tables, redguard's included: its
    /// writer, then its readers.
    pub async fn open(path: &Path) -> Result<Db, sqlx::Error> {
        let file = SqliteConnectOptions::new().filename(path);
        // A connection is never idle long enough to matter, nor stale (a file, not a server):
        // keep them, and skip the ping on each acquire.
        let pool = |size| {
            SqlitePoolOptions::new()
                .max_connections(size)
                .idle_timeout(None)
                .max_lifetime(None)
                .test_before_acquire(false)
                // Each call bounds its own wait (`Db::writer`, `Db::reader`).
                .acquire_timeout(Duration::from_secs(3600))
        };
        let writer = pool(1)
            .connect_with(
                file.clone()
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Normal)
                    // At startup only: instances starting together wait their turn for the
                    // schema. Each call sets its own.
                    .busy_timeout(Duration::from_secs(10)),
            )
            .await?;
        sqlx::raw_sql(SCHEMA).execute(&writer).await?;
        sqlx::raw_sql(redguard::idempotency::SQLITE_MIGRATION)
            .execute(&writer)
            .await?;
        // A write through a reader would be a bug here: make it fail loudly.
        let readers = pool(READERS)
            .connect_with(file.pragma("query_only", "ON"))
            .await?;
        Ok(Db { writer, readers })
    }

    /// The writer connection, after the instance's writes that came before it, with SQLite's
    /// busy timeout set to what is left of `deadline`.
    pub async fn writer(&self, deadline: Instant) -> Result<Writer, DbError> {
        connection(&self.writer, deadline).await
    }

    /// A reader, which never waits behind a write.
    async fn reader(&self, deadline: Instant) -> Result<PoolConnection<Sqlite>, DbError> {
        connection(&self.readers, deadline).await
    }

    pub async fn set_stock(
        &self,
        deadline: Instant,
        sku: String,
        available: u32,
        price: u32,
    ) -> Result<(), DbError> {
        let mut conn = self.writer(deadline).await?;
        sqlx::query(
            "INSERT INTO stock (sku, available, price) VALUES (?1, ?2, ?3)
             ON CONFLICT (sku) DO UPDATE SET available = excluded.available, price = excluded.price",
        )
        .bind(sku)
        .bind(available)
        .bind(price)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Units available and the price of `sku`, if it is sold here.
    pub async fn stock(
        &self,
        deadline: Instant,
        sku: String,
    ) -> Result<Option<(i64, i64)>, DbError> {
        let mut conn = self.reader(deadline).await?;
        let stock = sqlx::query_as("SELECT available, price FROM stock WHERE sku = ?1")
            .bind(sku)
            .fetch_optional(&mut *conn)
            .await?;
        Ok(stock)
    }

    pub async fn order(&self, deadline: Instant, order_id: i64) -> Result<Option<Order>, DbError> {
        let mut conn = self.reader(deadline).await?;
        let order = sqlx::query(AssertSqlSafe(format!("{SELECT_ORDER} WHERE order_id = ?1")))
            .bind(order_id)
            .fetch_optional(&mut *conn)
            .await?;
        Ok(order.as_ref().map(order_row).transpose()?)
    }

    pub async fn orders_of(&self, deadline: Instant, user_id: u64) -> Result<Vec<Order>, DbError> {
        let mut conn = self.reader(deadline).await?;
        let orders = sqlx::query(AssertSqlSafe(format!(
            "{SELECT_ORDER} WHERE user_id = ?1 ORDER BY order_id"
        )))
        .bind(sql_id(user_id))
        .fetch_all(&mut *conn)
        .await?;
        Ok(orders.iter().map(order_row).collect::<sqlx::Result<_>>()?)
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
        let mut conn = self.writer(deadline).await?;
        let mut tx = begin_immediate(&mut conn).await?;
        let recorded: Option<(i64, i64, String)> =
            sqlx::query_as("SELECT order_id, amount, status FROM ledger WHERE payment_id = ?1")
                .bind(&payment_id)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some((recorded_order, recorded_amount, status)) = recorded {
            let same = recorded_order == order_id && u64::try_from(recorded_amount) == Ok(amount);
            return Ok(match (same, status.as_str()) {
                (false, _) => Payment::Conflict,
                (true, "applied") => Payment::Applied,
                (true, _) => Payment::RefundDue,
            });
        }
        let order: Option<(i64, String)> =
            sqlx::query_as("SELECT total, status FROM orders WHERE order_id = ?1")
                .bind(order_id)
                .fetch_optional(&mut *tx)
                .await?;
        let Some((total, status)) = order else {
            return Ok(Payment::NoOrder);
        };
        // Compared as u64: an amount beyond i64 is a mismatch, never a truncated match.
        if u64::try_from(total) != Ok(amount) {
            return Ok(Payment::AmountMismatch);
        }
        let applies = status == "created";
        sqlx::query(
            "INSERT INTO ledger (payment_id, order_id, amount, status, created_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .bind(&payment_id)
        .bind(order_id)
        .bind(total)
        .bind(if applies { "applied" } else { "refund_due" })
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        if applies {
            sqlx::query("UPDATE orders SET status = 'paid' WHERE order_id = ?1")
                .bind(order_id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(if applies {
            Payment::Applied
        } else {
            Payment::RefundDue
        })
    }

    /// Closes unpaid orders created before `older_than_ms` and gives their stock back.
    pub async fn close_unpaid(
        &self,
        deadline: Instant,
        older_than_ms: i64,
    ) -> Result<usize, DbError> {
        let mut conn = self.writer(deadline).await?;
        let mut tx = begin_immediate(&mut conn).await?;
        let stale: Vec<(i64, String, i64)> = sqlx::query_as(
            "SELECT order_id, sku, qty FROM orders WHERE status = 'created' AND created_ms < ?1",
        )
        .bind(older_than_ms)
        .fetch_all(&mut *tx)
        .await?;
        for (order_id, sku, qty) in &stale {
            sqlx::query("UPDATE orders SET status = 'closed' WHERE order_id = ?1")
                .bind(order_id)
                .execute(&mut *tx)
                .await?;
            sqlx::query("UPDATE stock SET available = available + ?1 WHERE sku = ?2")
                .bind(qty)
                .bind(sku)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(stale.len())
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
        let mut conn = self.writer(deadline).await?;
        sqlx::query(
            "INSERT INTO job_runs (instance, started_ms, ended_ms, fence, closed)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .bind(instance)
        .bind(started_ms)
        .bind(ended_ms)
        .bind(i64::try_from(fence).unwrap_or(i64::MAX))
        .bind(i64::try_from(closed).unwrap_or(i64::MAX))
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}

/// A connection of `pool` by `deadline`, its busy timeout set to what is left then: waiting
/// for the connection and SQLite's own wait for its lock both end at `deadline`.
async fn connection(
    pool: &SqlitePool,
    deadline: Instant,
) -> Result<PoolConnection<Sqlite>, DbError> {
    let mut conn = tokio::time::timeout_at(deadline, pool.acquire())
        .await
        .map_err(|_| DbError::Busy)??;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(DbError::Busy);
    }
    sqlx::raw_sql(AssertSqlSafe(format!(
        "PRAGMA busy_timeout = {}",
        left.as_millis().max(1)
    )))
    .execute(&mut *conn)
    .await?;
    Ok(conn)
}

/// A transaction that holds SQLite's write lock from its start: the wait for that lock is the
/// BEGIN's, bounded by the connection's busy timeout (a deferred transaction would meet it at
/// its first write, or fail at once where a read came first).
pub async fn begin_immediate(conn: &mut Writer) -> Result<Tx<'_>, DbError> {
    Ok(conn.begin_with("BEGIN IMMEDIATE").await?)
}

/// The order under this user's key, in `tx`.
pub(crate) async fn find_by_key(
    tx: &mut Tx<'_>,
    user_id: u64,
    key: &str,
) -> Result<Option<Order>, DbError> {
    let order = sqlx::query(AssertSqlSafe(format!(
        "{SELECT_ORDER} WHERE user_id = ?1 AND idempotency_key = ?2"
    )))
    .bind(sql_id(user_id))
    .bind(key)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(order.as_ref().map(order_row).transpose()?)
}

/// Decrements stock and records the order in `tx`. The decrement is conditional on enough
/// stock; `fence`, the stock lock's, is recorded with the order (the lock's writes are
/// fenced: `tx` is begun by `redguard::lock::begin_fenced`).
pub async fn place_order(
    tx: &mut SqliteConnection,
    user_id: u64,
    key: &str,
    sku: &str,
    qty: u32,
    fence: u64,
) -> Result<Order, PlaceError> {
    let price: Option<i64> = sqlx::query_scalar(
        "UPDATE stock SET available = available - ?1 WHERE sku = ?2 AND available >= ?1
         RETURNING price",
    )
    .bind(qty)
    .bind(sku)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(price) = price else {
        return Err(PlaceError::OutOfStock);
    };
    let total = price * i64::from(qty);
    let fence_sql = i64::try_from(fence).unwrap_or(i64::MAX);
    let order_id = sqlx::query(
        "INSERT INTO orders (user_id, idempotency_key, sku, qty, total, status, fence, created_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, 'created', ?6, ?7)",
    )
    .bind(sql_id(user_id))
    .bind(key)
    .bind(sku)
    .bind(qty)
    .bind(total)
    .bind(fence_sql)
    .bind(now_ms())
    .execute(&mut *tx)
    .await?
    .last_insert_rowid();
    Ok(Order {
        order_id,
        user_id,
        sku: sku.to_owned(),
        qty,
        total: u64::try_from(total).unwrap_or(0),
        status: "created".to_owned(),
        idempotency_key: key.to_owned(),
        fence,
    })
}

const SELECT_ORDER: &str =
    "SELECT order_id, user_id, sku, qty, total, status, idempotency_key, fence FROM orders";

fn order_row(row: &SqliteRow) -> sqlx::Result<Order> {
    Ok(Order {
        order_id: row.try_get(0)?,
        user_id: u64::try_from(row.try_get::<i64, _>(1)?).unwrap_or(0),
        sku: row.try_get(2)?,
        qty: row.try_get(3)?,
        total: u64::try_from(row.try_get::<i64, _>(4)?).unwrap_or(0),
        status: row.try_get(5)?,
        idempotency_key: row.try_get(6)?,
        fence: u64::try_from(row.try_get::<i64, _>(7)?).unwrap_or(0),
    })
}
