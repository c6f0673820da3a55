//! Fencing into storage (`redguard::lock::begin_fenced`, feature `sqlx`) on a real Postgres
//! that the test starts and on a SQLite file: a holder paused past its lease (a partition
//! keeps its renewals from Redis) writes after the next holder did, and that late write is
//! refused and rolled back; the current holder's writes commit, again under the same fence.
//! Many holders racing on one resource: no stale write commits and no legitimate one is
//! aborted (the fence row is locked first, so Postgres finds no deadlock).

use std::time::Duration;

use redguard::idempotency::{POSTGRES_MIGRATION, SQLITE_MIGRATION};
use redguard::{Error, Redguard};
use redguard_tests::RedisServer;
use redguard_tests::postgres::Postgres;
use redguard_tests::proxy::{Fault, Proxy};
use sqlx::{Pool, Postgres as Pg, Sqlite};

const LEASE: Duration = Duration::from_secs(1);
const RESOURCE: &str = "stock:SK-1";

/// The test's side of a database: a table of writes, each naming its holder.
trait WritesDb: redguard::idempotency::OutcomeDatabase {
    async fn write(tx: &mut Self::Connection, holder: &str);
    /// One more sold on the stock row every holder writes.
    async fn sell(tx: &mut Self::Connection) -> sqlx::Result<()>;
    async fn writes(pool: &Pool<Self>) -> Vec<String>;
}

impl WritesDb for Pg {
    async fn sell(tx: &mut Self::Connection) -> sqlx::Result<()> {
        sqlx::query("UPDATE stock SET sold = sold + 1 WHERE sku = 'SK-1'")
            .execute(tx)
            .await
            .map(drop)
    }
    async fn write(tx: &mut Self::Connection, holder: &str) {
        sqlx::query("INSERT INTO writes (holder) VALUES ($1)")
            .bind(holder)
            .execute(&mut *tx)
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
    async fn sell(tx: &mut Self::Connection) -> sqlx::Result<()> {
        sqlx::query("UPDATE stock SET sold = sold + 1 WHERE sku = 'SK-1'")
            .execute(tx)
            .await
            .map(drop)
    }
    async fn write(tx: &mut Self::Connection, holder: &str) {
        sqlx::query("INSERT INTO writes (holder) VALUES (?1)")
            .bind(holder)
            .execute(&mut *tx)
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
    let mut tx = redguard::lock::begin_fenced(pool, RESOURCE, fence).await?;
    DB::write(&mut tx, holder).await;
    tx.commit().await
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
    for bad in ["", &"r".repeat(redguard::lock::MAX_FENCED_RESOURCE + 1)] {
        assert!(matches!(
            redguard::lock::begin_fenced(&pool, bad, 1).await,
            Err(Error::Config(_))
        ));
    }
}

/// Postgres with the stock row both holders write, beside the fence row.
async fn postgres_with_stock(pg: &Postgres) -> Pool<Pg> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(12)
        .connect(&pg.url())
        .await
        .expect("connect to the test postgres");
    sqlx::raw_sql(POSTGRES_MIGRATION)
        .execute(&pool)
        .await
        .expect("migrate");
    sqlx::raw_sql(
        "CREATE TABLE writes (id BIGSERIAL PRIMARY KEY, holder TEXT NOT NULL); \
         CREATE TABLE stock (sku TEXT PRIMARY KEY, sold BIGINT NOT NULL); \
         INSERT INTO stock VALUES ('SK-1', 0)",
    )
    .execute(&pool)
    .await
    .expect("create writes and stock");
    pool
}

/// Issue 45: a stale holder that wrote and then fenced, against the current holder that
/// fenced and then wrote, took the two rows in opposite orders: Postgres found a deadlock
/// (40P01) and aborted one of them, maybe the current holder's legitimate write. Now a write
/// can only follow the fence: the stale holder's transaction waits at its first statement
/// for the current one to commit, then is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_stale_write_before_its_fence_does_not_deadlock_the_current_holder() {
    let pg = Postgres::start();
    let pool = postgres_with_stock(&pg).await;
    let (stale_fence, current_fence) = (10, 11);
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let current = tokio::spawn({
        let (pool, barrier) = (pool.clone(), barrier.clone());
        async move {
            let mut tx = redguard::lock::begin_fenced(&pool, RESOURCE, current_fence).await?;
            barrier.wait().await;
            // The stale holder is at its write now, waiting for the fence row.
            tokio::time::sleep(Duration::from_millis(200)).await;
            sell(&mut tx, "current").await?;
            tx.commit().await
        }
    });
    let stale = tokio::spawn({
        let (pool, barrier) = (pool.clone(), barrier.clone());
        async move {
            barrier.wait().await;
            let mut tx = redguard::lock::begin_fenced(&pool, RESOURCE, stale_fence).await?;
            sell(&mut tx, "stale").await?;
            tx.commit().await
        }
    });
    let (stale, current) = (stale.await.unwrap(), current.await.unwrap());
    assert!(
        current.is_ok(),
        "the current holder's write is aborted: {current:?}"
    );
    assert!(
        matches!(stale, Err(Error::LockLost { .. })),
        "the stale holder: {stale:?}"
    );
    assert_eq!(Pg::writes(&pool).await, ["current"]);
    let sold: i64 = sqlx::query_scalar("SELECT sold FROM stock")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(sold, 1, "only the current holder's write commits");
}

