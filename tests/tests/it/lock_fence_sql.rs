//! Fencing into storage (`redguard::lock::advance_fence`, feature `sqlx`) on a real Postgres
//! that the test starts and on a SQLite file: a holder paused past its lease (a partition
//! keeps its renewals from Redis) writes after the next holder did, and that late write is
//! refused and rolled back; the current holder's writes commit, again under the same fence.

use std::time::Duration;

use redguard::idempotency::{POSTGRES_MIGRATION, SQLITE_MIGRATION};
use redguard::{Error, Redguard};
use redguard_tests::RedisServer;
use redguard_tests::postgres::Postgres;
use redguard_tests::proxy::{Fault, Proxy};
use sqlx::{Pool, Postgres as Pg, Sqlite, Transaction};

const LEASE: Duration = Duration::from_secs(1);
const RESOURCE: &str = "stock:SK-1";

/// The test's side of a database: a table of writes, each naming its holder.
trait WritesDb: redguard::idempotency::OutcomeDatabase {
    async fn write(tx: &mut Transaction<'static, Self>, holder: &str);
    async fn writes(pool: &Pool<Self>) -> Vec<String>;
}

impl WritesDb for Pg {
    async fn write(tx: &mut Transaction<'static, Self>, holder: &str) {
        sqlx::query("INSERT INTO writes (holder) VALUES ($1)")
            .bind(holder)
            .execute(&mut **tx)
            .await
            .expect("insert a write");
    }
    async fn writes(pool: &Pool<Self>) -> Vec<String> {
        sqlx::query_scalar("SELECT holder FROM writes ORDER BY id")
            .fetch_all(pool)
            .await
            .expect("read the writes")
    }
}

impl WritesDb for Sqlite {
    async fn write(tx: &mut Transaction<'static, Self>, holder: &str) {
        sqlx::query("INSERT INTO writes (holder) VALUES (?1)")
            .bind(holder)
            .execute(&mut **tx)
            .await
            .expect("insert a write");
    }
    async fn writes(pool: &Pool<Self>) -> Vec<String> {
        sqlx::query_scalar("SELECT holder FROM writes ORDER BY id")
            .fetch_all(pool)
            .await
            .expect("read the writes")
    }
}

/// One fenced write: the fence advanced and the write inserted in one transaction, committed
/// only if the fence was not stale.
async fn fenced_write<DB: WritesDb>(
    pool: &Pool<DB>,
    holder: &str,
    fence: u64,
) -> redguard::Result<()> {
    let mut tx = pool.begin().await.expect("begin");
    redguard::lock::advance_fence(&mut tx, RESOURCE, fence).await?;
    DB::write(&mut tx, holder).await;
    tx.commit().await.expect("commit");
    Ok(())
}

async fn connect(url: String) -> Redguard {
    Redguard::redis(url)
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect to the test redis-server")
}

async fn a_paused_holder_is_refused<DB: WritesDb>(pool: &Pool<DB>) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let (paused, next) = (connect(proxy.url()).await, connect(server.url()).await);

    let stale = paused
        .lock(RESOURCE)
        .lease(LEASE)
        .acquire()
        .await
        .expect("the first holder acquires");
    // The first holder's process stalls: nothing it sends reaches Redis, its lease lapses.
    proxy.set(Fault::Blackhole);
    let current = next
        .lock(RESOURCE)
        .lease(Duration::from_secs(10))
        .wait(LEASE * 5)
        .acquire()
        .await
        .expect("the next holder acquires once the lease lapsed");
    assert!(current.fence() > stale.fence());

    fenced_write(pool, "next", current.fence())
        .await
        .expect("the current holder writes");
    fenced_write(pool, "next again", current.fence())
        .await
        .expect("the current holder writes again under its fence");
    // The first holder wakes up and writes as if it still held the lock.
    match fenced_write(pool, "paused", stale.fence()).await {
        Err(Error::LockLost { key }) => assert_eq!(key, RESOURCE),
        other => panic!("a stale holder's write: {other:?}"),
    }
    assert_eq!(DB::writes(pool).await, ["next", "next again"]);

    proxy.set(Fault::Pass);
    current.release().await.expect("release");
    drop(stale);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_the_write_of_a_holder_paused_past_its_lease() {
    let pg = Postgres::start();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&pg.url())
        .await
        .expect("connect to the test postgres");
    sqlx::raw_sql(POSTGRES_MIGRATION)
        .execute(&pool)
        .await
        .expect("migrate");
    sqlx::raw_sql("CREATE TABLE writes (id BIGSERIAL PRIMARY KEY, holder TEXT NOT NULL)")
        .execute(&pool)
        .await
        .expect("create writes");
    a_paused_holder_is_refused(&pool).await;
}

async fn sqlite(dir: &tempfile::TempDir, migrate: bool) -> Pool<Sqlite> {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("app.db"))
        .create_if_missing(true)
        .busy_timeout(Duration::from_secs(5));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("open the sqlite file");
    if migrate {
        sqlx::raw_sql(SQLITE_MIGRATION)
            .execute(&pool)
            .await
            .expect("migrate");
    }
    sqlx::raw_sql("CREATE TABLE writes (id INTEGER PRIMARY KEY, holder TEXT NOT NULL)")
        .execute(&pool)
        .await
        .expect("create writes");
    pool
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_refuses_the_write_of_a_holder_paused_past_its_lease() {
    let dir = tempfile::tempdir().expect("temp dir");
    a_paused_holder_is_refused(&sqlite(&dir, true).await).await;
}

/// Without the migration the call says which file to run, and nothing is written.
#[tokio::test]
async fn a_missing_fence_table_names_its_migration() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pool = sqlite(&dir, false).await;
    match fenced_write(&pool, "any", 1).await {
        Err(Error::Config(why)) => assert!(why.contains("0002_redguard_fences.sql"), "{why}"),
        other => panic!("without the migration: {other:?}"),
    }
    assert!(Sqlite::writes(&pool).await.is_empty());
    let mut tx = pool.begin().await.expect("begin");
    for bad in ["", &"r".repeat(redguard::lock::MAX_FENCED_RESOURCE + 1)] {
        assert!(matches!(
            redguard::lock::advance_fence(&mut tx, bad, 1).await,
            Err(Error::Config(_))
        ));
    }
}
