//! The outcome committed in the caller's transaction (feature `sqlx`), on a real Postgres the
//! harness starts and on SQLite files: the effect and its record commit together, a record
//! left PROCESSING or UNKNOWN is resolved from the database, misuse is refused with nothing
//! committed, and fault histories (Redis stalled around each step, futures dropped mid-body,
//! worker processes killed anywhere) show every intent's effect applied exactly once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redguard::{Error, Redguard};
use redguard_tests::RedisServer;
use redguard_tests::history::{self, Event, History, IdemOutcome};
use redguard_tests::postgres::Postgres;
use sqlx::{Pool, Postgres as Pg, Sqlite, Transaction};

use redguard::idempotency::{POSTGRES_MIGRATION as PG_MIGRATION, SQLITE_MIGRATION};

/// The test's side of a database: its effects table, written by the bodies.
trait TestDb: redguard::idempotency::OutcomeDatabase {
    async fn effect(
        tx: &mut Transaction<'static, Self>,
        intent: u64,
        call: &str,
        start: u64,
    ) -> sqlx::Result<()>;
    async fn effects(pool: &Pool<Self>) -> Vec<(u64, String, u64)>;
    async fn outcome_rows(pool: &Pool<Self>) -> u64;
    async fn exec(tx: &mut Transaction<'static, Self>, sql: &'static str) -> sqlx::Result<()>;
}

impl TestDb for Pg {
    async fn effect(
        tx: &mut Transaction<'static, Self>,
        intent: u64,
        call: &str,
        start: u64,
    ) -> sqlx::Result<()> {
        sqlx::query("INSERT INTO effects (intent, call_id, start) VALUES ($1, $2, $3)")
            .bind(intent as i64)
            .bind(call)
            .bind(start as i64)
            .execute(&mut **tx)
            .await
            .map(drop)
    }
    async fn effects(pool: &Pool<Self>) -> Vec<(u64, String, u64)> {
        let rows: Vec<(i64, String, i64)> =
            sqlx::query_as("SELECT intent, call_id, start FROM effects")
                .fetch_all(pool)
                .await
                .expect("read the effects");
        rows.into_iter()
            .map(|(i, c, s)| (i as u64, c, s as u64))
            .collect()
    }
    async fn outcome_rows(pool: &Pool<Self>) -> u64 {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM redguard_outcomes")
            .fetch_one(pool)
            .await
            .expect("count the outcome rows");
        n as u64
    }
    async fn exec(tx: &mut Transaction<'static, Self>, sql: &'static str) -> sqlx::Result<()> {
        sqlx::raw_sql(sql).execute(&mut **tx).await.map(drop)
    }
}

impl TestDb for Sqlite {
    async fn effect(
        tx: &mut Transaction<'static, Self>,
        intent: u64,
        call: &str,
        start: u64,
    ) -> sqlx::Result<()> {
        sqlx::query("INSERT INTO effects (intent, call_id, start) VALUES (?1, ?2, ?3)")
            .bind(intent as i64)
            .bind(call)
            .bind(start as i64)
            .execute(&mut **tx)
            .await
            .map(drop)
    }
    async fn effects(pool: &Pool<Self>) -> Vec<(u64, String, u64)> {
        let rows: Vec<(i64, String, i64)> =
            sqlx::query_as("SELECT intent, call_id, start FROM effects")
                .fetch_all(pool)
                .await
                .expect("read the effects");
        rows.into_iter()
            .map(|(i, c, s)| (i as u64, c, s as u64))
            .collect()
    }
    async fn outcome_rows(pool: &Pool<Self>) -> u64 {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM redguard_outcomes")
            .fetch_one(pool)
            .await
            .expect("count the outcome rows");
        n as u64
    }
    async fn exec(tx: &mut Transaction<'static, Self>, sql: &'static str) -> sqlx::Result<()> {
        sqlx::raw_sql(sql).execute(&mut **tx).await.map(drop)
    }
}

const EFFECTS: &str =
    "CREATE TABLE effects (intent BIGINT NOT NULL, call_id TEXT NOT NULL, start BIGINT NOT NULL)";

async fn postgres(server: &Postgres, migrate: bool) -> Pool<Pg> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&server.url())
        .await
        .expect("connect to the test postgres");
    if migrate {
        sqlx::raw_sql(PG_MIGRATION)
            .execute(&pool)
            .await
            .expect("migrate");
    }
    sqlx::raw_sql(EFFECTS)
        .execute(&pool)
        .await
        .expect("create effects");
    pool
}