/// A holder's write: the stock row every holder updates, and the log of writes.
async fn sell<DB: WritesDb>(
    tx: &mut redguard::lock::FencedTransaction<'_, DB>,
    holder: &str,
) -> redguard::Result<()> {
    DB::sell(tx)
        .await
        .map_err(redguard::idempotency::sql_failure)?;
    DB::write(tx, holder).await;
    Ok(())
}

/// Holders with fences 1..=HOLDERS start in a shuffled order, each fencing and then writing
/// the one stock row twice with pauses between: a holder whose fence is older than a committed
/// one is refused; every other write commits (none aborted by a deadlock), and the committed
/// writes' fences increase in commit order.
async fn many_holders<DB: WritesDb>(pool: &Pool<DB>) {
    const HOLDERS: u64 = 16;
    let mut order: Vec<u64> = (1..=HOLDERS).collect();
    // A fixed shuffle: stale holders arrive both before and after newer ones.
    order.sort_by_key(|fence| (fence * 7919) % 13);
    let holders = order.into_iter().enumerate().map(|(at, fence)| {
        let pool = pool.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(5 * at as u64)).await;
            let result = async {
                let mut tx = redguard::lock::begin_fenced(&pool, RESOURCE, fence).await?;
                tokio::time::sleep(Duration::from_millis(10)).await;
                sell(&mut tx, &fence.to_string()).await?;
                tokio::time::sleep(Duration::from_millis(10)).await;
                tx.commit().await
            }
            .await;
            (fence, result)
        }
    });
    let (mut refused, mut aborted) = (Vec::new(), Vec::new());
    for outcome in futures_util::future::join_all(holders).await {
        match outcome {
            (_, Ok(())) => {}
            (fence, Err(Error::LockLost { .. })) => refused.push(fence),
            (fence, Err(err)) => aborted.push((fence, err.to_string())),
        }
    }
    assert!(aborted.is_empty(), "legitimate writes aborted: {aborted:?}");
    let committed: Vec<u64> = DB::writes(pool)
        .await
        .iter()
        .map(|holder| holder.parse().unwrap())
        .collect();
    let stale_commits = committed.windows(2).filter(|w| w[1] < w[0]).count();
    assert_eq!(stale_commits, 0, "stale writes committed: {committed:?}");
    let newest = *committed.last().expect("some holder commits");
    assert_eq!(newest, HOLDERS, "the newest holder commits");
    for fence in &refused {
        assert!(
            committed.iter().any(|c| c > fence),
            "{fence} refused with no newer write committed: {committed:?}"
        );
    }
    assert_eq!(committed.len() + refused.len(), HOLDERS as usize);
    println!("committed in order {committed:?}, refused {refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_many_holders_commit_no_stale_write_and_abort_no_legitimate_one() {
    let pg = Postgres::start();
    many_holders(&postgres_with_stock(&pg).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_many_holders_commit_no_stale_write_and_abort_no_legitimate_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pool = sqlite(&dir, true).await;
    sqlx::raw_sql(
        "CREATE TABLE stock (sku TEXT PRIMARY KEY, sold INTEGER NOT NULL); \
         INSERT INTO stock VALUES ('SK-1', 0)",
    )
    .execute(&pool)
    .await
    .expect("create stock");
    many_holders(&pool).await;
}
