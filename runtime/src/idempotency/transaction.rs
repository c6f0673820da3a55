//! The outcome committed in the caller's database transaction (feature `sqlx`).
//!
//! Redis keeps the fast claim and the replay cache; the database keeps the truth. The
//! execution claims a row of `redguard_outcomes` in the caller's transaction before the body
//! runs, and fills it with the result just before redguard commits, so the body's writes and
//! their record commit or roll back together. The row's primary key is the fence: of two
//! executions of one intent that both reach their commit, the second blocks on the first's
//! row and then finds it, so an effect in the transaction is applied at most once whatever
//! Redis says. A Redis record left PROCESSING or UNKNOWN (the process died, Redis stalled at
//! the finish) is resolved from the row: committed, it is replayed; absent and not held by an
//! open transaction, the effects rolled back and the retry runs at once.
//!
//! A claimed row carries `uncommitted = 1`, a deferred foreign key to the always-empty
//! `redguard_uncommitted`: a body that commits the transaction itself (raw `COMMIT`) fails
//! that commit, and one that ends it otherwise is caught at the savepoint around the body.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::begin::Begun;
use super::{Classify, Idempotency, replay};
use crate::error::{BackendError, Error, Result, StoreFailure};
use crate::handle::Redguard;
use crate::key::{GuardKind, KeyBody};
use crate::store::{Resolve, Resolved};

/// The largest serialized result an outcome row holds (the migrations' `CHECK`): 1 MiB.
/// Larger ones are refused and the transaction rolled back.
pub const MAX_SQL_RESULT_BYTES: usize = 1024 * 1024;

/// The Postgres migrations of redguard's tables, `redguard_outcomes` and `redguard_fences`
/// (the crate's `migrations/postgres/*.sql`, in order; each runs again harmlessly), for a
/// service that runs its schema from code rather than copying the files into its own
/// migrations.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool) -> sqlx::Result<()> {
/// sqlx::raw_sql(redguard::idempotency::POSTGRES_MIGRATION).execute(&pool).await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "sqlx-postgres")]
pub const POSTGRES_MIGRATION: &str = concat!(
    include_str!("../../migrations/postgres/0001_redguard_outcomes.sql"),
    include_str!("../../migrations/postgres/0002_redguard_fences.sql"),
);

/// The SQLite migrations of redguard's tables (the crate's `migrations/sqlite/*.sql`, in
/// order); see [`POSTGRES_MIGRATION`].
///
/// ```no_run
/// # async fn f(pool: sqlx::SqlitePool) -> sqlx::Result<()> {
/// sqlx::raw_sql(redguard::idempotency::SQLITE_MIGRATION).execute(&pool).await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "sqlx-sqlite")]
pub const SQLITE_MIGRATION: &str = concat!(
    include_str!("../../migrations/sqlite/0001_redguard_outcomes.sql"),
    include_str!("../../migrations/sqlite/0002_redguard_fences.sql"),
);

/// How long a retry waits for a transaction that holds the intent's row before it answers
/// [`Error::InProgress`] (Postgres `lock_timeout`; SQLite waits its connection's busy timeout).
#[cfg(feature = "sqlx-postgres")]
const PROBE_WAIT: &str = "SET LOCAL lock_timeout = '200ms'";

/// The migration to run when the table is missing, named in the error.
const MIGRATION_HINT: &str = "the table redguard_outcomes is missing or outdated: run the \
    migration shipped with redguard (migrations/postgres/0001_redguard_outcomes.sql or \
    migrations/sqlite/0001_redguard_outcomes.sql)";