async fn sqlite(dir: &tempfile::TempDir, migrate: bool) -> Pool<Sqlite> {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("app.db"))
        .create_if_missing(true)
        .busy_timeout(Duration::from_millis(300));
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
    sqlx::raw_sql(EFFECTS)
        .execute(&pool)
        .await
        .expect("create effects");
    pool
}

async fn connect(server: &RedisServer) -> Redguard {
    Redguard::redis(server.url())
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect to the test redis-server")
}

/// What a call does to itself, besides its effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// Redis stopped before the begin: the call fails closed, nothing runs.
    StallBegin,
    /// Redis stopped at the end of the body: the commit goes through, SUCCESS does not.
    StallFinish,
    /// The future dropped mid-body, after the effect was written: it rolls back.
    Drop,
}

struct Call<'a> {
    rg: &'a Redguard,
    redis: &'a RedisServer,
    intent: u64,
    call: String,
    fault: Fault,
}

/// One call of `intent` through the transactional outcome, as the history records it (or
/// `None` for a dropped call, which completes nothing).
async fn call<DB: TestDb>(pool: &Pool<DB>, c: Call<'_>) -> Option<IdemOutcome> {
    if c.fault == Fault::StallBegin {
        c.redis.pause();
    }
    let ran = AtomicUsize::new(0);
    let tx = pool.begin().await.expect("begin");
    let run =
        c.rg.idempotency(redguard::key("intent:{n}").part("n", &c.intent))
            .scope("sql-history")
            .expire(Duration::from_secs(3600))
            .transaction(tx)
            .run(async |mut tx| {
                let result = async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    DB::effect(&mut tx, c.intent, &c.call, history::now_us())
                        .await
                        .map_err(redguard::idempotency::sql_failure)?;
                    match c.fault {
                        Fault::StallFinish => c.redis.pause(),
                        Fault::Drop => std::future::pending::<()>().await,
                        Fault::None | Fault::StallBegin => {}
                    }
                    Ok::<_, Error>(c.intent * 7)
                }
                .await;
                (tx, result)
            });
    let bound = if c.fault == Fault::Drop { 300 } else { 5000 };
    let outcome = tokio::time::timeout(Duration::from_millis(bound), run).await;
    if matches!(c.fault, Fault::StallBegin | Fault::StallFinish) {
        c.redis.resume();
    }
    let outcome = outcome.ok()?;
    Some(match outcome {
        Ok(value) if ran.load(Ordering::SeqCst) > 0 => IdemOutcome::Ran(value),
        Ok(value) => IdemOutcome::Replayed(value),
        Err(Error::InProgress) => IdemOutcome::InProgress,
        Err(Error::Backend(_)) => IdemOutcome::Backend,
        Err(other) => IdemOutcome::Unexpected(other.to_string()),
    })
}

