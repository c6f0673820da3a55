//! The transactional outcome (issue 29, feature `sqlx`) against Redis alone, same run: an
//! idempotent first execution whose body does one INSERT in a database transaction, (a) with
//! `.transaction(tx)` — redguard writes the outcome row in that transaction and commits it,
//! then records SUCCESS in Redis — and (b) without: the body begins and commits its own
//! transaction and redguard records in Redis only. Closed loops at 1 and 16 in flight; the
//! notes give (a) ÷ (b) at each.
//!
//! SQLite always (a temp file: there is no server to start), in WAL mode as an application
//! would run it; it serialises writers, so at 16 in flight the transactions queue on the
//! write lock (busy timeout) and the row's figures are SQLite's, not redguard's. Postgres too
//! when its binaries are there (the tests' harness starts it), else one "skipped" line.

use std::time::Duration;

use redguard::idempotency::{OutcomeDatabase, sql_failure};
use redguard::key::KeyBuilder;
use redguard::{Error, Redguard};
use redguard_tests::postgres::Postgres;
use sqlx::{Database, Pool};

use crate::Bench;

const SQLITE_MIGRATION: &str =
    include_str!("../../runtime/migrations/sqlite/0001_redguard_outcomes.sql");
const PG_MIGRATION: &str =
    include_str!("../../runtime/migrations/postgres/0001_redguard_outcomes.sql");
const ORDERS: &str = "CREATE TABLE orders (id BIGINT PRIMARY KEY)";
const LEVELS: [usize; 2] = [1, 16];

fn key(i: u64) -> redguard::key::KeyBody {
    KeyBuilder::new()
        .text("order:")
        .part("id", &i)
        .finish()
        .expect("numeric key parts are valid")
}

/// One database's pair of rows: its INSERT, and the case names' suffix.
struct Db<DB: Database> {
    pool: Pool<DB>,
    insert: &'static str,
    name: &'static str,
}

impl<DB: OutcomeDatabase> Db<DB>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments: sqlx::IntoArguments<DB>,
    i64: sqlx::Type<DB> + for<'q> sqlx::Encode<'q, DB>,
{
    async fn cases(self, bench: &mut Bench, rg: &Redguard) {
        let with = format!("idempotency first+INSERT, outcome in tx ({})", self.name);
        let without = format!("idempotency first+INSERT, Redis only ({})", self.name);
        let (pool, insert) = (self.pool, self.insert);
        let handle = rg.clone();
        let in_tx = pool.clone();
        bench
            .run(&with, "redis", None, None, &[], move |i| {
                let (handle, pool) = (handle.clone(), in_tx.clone());
                async move {
                    let tx = pool.begin().await.expect("begin");
                    handle
                        .idempotency(key(i))
                        .scope("bench-txn")
                        .expire(Duration::from_secs(60))
                        .transaction(tx)
                        .run(async |mut tx| {
                            let placed = sqlx::query(insert)
                                .bind(i as i64)
                                .execute(&mut *tx)
                                .await
                                .map(|_| i)
                                .map_err(sql_failure);
                            (tx, placed)
                        })
                        .await
                        .expect("first execution, outcome in tx");
                }
            })
            .await;
        let handle = rg.clone();
        bench
            .run(&without, "redis", None, None, &[], move |i| {
                let (handle, pool) = (handle.clone(), pool.clone());
                async move {
                    handle
                        .idempotency(key(i))
                        .scope("bench-redis-only")
                        .expire(Duration::from_secs(60))
                        .run(async {
                            let mut tx = pool.begin().await.map_err(sql_failure)?;
                            sqlx::query(insert)
                                .bind(i as i64)
                                .execute(&mut *tx)
                                .await
                                .map_err(sql_failure)?;
                            tx.commit().await.map_err(sql_failure)?;
                            Ok::<_, Error>(i)
                        })
                        .await
                        .expect("first execution, Redis only");
                }
            })
            .await;
        bench.compare(&with, "redis", &without);
    }
}

pub(crate) async fn cases(bench: &mut Bench, rg: &Redguard) {
    let selected = |bench: &Bench, name: &str| {
        ["outcome in tx", "Redis only"].iter().any(|way| {
            bench.selected(
                &format!("idempotency first+INSERT, {way} ({name})"),
                "redis",
            )
        })
    };
    let levels = std::mem::replace(&mut bench.levels, LEVELS.to_vec());
    if selected(bench, "sqlite") {
        let dir = tempfile::tempdir().expect("a temp dir for the sqlite file");
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.path().join("bench.db"))
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            // WAL's usual companion: a commit is durable at the next checkpoint, not fsynced.
            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(16)
            .connect_with(options)
            .await
            .expect("open the sqlite file");
        migrate(&pool, SQLITE_MIGRATION).await;
        let insert = "INSERT INTO orders (id) VALUES (?1)";
        let name = "sqlite";
        Db { pool, insert, name }.cases(bench, rg).await;
    }
    if selected(bench, "postgres") {
        if Postgres::available() {
            let server = Postgres::start();
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(16)
                .connect(&server.url())
                .await
                .expect("connect to the bench's postgres");
            migrate(&pool, PG_MIGRATION).await;
            let insert = "INSERT INTO orders (id) VALUES ($1)";
            let name = "postgres";
            Db { pool, insert, name }.cases(bench, rg).await;
        } else {
            let note = "idempotency first+INSERT (postgres): postgres skipped (no initdb; \
                        REDGUARD_PG_BIN or `apt-get install postgresql`)";
            println!("{note}");
            bench.notes.push(note.to_owned());
        }
    }
    bench.levels = levels;
}

async fn migrate<DB: Database>(pool: &Pool<DB>, migration: &'static str)
where
    for<'c> &'c Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    sqlx::raw_sql(migration)
        .execute(pool)
        .await
        .expect("the outcome table's migration");
    sqlx::raw_sql(ORDERS)
        .execute(pool)
        .await
        .expect("the orders table");
}