/// A database whose transactions can hold an idempotent outcome: [`sqlx::Postgres`] and
/// [`sqlx::Sqlite`]. Sealed; see [`Idempotency::transaction`].
#[async_trait]
pub trait OutcomeDatabase: sqlx::Database + sealed::Sealed {
    #[doc(hidden)]
    async fn __exec(conn: &mut Self::Connection, sql: &'static str) -> sqlx::Result<()>;
    #[doc(hidden)]
    async fn __claim(conn: &mut Self::Connection, row: &Row<'_>) -> sqlx::Result<u64>;
    #[doc(hidden)]
    async fn __find(conn: &mut Self::Connection, row: &Row<'_>) -> sqlx::Result<Option<Found>>;
    #[doc(hidden)]
    async fn __complete(
        conn: &mut Self::Connection,
        row: &Row<'_>,
        result: &[u8],
    ) -> sqlx::Result<u64>;
    #[doc(hidden)]
    async fn __purge(conn: &mut Self::Connection, now: i64, limit: i64) -> sqlx::Result<u64>;
    #[doc(hidden)]
    async fn __advance_fence(
        conn: &mut Self::Connection,
        resource: &str,
        fence: i64,
    ) -> sqlx::Result<u64>;
    #[doc(hidden)]
    fn __failure(err: &sqlx::Error) -> DbFailure;
    #[doc(hidden)]
    const __PROBE_WAIT: Option<&'static str>;
}

mod sealed {
    pub trait Sealed {}
    #[cfg(feature = "sqlx-postgres")]
    impl Sealed for sqlx::Postgres {}
    #[cfg(feature = "sqlx-sqlite")]
    impl Sealed for sqlx::Sqlite {}
}

/// The row an execution claims and completes (an implementation detail of
/// [`OutcomeDatabase`]).
#[doc(hidden)]
#[derive(Debug)]
pub struct Row<'a> {
    scope: &'a str,
    key: &'a str,
    fingerprint: &'a str,
    owner: &'a str,
    expires_at: i64,
    now: i64,
}

/// A committed row, as found (an implementation detail of [`OutcomeDatabase`]).
#[doc(hidden)]
#[derive(Debug)]
pub struct Found {
    fingerprint: String,
    result: Option<Vec<u8>>,
    expires_at: i64,
}

/// What a failed statement means (an implementation detail of [`OutcomeDatabase`]).
#[doc(hidden)]
#[derive(Debug, PartialEq, Eq)]
pub enum DbFailure {
    /// The table or a column is missing: the migration was not run.
    MissingTable,
    /// Another open transaction holds the row (or the database's write lock).
    Busy,
    /// Anything else: the connection, the server.
    Other,
}

#[cfg(feature = "sqlx-postgres")]
#[async_trait]
impl OutcomeDatabase for sqlx::Postgres {
    async fn __exec(conn: &mut sqlx::PgConnection, sql: &'static str) -> sqlx::Result<()> {
        sqlx::raw_sql(sql).execute(conn).await.map(drop)
    }

    async fn __claim(conn: &mut sqlx::PgConnection, row: &Row<'_>) -> sqlx::Result<u64> {
        // An expired row is taken over; a live one (or one an open transaction holds, once
        // that commits) is left, and 0 rows say so.
        let done = sqlx::query(
            "INSERT INTO redguard_outcomes (scope, idem_key, fingerprint, owner, expires_at, uncommitted) \
             VALUES ($1, $2, $3, $4, $5, 1) \
             ON CONFLICT (scope, idem_key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
             owner = EXCLUDED.owner, result = NULL, expires_at = EXCLUDED.expires_at, uncommitted = 1 \
             WHERE redguard_outcomes.expires_at <= $6",
        )
        .bind(row.scope)
        .bind(row.key)
        .bind(row.fingerprint)
        .bind(row.owner)
        .bind(row.expires_at)
        .bind(row.now)
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    async fn __find(conn: &mut sqlx::PgConnection, row: &Row<'_>) -> sqlx::Result<Option<Found>> {
        let found: Option<(String, Option<Vec<u8>>, i64)> = sqlx::query_as(
            "SELECT fingerprint, result, expires_at FROM redguard_outcomes \
             WHERE scope = $1 AND idem_key = $2",
        )
        .bind(row.scope)
        .bind(row.key)
        .fetch_optional(conn)
        .await?;
        Ok(found.map(|(fingerprint, result, expires_at)| Found {
            fingerprint,
            result,
            expires_at,
        }))
    }

    async fn __complete(
        conn: &mut sqlx::PgConnection,
        row: &Row<'_>,
        result: &[u8],
    ) -> sqlx::Result<u64> {
        let done = sqlx::query(
            "UPDATE redguard_outcomes SET result = $1, uncommitted = NULL \
             WHERE scope = $2 AND idem_key = $3 AND owner = $4 AND uncommitted IS NOT NULL",
        )
        .bind(result)
        .bind(row.scope)
        .bind(row.key)
        .bind(row.owner)
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    async fn __advance_fence(
        conn: &mut sqlx::PgConnection,
        resource: &str,
        fence: i64,
    ) -> sqlx::Result<u64> {
        // The conflict arm locks the row and reads its newest version, so of two writers the
        // later one judges against what the earlier committed.
        let done = sqlx::query(
            "INSERT INTO redguard_fences (resource, fence) VALUES ($1, $2) \
             ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence \
             WHERE redguard_fences.fence <= EXCLUDED.fence",
        )
        .bind(resource)
        .bind(fence)
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    async fn __purge(conn: &mut sqlx::PgConnection, now: i64, limit: i64) -> sqlx::Result<u64> {
        let done = sqlx::query(
            "DELETE FROM redguard_outcomes WHERE ctid IN \
             (SELECT ctid FROM redguard_outcomes WHERE expires_at < $1 ORDER BY expires_at LIMIT $2)",
        )
        .bind(now)
        .bind(limit)
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    fn __failure(err: &sqlx::Error) -> DbFailure {
        match err.as_database_error().and_then(|db| db.code()) {
            // undefined_table, undefined_column
            Some(code) if code == "42P01" || code == "42703" => DbFailure::MissingTable,
            // lock_not_available: `lock_timeout` elapsed behind another transaction's row.
            Some(code) if code == "55P03" => DbFailure::Busy,
            _ => DbFailure::Other,
        }
    }

    const __PROBE_WAIT: Option<&'static str> = Some(PROBE_WAIT);
}

#[cfg(feature = "sqlx-sqlite")]
#[async_trait]
impl OutcomeDatabase for sqlx::Sqlite {
    async fn __exec(conn: &mut sqlx::SqliteConnection, sql: &'static str) -> sqlx::Result<()> {
        sqlx::raw_sql(sql).execute(conn).await.map(drop)
    }

    async fn __claim(conn: &mut sqlx::SqliteConnection, row: &Row<'_>) -> sqlx::Result<u64> {
        let done = sqlx::query(
            "INSERT INTO redguard_outcomes (scope, idem_key, fingerprint, owner, expires_at, uncommitted) \
             VALUES (?1, ?2, ?3, ?4, ?5, 1) \
             ON CONFLICT (scope, idem_key) DO UPDATE SET fingerprint = excluded.fingerprint, \
             owner = excluded.owner, result = NULL, expires_at = excluded.expires_at, uncommitted = 1 \
             WHERE redguard_outcomes.expires_at <= ?6",
        )
        .bind(row.scope)
        .bind(row.key)
        .bind(row.fingerprint)
        .bind(row.owner)
        .bind(row.expires_at)
        .bind(row.now)
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    async fn __find(
        conn: &mut sqlx::SqliteConnection,
        row: &Row<'_>,
    ) -> sqlx::Result<Option<Found>> {
        let found: Option<(String, Option<Vec<u8>>, i64)> = sqlx::query_as(
            "SELECT fingerprint, result, expires_at FROM redguard_outcomes \
             WHERE scope = ?1 AND idem_key = ?2",
        )
        .bind(row.scope)
        .bind(row.key)
        .fetch_optional(conn)
        .await?;
        Ok(found.map(|(fingerprint, result, expires_at)| Found {
            fingerprint,
            result,
            expires_at,
        }))
    }

    async fn __complete(
        conn: &mut sqlx::SqliteConnection,
        row: &Row<'_>,
        result: &[u8],
    ) -> sqlx::Result<u64> {
        let done = sqlx::query(
            "UPDATE redguard_outcomes SET result = ?1, uncommitted = NULL \
             WHERE scope = ?2 AND idem_key = ?3 AND owner = ?4 AND uncommitted IS NOT NULL",
        )
        .bind(result)
        .bind(row.scope)
        .bind(row.key)
        .bind(row.owner)
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    async fn __advance_fence(
        conn: &mut sqlx::SqliteConnection,
        resource: &str,
        fence: i64,
    ) -> sqlx::Result<u64> {
        let done = sqlx::query(
            "INSERT INTO redguard_fences (resource, fence) VALUES (?1, ?2) \
             ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence \
             WHERE redguard_fences.fence <= excluded.fence",
        )
        .bind(resource)
        .bind(fence)
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    async fn __purge(conn: &mut sqlx::SqliteConnection, now: i64, limit: i64) -> sqlx::Result<u64> {
        let done = sqlx::query(
            "DELETE FROM redguard_outcomes WHERE rowid IN \
             (SELECT rowid FROM redguard_outcomes WHERE expires_at < ?1 ORDER BY expires_at LIMIT ?2)",
        )
        .bind(now)
        .bind(limit)
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    fn __failure(err: &sqlx::Error) -> DbFailure {
        let Some(db) = err.as_database_error() else {
            return DbFailure::Other;
        };
        // SQLITE_BUSY and SQLITE_LOCKED, with their extended codes.
        let primary = db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .map(|code| code & 0xff);
        if matches!(primary, Some(5 | 6)) {
            DbFailure::Busy
        } else if db.message().contains("no such table") || db.message().contains("no such column")
        {
            DbFailure::MissingTable
        } else {
            DbFailure::Other
        }
    }

    const __PROBE_WAIT: Option<&'static str> = None;
}

/// Deletes up to `limit` outcome rows past their expiry, oldest first, and returns how many.
/// Run it from a periodic job (every few minutes, `limit` a few thousand) until it returns
/// less than `limit`; each call is one statement on the `expires_at` index.
///
/// ```no_run
/// # async fn job(pool: sqlx::PgPool) -> redguard::Result<()> {
/// let mut conn = pool.acquire().await.map_err(redguard::idempotency::sql_failure)?;
/// while redguard::idempotency::purge_expired::<sqlx::Postgres>(&mut conn, 1000).await? == 1000 {}
/// # Ok(()) }
/// ```
pub async fn purge_expired<DB: OutcomeDatabase>(
    conn: &mut DB::Connection,
    limit: u32,
) -> Result<u64> {
    DB::__purge(conn, unix_ms(Duration::ZERO), i64::from(limit))
        .await
        .map_err(sql_failure)
}

/// A database error as redguard's: [`Error::Backend`], an unknown outcome. For the `?` of the
/// connection a caller acquires for [`purge_expired`].
///
/// ```
/// let err = redguard::idempotency::sql_failure(sqlx::Error::PoolTimedOut);
/// assert!(matches!(err, redguard::Error::Backend(_)));
/// ```
pub fn sql_failure(err: sqlx::Error) -> Error {
    Error::Backend(BackendError::Failed {
        op: "sql",
        source: StoreFailure::new(err),
    })
}

impl Idempotency {
    /// Commits the outcome in `tx`, the caller's own database transaction: the body gets it
    /// and hands it back with its result, redguard writes the outcome row (key, fingerprint, result,
    /// expiry) in it and commits it, so the body's writes and their record commit or roll
    /// back together; then it records SUCCESS in Redis, which keeps the fast claim and the
    /// replay cache. A body that fails, and a replay, roll `tx` back.
    ///
    /// A Redis record left PROCESSING or UNKNOWN by an execution that is gone (its process
    /// died, Redis stalled at the finish) is resolved from the database: a committed row is
    /// replayed; no row, and no open transaction holding it, means the effects rolled back, and
    /// the retry runs at once. A replay after the Redis record expired comes from the row.
    ///
    /// Refused, with the transaction rolled back and nothing committed: a body that ends the
    /// transaction itself (raw `COMMIT` or `ROLLBACK`), a database without the table
    /// ([`Error::Config`] naming the migration), a result over [`MAX_SQL_RESULT_BYTES`].
    /// Only writes made through the transaction are covered; a call to another system from
    /// the body is not.
    ///
    /// ```no_run
    /// # async fn place(pool: sqlx::SqlitePool, order: u64) -> redguard::Result<u64> {
    /// let rg = redguard::Redguard::memory();
    /// let tx = pool.begin().await.map_err(redguard::idempotency::sql_failure)?;
    /// let id = rg
    ///     .idempotency(redguard::key("order:{id}").part("id", &order))
    ///     .scope("orders")
    ///     .transaction(tx)
    ///     .run(async |mut tx| {
    ///         let placed = sqlx::query("INSERT INTO orders (id) VALUES (?1)")
    ///             .bind(order as i64)
    ///             .execute(&mut *tx)
    ///             .await
    ///             .map(|_| order)
    ///             .map_err(redguard::idempotency::sql_failure);
    ///         (tx, placed)
    ///     })
    ///     .await?;
    /// # Ok(id) }
    /// ```
    pub fn transaction<'c, DB: OutcomeDatabase>(
        self,
        tx: sqlx::Transaction<'c, DB>,
    ) -> Transactional<'c, DB> {
        Transactional { guard: self, tx }
    }
}

/// An [`Idempotency`] whose outcome commits in the caller's transaction; see
/// [`Idempotency::transaction`].
#[must_use = "a Transactional does nothing until `.run(body).await`"]
pub struct Transactional<'c, DB: OutcomeDatabase> {
    guard: Idempotency,
    tx: sqlx::Transaction<'c, DB>,
}

impl<DB: OutcomeDatabase> std::fmt::Debug for Transactional<'_, DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transactional")
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

/// The intent as the row knows it, and what a second begin needs.
struct Intent {
    scope: String,
    body: KeyBody,
    key: String,
    fingerprint: String,
    expire: Duration,
    timeout: Option<Duration>,
    replicas: Option<(u32, Duration)>,
}

impl Intent {
    fn row<'a>(&'a self, owner: &'a str) -> Row<'a> {
        Row {
            scope: &self.scope,
            key: &self.key,
            fingerprint: &self.fingerprint,
            owner,
            expires_at: unix_ms(self.expire),
            now: unix_ms(Duration::ZERO),
        }
    }

    /// The same begin again, after the record was resolved.
    fn twin(&self, handle: &Redguard) -> Idempotency {
        let mut twin = Idempotency::parts(self.scope.clone(), Some(Ok(self.body.clone())));
        twin.handle = Some(handle.clone());
        twin.expire = self.expire;
        twin.fingerprint = Ok(self.fingerprint.clone());
        twin.timeout = self.timeout;
        twin.replicas = self.replicas;
        twin
    }
}

/// What a claim found.
enum Claim {
    /// The row is this execution's, uncommitted.
    Claimed,
    /// A committed, unexpired row with this result.
    Done(Vec<u8>),
    /// A committed row of another payload.
    KeyReuse,
    /// An open transaction holds the row.
    Busy,
}

impl<'c, DB: OutcomeDatabase> Transactional<'c, DB> {
    /// Runs `body` at most once per intent, with the outcome committed in the transaction;
    /// see [`Idempotency::transaction`].
    pub async fn run<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce(sqlx::Transaction<'c, DB>) -> Fut,
        Fut: Future<Output = (sqlx::Transaction<'c, DB>, Result<T, E>)>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Classify,
    {
        let Transactional { guard, mut tx } = self;
        let handle = guard.handle()?;
        let span = crate::trace::idempotent(&guard.scope, handle.store().kind().as_str());
        async move {
            if guard.token.is_some() {
                return Err(Error::Config(
                    "a transactional outcome does not take a token: the row is the fence".into(),
                )
                .into());
            }
            let intent = match (&guard.key, &guard.fingerprint) {
                (Some(Ok(body)), Ok(fingerprint)) => Intent {
                    scope: guard.scope.clone(),
                    body: body.clone(),
                    key: handle
                        .key(GuardKind::Idempotency, &guard.scope, body)?
                        .to_string(),
                    fingerprint: fingerprint.clone(),
                    expire: guard.expire,
                    timeout: guard.timeout,
                    replicas: guard.replicas,
                },
                (None, _) => {
                    return Err(Error::Config(
                        "a transactional outcome needs the intent's key".into(),
                    )
                    .into());
                }
                // The begin reports the key or payload that does not render.
                _ => {
                    let err = match guard.begin::<T, Error>(&handle).await {
                        Err(err) => err,
                        Ok(_) => {
                            Error::Config("the intent's key or payload does not render".into())
                        }
                    };
                    return Err(err.into());
                }
            };
            let (execution, claimed) = match guard.begin::<T, Error>(&handle).await {
                Ok(Begun::Replayed(value)) => return Ok(value),
                Ok(Begun::Run(execution)) => (execution, None),
                Err(err @ (Error::InProgress | Error::OutcomeUnknown)) => {
                    match resolve(&handle, &intent, &mut tx, err).await? {
                        Resolution::Replay(value) => return Ok(value),
                        Resolution::Run(execution, owner) => (*execution, Some(owner)),
                    }
                }
                Err(err) => return Err(err.into()),
            };
            let owner = claimed.clone().unwrap_or_else(|| execution.owner.clone());
            execution
                .run(async move {
                    if claimed.is_none() {
                        match claim::<DB>(&mut tx, &intent.row(&owner), false).await? {
                            Claim::Claimed => {}
                            Claim::Done(bytes) => {
                                replay::mark();
                                return decode(&intent, &bytes).map_err(E::from);
                            }
                            Claim::KeyReuse => return Err(Error::KeyReuse.into()),
                            Claim::Busy => return Err(Error::InProgress.into()),
                        }
                    }
                    DB::__exec(&mut tx, "SAVEPOINT redguard_body")
                        .await
                        .map_err(sql_failure)?;
                    let (tx, result) = body(tx).await;
                    let value = match result {
                        Ok(value) => value,
                        Err(err) => {
                            // Fails after a body that ended the transaction itself: nothing
                            // of it is left to roll back.
                            let _ = tx.rollback().await;
                            return Err(err);
                        }
                    };
                    commit(tx, &intent.row(&owner), &value).await?;
                    Ok(value)
                })
                .await
        }
        .instrument(span)
        .await
    }
}

/// What a record left PROCESSING or UNKNOWN resolved to.
enum Resolution<T> {
    Replay(T),
    /// The row is claimed by `owner` in the caller's transaction; the execution runs.
    Run(Box<super::execution::Execution>, String),
}

/// Resolves a PROCESSING or UNKNOWN record (`found`) from the database.
async fn resolve<T, DB>(
    handle: &Redguard,
    intent: &Intent,
    tx: &mut sqlx::Transaction<'_, DB>,
    found: Error,
) -> Result<Resolution<T>>
where
    T: DeserializeOwned,
    DB: OutcomeDatabase,
{
    let owner = uuid::Uuid::new_v4().simple().to_string();
    let key = handle.key(GuardKind::Idempotency, &intent.scope, &intent.body)?;
    match claim::<DB>(tx, &intent.row(&owner), true).await? {
        // Its execution is alive, in its transaction.
        Claim::Busy => Err(found),
        Claim::KeyReuse => Err(Error::KeyReuse),
        Claim::Done(bytes) => {
            // Committed, SUCCESS lost on the way to Redis: put it back for the next retry.
            let resolved = handle
                .store()
                .idem_resolve(Resolve {
                    key: &key,
                    result: Some(&bytes),
                    force: true,
                })
                .await;
            if let Err(err) = resolved {
                tracing::warn!(guard = "idem", %key, error = %err, "replayed from the database; could not record SUCCESS in Redis");
            }
            replay::mark();
            decode(intent, &bytes).map(Resolution::Replay)
        }
        Claim::Claimed => {
            // No row and no transaction holding one: the execution is gone and its effects
            // rolled back. FAIL lets this retry take the record over now.
            let resolved = handle
                .store()
                .idem_resolve(Resolve {
                    key: &key,
                    result: None,
                    force: true,
                })
                .await?;
            tracing::info!(guard = "idem", %key, ?resolved, "record of a gone execution resolved from the database: no outcome row, the retry runs");
            if matches!(resolved, Resolved::Missing) {
                tracing::debug!(guard = "idem", %key, "the record expired meanwhile");
            }
            match intent.twin(handle).begin::<T, Error>(handle).await? {
                Begun::Replayed(value) => Ok(Resolution::Replay(value)),
                Begun::Run(execution) => Ok(Resolution::Run(Box::new(execution), owner)),
            }
        }
    }
}

/// Claims the intent's row in `tx`, in a savepoint so a failed statement leaves the caller's
/// transaction usable. A `probe` waits only briefly behind a transaction holding the row.
async fn claim<DB: OutcomeDatabase>(
    tx: &mut sqlx::Transaction<'_, DB>,
    row: &Row<'_>,
    probe: bool,
) -> Result<Claim> {
    DB::__exec(tx, "SAVEPOINT redguard_claim")
        .await
        .map_err(sql_failure)?;
    let wait = match DB::__PROBE_WAIT {
        Some(wait) if probe => DB::__exec(tx, wait).await,
        _ => Ok(()),
    };
    let claimed = match wait {
        Ok(()) => DB::__claim(tx, row).await,
        Err(err) => Err(err),
    };
    let claimed = match claimed {
        Ok(rows) => rows,
        Err(err) => {
            let _ = DB::__exec(
                tx,
                "ROLLBACK TO SAVEPOINT redguard_claim; RELEASE SAVEPOINT redguard_claim",
            )
            .await;
            return match DB::__failure(&err) {
                DbFailure::Busy => Ok(Claim::Busy),
                DbFailure::MissingTable => Err(Error::Config(format!("{MIGRATION_HINT} ({err})"))),
                DbFailure::Other => Err(sql_failure(err)),
            };
        }
    };
    if probe && DB::__PROBE_WAIT.is_some() {
        DB::__exec(tx, "SET LOCAL lock_timeout = DEFAULT")
            .await
            .map_err(sql_failure)?;
    }
    DB::__exec(tx, "RELEASE SAVEPOINT redguard_claim")
        .await
        .map_err(sql_failure)?;
    if claimed == 1 {
        return Ok(Claim::Claimed);
    }
    match DB::__find(tx, row).await.map_err(sql_failure)? {
        Some(found) if found.fingerprint != row.fingerprint => Ok(Claim::KeyReuse),
        Some(Found {
            result: Some(bytes),
            expires_at,
            ..
        }) if expires_at > row.now => Ok(Claim::Done(bytes)),
        // Committed without a result: only a body that committed with foreign keys off.
        _ => Err(Error::OutcomeUnknown),
    }
}

/// Fills the claimed row with the result and commits; refuses a body that ended the
/// transaction itself, or a result the column does not hold, rolling back.
async fn commit<DB: OutcomeDatabase, T: Serialize>(
    mut tx: sqlx::Transaction<'_, DB>,
    row: &Row<'_>,
    value: &T,
) -> Result<()> {
    let bytes = match serde_json::to_vec(value) {
        Ok(bytes) => bytes,
        Err(err) => {
            return refused(tx, format!("the result does not serialize: {err}")).await;
        }
    };
    if bytes.len() > MAX_SQL_RESULT_BYTES {
        return refused(
            tx,
            format!(
                "the result is {} bytes serialized; an outcome row holds at most {MAX_SQL_RESULT_BYTES}: \
                 nothing was committed",
                bytes.len()
            ),
        )
        .await;
    }
    let ended = "the body ended the transaction itself (a COMMIT or ROLLBACK of its own): \
        redguard commits it with the outcome row; nothing of the body is committed by redguard";
    if let Err(err) = DB::__exec(&mut tx, "RELEASE SAVEPOINT redguard_body").await {
        return refused(tx, format!("{ended} ({err})")).await;
    }
    match DB::__complete(&mut tx, row, &bytes).await {
        Ok(1) => {}
        Ok(_) => return refused(tx, ended.to_owned()).await,
        Err(err) => {
            let _ = tx.rollback().await;
            return Err(sql_failure(err));
        }
    }
    tx.commit().await.map_err(sql_failure)
}

/// Rolls back a transaction whose body is refused.
async fn refused<DB: OutcomeDatabase>(tx: sqlx::Transaction<'_, DB>, why: String) -> Result<()> {
    // Fails after a body that ended the transaction itself: nothing is left to roll back.
    let _ = tx.rollback().await;
    Err(Error::Config(why))
}

fn decode<T: DeserializeOwned>(intent: &Intent, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|err| Error::Corrupt {
        key: intent.key.clone(),
        detail: format!(
            "the stored result does not deserialize as {}: {err}",
            std::any::type_name::<T>()
        ),
    })
}

/// Unix milliseconds `after` from now, the row's clock (the application's, as the expiry the
/// retention job compares with).
fn unix_ms(after: Duration) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    i64::try_from((now + after).as_millis()).unwrap_or(i64::MAX)
}