/// Runs `ops` calls over `intents` intents with random faults, then retries every intent
/// until it answers, and checks with the history checker that each committed effect is the
/// only one of its intent and that none is missing.
async fn fault_history<DB: TestDb>(
    pool: &Pool<DB>,
    redis: &RedisServer,
    ops: usize,
    intents: u64,
    worker: (&str, &str),
) {
    let rg = connect(redis).await;
    let mut rng = fastrand::Rng::with_seed(29);
    let mut hist = History::default();
    hist.run.0 = history::now_us();
    let mut faults = std::collections::BTreeMap::<String, usize>::new();
    // First worker processes, each SIGKILLed at a random moment of its stream of calls:
    // between a begin and its commit, between a commit and its SUCCESS, anywhere.
    // Each worker its own range of intents past the in-process ones, all retried in the tail.
    let rounds = ops / 30;
    let per_round = 40;
    let all = intents + rounds as u64 * per_round;
    for round in 0..rounds as u64 {
        let first = intents + round * per_round;
        let start = history::now_us();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sql_worker"))
            .args([redis.url(), worker.0.to_owned(), worker.1.to_owned()])
            .args([first.to_string(), (first + per_round).to_string()])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn sql_worker");
        tokio::time::sleep(Duration::from_millis(rng.u64(200..700))).await;
        child.kill().expect("SIGKILL the worker");
        let _ = child.wait();
        hist.faults.push(history::FaultSpan {
            kind: "sigkill-worker".into(),
            start,
            end: history::now_us(),
            loss: history::Loss::Nothing,
        });
    }
    faults.insert("SigkillWorker".into(), rounds);
    // Then every intent once more without faults, retried until it answers, so none is left
    // unanswered: a lost effect would show as an intent without one.
    let tail = (0..all).map(|intent| (intent, Fault::None, true));
    let random: Vec<_> = (0..ops)
        .map(|_| {
            let fault = match rng.u8(0..10) {
                0 => Fault::StallBegin,
                1 | 2 => Fault::StallFinish,
                3 => Fault::Drop,
                _ => Fault::None,
            };
            (rng.u64(0..intents), fault, false)
        })
        .collect();
    for (n, (intent, fault, until_answered)) in random.into_iter().chain(tail).enumerate() {
        *faults.entry(format!("{fault:?}")).or_default() += 1;
        for attempt in 0..100 {
            let call_id = format!("c{n}.{attempt}");
            let invoke = history::now_us();
            let faulted = call(
                pool,
                Call {
                    rg: &rg,
                    redis,
                    intent,
                    call: call_id.clone(),
                    fault,
                },
            )
            .await;
            if fault != Fault::None {
                hist.faults.push(history::FaultSpan {
                    kind: format!("{fault:?}"),
                    start: invoke,
                    end: history::now_us(),
                    loss: history::Loss::Nothing,
                });
            }
            let outcome = faulted;
            let answered = matches!(
                outcome,
                Some(IdemOutcome::Ran(_) | IdemOutcome::Replayed(_))
            );
            if let Some(outcome) = outcome {
                hist.events.push(Event::Idem {
                    intent,
                    call: call_id,
                    invoke,
                    complete: history::now_us(),
                    outcome,
                });
            }
            if answered || !until_answered {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    hist.run.1 = history::now_us();
    // Executions are the committed effects: a body whose transaction rolled back did nothing.
    let effects = DB::effects(pool).await;
    let invokes: std::collections::HashMap<String, u64> = hist
        .events
        .iter()
        .filter_map(|event| match event {
            Event::Idem { call, invoke, .. } => Some((call.clone(), *invoke)),
            _ => None,
        })
        .collect();
    for (intent, call_id, start) in &effects {
        hist.events.push(Event::Exec {
            intent: *intent,
            call: call_id.clone(),
            invoke: invokes.get(call_id).copied().unwrap_or(*start),
            start: *start,
        });
    }
    let report = history::check(&hist);
    println!("{report}");
    println!(
        "calls by fault: {faults:?}; committed effects {} (from workers {})",
        effects.len(),
        effects.iter().filter(|e| e.1.starts_with('w')).count()
    );
    // This history has no lock workload, whose progress the checker also expects.
    let violations: Vec<_> = report
        .violations
        .iter()
        .filter(|v| !v.starts_with("lock progress"))
        .collect();
    assert!(violations.is_empty(), "{report}");
    let mut per_intent = vec![0usize; all as usize];
    for (intent, _, _) in &effects {
        per_intent[*intent as usize] += 1;
    }
    let lost: Vec<_> = (0..all).filter(|i| per_intent[*i as usize] == 0).collect();
    let twice: Vec<_> = (0..all).filter(|i| per_intent[*i as usize] > 1).collect();
    assert!(lost.is_empty(), "intents whose effect was lost: {lost:?}");
    assert!(twice.is_empty(), "intents applied twice: {twice:?}");
    assert_eq!(
        DB::outcome_rows(pool).await,
        all,
        "one outcome row per intent"
    );
    redis.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_fault_history_applies_every_effect_exactly_once() {
    let (pg, redis) = (Postgres::start(), RedisServer::start());
    let pool = postgres(&pg, true).await;
    let url = pg.url();
    fault_history(
        &pool,
        &redis,
        ops("REDGUARD_SQL_OPS", 300),
        40,
        ("postgres", &url),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_fault_history_applies_every_effect_exactly_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = RedisServer::start();
    let pool = sqlite(&dir, true).await;
    let file = dir.path().join("app.db");
    let file = file.to_str().expect("a UTF-8 temp path");
    fault_history(
        &pool,
        &redis,
        ops("REDGUARD_SQL_OPS", 300),
        40,
        ("sqlite", file),
    )
    .await;
}

/// The CI count, or the long run's (`scripts/test-long` sets it to thousands).
fn ops(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The body's effect, its outcome row and SUCCESS: a retry replays from Redis, and once the
/// Redis record is gone (flushed: as after `expire`), from the row, the body not running.
async fn commits_and_replays<DB: TestDb>(pool: &Pool<DB>, redis: &RedisServer) {
    let rg = connect(redis).await;
    let runs = AtomicUsize::new(0);
    let place = async || {
        let tx = pool.begin().await.expect("begin");
        rg.idempotency(redguard::key("order:{id}").part("id", &5u64))
            .scope("orders")
            .payload(&("widget", 2))
            .transaction(tx)
            .run(async |mut tx| {
                let result = async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    DB::effect(&mut tx, 5, "place", 0)
                        .await
                        .map_err(redguard::idempotency::sql_failure)?;
                    Ok::<_, Error>(String::from("placed 5"))
                }
                .await;
                (tx, result)
            })
            .await
    };
    assert_eq!(place().await.expect("first"), "placed 5");
    assert_eq!(place().await.expect("replay from Redis"), "placed 5");
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut redis.connection())
        .expect("flush");
    let (again, replayed) = redguard::idempotency::track_replay(place()).await;
    assert_eq!(
        (again.expect("replay from the row"), replayed),
        ("placed 5".into(), true)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(DB::effects(pool).await.len(), 1);
    // Another payload for the same key is refused from the row too.
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut redis.connection())
        .expect("flush");
    let tx = pool.begin().await.expect("begin");
    let reuse = rg
        .idempotency(redguard::key("order:{id}").part("id", &5u64))
        .scope("orders")
        .payload(&("gadget", 1))
        .transaction(tx)
        .run(async |tx| (tx, Ok::<_, Error>(String::new())))
        .await;
    assert!(matches!(reuse, Err(Error::KeyReuse)), "{reuse:?}");
    redis.assert_every_key_has_ttl();
}

#[tokio::test]
async fn postgres_commits_the_outcome_with_the_effect_and_replays_from_the_row() {
    let (pg, redis) = (Postgres::start(), RedisServer::start());
    commits_and_replays(&postgres(&pg, true).await, &redis).await;
}

#[tokio::test]
async fn sqlite_commits_the_outcome_with_the_effect_and_replays_from_the_row() {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = RedisServer::start();
    commits_and_replays(&sqlite(&dir, true).await, &redis).await;
}

/// The window the issue is about: committed, then Redis stalls before SUCCESS. The record
/// stays PROCESSING for `expire` (a plain guard answers `InProgress` until then); here the
/// retry finds the row and replays at once. Then the other window: a body dropped between
/// its effect and the commit leaves UNKNOWN; its effects rolled back, so a retry runs at once.
/// And an execution alive in its transaction still answers `InProgress`.
async fn resolves_from_the_row<DB: TestDb>(pool: &Pool<DB>, redis: &RedisServer) {
    let rg = connect(redis).await;
    // Committed, then the network to Redis cut for good (as a process dying there): the
    // SUCCESS never arrives.
    let proxy = redguard_tests::proxy::Proxy::start(redis.port());
    let cut = Redguard::redis(proxy.url())
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect through the proxy");
    let tx = pool.begin().await.expect("begin");
    let first = cut
        .idempotency(redguard::key("intent:{n}").part("n", &1u64))
        .scope("sql-history")
        .expire(Duration::from_secs(3600))
        .transaction(tx)
        .run(async |mut tx| {
            let result = DB::effect(&mut tx, 1, "first", 0)
                .await
                .map(|()| 7u64)
                .map_err(redguard::idempotency::sql_failure);
            proxy.set(redguard_tests::proxy::Fault::Blackhole);
            (tx, result)
        })
        .await;
    assert_eq!(first.expect("the body's result"), 7);
    drop((cut, proxy));
    // The window itself: committed, and Redis still says PROCESSING.
    let admin = redguard::admin::Admin::new(rg.clone());
    let record = admin
        .key(
            redguard::key::GuardKind::Idempotency,
            "sql-history",
            "intent:1",
        )
        .expect("admin key");
    let status = admin.inspect(&record).await.expect("inspect").record;
    assert_eq!(status.map(|r| r.status).as_deref(), Some("processing"));
    let retry = Call {
        rg: &rg,
        redis,
        intent: 1,
        call: "retry".into(),
        fault: Fault::None,
    };
    assert_eq!(call(pool, retry).await, Some(IdemOutcome::Replayed(7)));

    let dropped = Call {
        rg: &rg,
        redis,
        intent: 2,
        call: "dropped".into(),
        fault: Fault::Drop,
    };
    assert_eq!(call(pool, dropped).await, None);
    let retry = Call {
        rg: &rg,
        redis,
        intent: 2,
        call: "retry".into(),
        fault: Fault::None,
    };
    assert_eq!(call(pool, retry).await, Some(IdemOutcome::Ran(14)));

    // A live execution holds its row: a duplicate is told it is in progress.
    let (entered_tx, entered) = tokio::sync::oneshot::channel::<()>();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let first = async {
        let tx = pool.begin().await.expect("begin");
        rg.idempotency(redguard::key("intent:{n}").part("n", &3u64))
            .scope("sql-history")
            .transaction(tx)
            .run(async |mut tx| {
                let result = async {
                    DB::effect(&mut tx, 3, "live", 0)
                        .await
                        .map_err(redguard::idempotency::sql_failure)?;
                    let _ = entered_tx.send(());
                    let _ = released.await;
                    Ok::<_, Error>(21u64)
                }
                .await;
                (tx, result)
            })
            .await
    };
    let duplicate = async {
        let _ = entered.await;
        let tx = pool.begin().await.expect("begin");
        let answer = rg
            .idempotency(redguard::key("intent:{n}").part("n", &3u64))
            .scope("sql-history")
            .transaction(tx)
            .run(async |tx| (tx, Ok::<_, Error>(0u64)))
            .await;
        let _ = release.send(());
        answer
    };
    let (first, duplicate) = tokio::join!(first, duplicate);
    assert_eq!(first.expect("first"), 21);
    assert!(matches!(duplicate, Err(Error::InProgress)), "{duplicate:?}");
    let effects = DB::effects(pool).await;
    assert_eq!(effects.len(), 3, "{effects:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_resolves_a_gone_execution_from_the_row() {
    let (pg, redis) = (Postgres::start(), RedisServer::start());
    resolves_from_the_row(&postgres(&pg, true).await, &redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_resolves_a_gone_execution_from_the_row() {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = RedisServer::start();
    resolves_from_the_row(&sqlite(&dir, true).await, &redis).await;
}

/// Misuse, each refused with nothing of the body committed.
async fn refuses_misuse<DB: TestDb>(pool: &Pool<DB>, redis: &RedisServer) {
    let rg = connect(redis).await;
    let guard = |id: u64| {
        rg.idempotency(redguard::key("misuse:{id}").part("id", &id))
            .scope("misuse")
    };
    // A raw COMMIT fails (the claimed row's deferred check); nothing commits without its row.
    let tx = pool.begin().await.expect("begin");
    let mut commit_failed = false;
    let committed = guard(1)
        .transaction(tx)
        .run(async |mut tx| {
            let result = async {
                DB::effect(&mut tx, 1, "commit", 0)
                    .await
                    .map_err(redguard::idempotency::sql_failure)?;
                commit_failed = DB::exec(&mut tx, "COMMIT").await.is_err();
                Ok::<_, Error>(1u64)
            }
            .await;
            (tx, result)
        })
        .await;
    assert!(commit_failed, "the body's own COMMIT went through");
    let effects = DB::effects(pool).await.len() as u64;
    assert_eq!(
        effects,
        DB::outcome_rows(pool).await,
        "an effect committed without its outcome row ({committed:?})"
    );

    // A raw ROLLBACK is caught at the end of the body: an error, no SUCCESS, a retry runs.
    let before = DB::effects(pool).await.len();
    let tx = pool.begin().await.expect("begin");
    let rolled = guard(2)
        .transaction(tx)
        .run(async |mut tx| {
            let result = async {
                DB::effect(&mut tx, 2, "rollback", 0)
                    .await
                    .map_err(redguard::idempotency::sql_failure)?;
                DB::exec(&mut tx, "ROLLBACK")
                    .await
                    .map_err(redguard::idempotency::sql_failure)?;
                Ok::<_, Error>(2u64)
            }
            .await;
            (tx, result)
        })
        .await;
    match rolled {
        Err(Error::Config(why)) => assert!(why.contains("ended the transaction"), "{why}"),
        other => panic!("a body's own ROLLBACK was not refused: {other:?}"),
    }
    assert_eq!(DB::effects(pool).await.len(), before);
    let tx = pool.begin().await.expect("begin");
    let retried = guard(2)
        .transaction(tx)
        .run(async |mut tx| {
            let result = async {
                DB::effect(&mut tx, 2, "retry", 0)
                    .await
                    .map_err(redguard::idempotency::sql_failure)?;
                Ok::<_, Error>(2u64)
            }
            .await;
            (tx, result)
        })
        .await;
    assert_eq!(retried.expect("the retry runs"), 2);

    // A result the column does not hold: refused, rolled back.
    let before = DB::effects(pool).await.len();
    let tx = pool.begin().await.expect("begin");
    let large = guard(3)
        .transaction(tx)
        .run(async |mut tx| {
            let result = async {
                DB::effect(&mut tx, 3, "large", 0)
                    .await
                    .map_err(redguard::idempotency::sql_failure)?;
                Ok::<_, Error>("x".repeat(redguard::idempotency::MAX_SQL_RESULT_BYTES))
            }
            .await;
            (tx, result)
        })
        .await;
    match large {
        Err(Error::Config(why)) => assert!(why.contains("at most"), "{why}"),
        other => panic!(
            "a too-large result was not refused: {:?}",
            other.map(|s| s.len())
        ),
    }
    assert_eq!(DB::effects(pool).await.len(), before);
    redis.assert_every_key_has_ttl();
}

/// A database without the migration: a clear error naming it, the body never started.
async fn refuses_a_missing_table<DB: TestDb>(pool: &Pool<DB>, redis: &RedisServer) {
    let rg = connect(redis).await;
    let runs = AtomicUsize::new(0);
    let tx = pool.begin().await.expect("begin");
    let missing = rg
        .idempotency("no-table")
        .scope("misuse")
        .transaction(tx)
        .run(async |tx| {
            runs.fetch_add(1, Ordering::SeqCst);
            (tx, Ok::<_, Error>(0u64))
        })
        .await;
    match missing {
        Err(Error::Config(why)) => assert!(why.contains("0001_redguard_outcomes.sql"), "{why}"),
        other => panic!("a missing table was not refused: {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn postgres_refuses_misuse_before_any_effect_commits() {
    let (pg, redis) = (Postgres::start(), RedisServer::start());
    refuses_misuse(&postgres(&pg, true).await, &redis).await;
    let bare = Postgres::start();
    refuses_a_missing_table(&postgres(&bare, false).await, &redis).await;
}

#[tokio::test]
async fn sqlite_refuses_misuse_before_any_effect_commits() {
    let (dir, bare) = (
        tempfile::tempdir().expect("temp dir"),
        tempfile::tempdir().expect("temp dir"),
    );
    let redis = RedisServer::start();
    refuses_misuse(&sqlite(&dir, true).await, &redis).await;
    refuses_a_missing_table(&sqlite(&bare, false).await, &redis).await;
}

/// The retention query deletes expired rows only, bounded by its limit.
#[tokio::test]
async fn sqlite_purge_deletes_only_expired_rows_in_bounded_batches() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pool = sqlite(&dir, true).await;
    for (i, expires_at) in [(0, 1i64), (1, 2), (2, 3), (3, i64::MAX)] {
        sqlx::query("INSERT INTO redguard_outcomes (scope, idem_key, fingerprint, owner, result, expires_at) VALUES ('s', ?1, '', 'o', x'31', ?2)")
            .bind(format!("k{i}"))
            .bind(expires_at)
            .execute(&pool)
            .await
            .expect("insert");
    }
    let mut conn = pool.acquire().await.expect("acquire");
    let first = redguard::idempotency::purge_expired::<Sqlite>(&mut conn, 2)
        .await
        .expect("purge");
    let second = redguard::idempotency::purge_expired::<Sqlite>(&mut conn, 2)
        .await
        .expect("purge");
    drop(conn);
    assert_eq!((first, second), (2, 1));
    assert_eq!(Sqlite::outcome_rows(&pool).await, 1);
}

/// A web handler's future must be `Send` (axum's, tower's): the transactional run's is, with
/// a body that holds the transaction across its awaits.
#[tokio::test]
async fn the_transactional_run_is_send() {
    fn send<F: std::future::Future + Send>(future: F) -> F {
        future
    }
    let pool = sqlx::PgPool::connect_lazy("postgres://nobody@127.0.0.1:1/none").expect("lazy pool");
    let rg = Redguard::memory();
    // Built and dropped unpolled: the check is the compiler's.
    drop(send(async move {
        let tx = pool
            .begin()
            .await
            .map_err(redguard::idempotency::sql_failure)?;
        rg.idempotency("k")
            .transaction(tx)
            .run(async |mut tx| {
                let result = async {
                    sqlx::query("SELECT 1")
                        .execute(&mut *tx)
                        .await
                        .map_err(redguard::idempotency::sql_failure)?;
                    Ok::<_, Error>(1u64)
                }
                .await;
                (tx, result)
            })
            .await
    }));
}
