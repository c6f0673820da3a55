//! `#[idempotent]` against Redis specifics: records' shape and TTL, and the fail-closed policy
//! while Redis is down.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redguard::{Classify, Error, Redguard, handle::FailMode, idempotent, key::GuardKind};
use redguard_tests::RedisServer;

#[derive(Debug)]
struct E(Error);

impl From<Error> for E {
    fn from(err: Error) -> Self {
        E(err)
    }
}

impl Classify for E {}

#[idempotent(key = "job:{id}", expire = "2m", scope = "billing")]
async fn job(id: u64, runs: Arc<AtomicUsize>) -> Result<u64, E> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[tokio::test]
async fn record_is_a_hash_with_status_and_ttl() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    rg.scope(job(5, runs.clone())).await.unwrap();
    let key = "redguard:idem:{billing:job:5}";
    assert_eq!(server.keys(), vec![key.to_owned()]);
    let mut conn = server.connection();
    let status: String = redis::cmd("HGET")
        .arg(key)
        .arg("status")
        .query(&mut conn)
        .unwrap();
    let result: String = redis::cmd("HGET")
        .arg(key)
        .arg("result")
        .query(&mut conn)
        .unwrap();
    assert_eq!((status.as_str(), result.as_str()), ("S", "5"));
    let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).unwrap();
    assert!((110_000..=120_000).contains(&ttl), "ttl {ttl}");
}

#[tokio::test]
async fn garbage_record_is_an_error_not_a_success() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let key = "redguard:idem:{billing:job:6}";
    let mut conn = server.connection();
    let _: () = redis::cmd("HSET")
        .arg(key)
        .arg("status")
        .arg("DONE?")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("EXPIRE")
        .arg(key)
        .arg(60)
        .query(&mut conn)
        .unwrap();
    let result = rg.scope(job(6, runs.clone())).await;
    assert!(
        matches!(&result, Err(E(Error::Corrupt { key: k, .. })) if k == key),
        "{result:?}"
    );
    let _: () = redis::cmd("DEL").arg(key).query(&mut conn).unwrap();
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("x")
        .arg("EX")
        .arg(60)
        .query(&mut conn)
        .unwrap();
    let result = rg.scope(job(6, runs.clone())).await;
    assert!(
        matches!(&result, Err(E(Error::Corrupt { .. }))),
        "{result:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn redis_down_fails_closed_by_default_and_open_when_configured() {
    let mut server = RedisServer::start();
    let closed = Redguard::redis(server.url())
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let open = Redguard::redis(server.url())
        .fail_mode(GuardKind::Idempotency, FailMode::Open)
        .connect()
        .await
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    server.kill();
    // Fail-closed (the default): refused, the body does not run.
    let refused = closed.scope(job(8, runs.clone())).await;
    assert!(matches!(refused, Err(E(Error::Backend(_)))), "{refused:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // Fail-open, when configured: the body runs without a record.
    assert_eq!(open.scope(job(8, runs.clone())).await.unwrap(), 8);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    server.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match closed.scope(job(9, runs.clone())).await {
            Ok(9) => break,
            Err(E(Error::Backend(_))) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("did not recover: {other:?}"),
        }
    }
    closed.scope(job(9, runs.clone())).await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the replay after recovery must not run"
    );
}
