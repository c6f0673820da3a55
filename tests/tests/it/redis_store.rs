//! The Redis store's plumbing under real faults: a killed, restarted, paused or flushed
//! server, and input that must never reach it.

use std::time::{Duration, Instant};

use redguard::{Error, Redguard, handle::FailMode, key::GuardKind};
use redguard_tests::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(200);
/// Scheduling noise allowed on top of the configured timeout on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(300);

async fn connect(server: &RedisServer, mode: FailMode) -> Redguard {
    Redguard::redis(server.url())
        .timeout(TIMEOUT)
        .fail_mode(GuardKind::Idempotency, mode)
        .connect()
        .await
        .expect("connect to the test redis-server")
}

fn redis_ttl_ms(server: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut server.connection())
        .unwrap()
}

#[tokio::test]
async fn keys_carry_the_prefix_hash_tag_and_ttl() {
    let server = RedisServer::start();
    let rg = Redguard::redis(server.url())
        .prefix("shop")
        .connect()
        .await
        .unwrap();
    let token = rg
        .tokens()
        .issue("checkout", Duration::from_secs(90))
        .await
        .unwrap();
    let key = format!("shop:token:{{tokens:{token}}}");
    assert_eq!(server.keys(), vec![key.clone()]);
    let ttl = redis_ttl_ms(&server, &key);
    assert!((89_000..=90_000).contains(&ttl), "ttl {ttl}");
    rg.tokens().consume("checkout", &token).await.unwrap();
    // The tombstone keeps the token's remaining life, no more.
    let ttl = redis_ttl_ms(&server, &key);
    assert!((88_000..=90_000).contains(&ttl), "tombstone ttl {ttl}");
}

#[tokio::test]
async fn invalid_input_writes_nothing() {
    let server = RedisServer::start();
    let rg = connect(&server, FailMode::Closed).await;
    let tokens = rg.tokens();
    for scene in ["a b", "x\ny", "*", "{tag}", "é", &"s".repeat(65)] {
        let issued = tokens.issue(scene, Duration::from_secs(60)).await;
        assert!(
            matches!(issued, Err(Error::InvalidKey { .. })),
            "{scene:?}: {issued:?}"
        );
    }
    for token in ["a:b", "*", "", &"t".repeat(65)] {
        let consumed = tokens.consume("checkout", token).await;
        assert!(
            matches!(consumed, Err(Error::TokenUnknown)),
            "{token:?}: {consumed:?}"
        );
    }
    assert!(server.keys().is_empty(), "written: {:?}", server.keys());
}

#[tokio::test]
async fn bad_prefix_and_url_are_config_errors() {
    let server = RedisServer::start();
    let bad_prefix = Redguard::redis(server.url())
        .prefix("my app")
        .connect()
        .await;
    assert!(
        matches!(bad_prefix, Err(Error::InvalidKey { .. })),
        "{bad_prefix:?}"
    );
    let bad_url = Redguard::redis("http://localhost").connect().await;
    assert!(matches!(bad_url, Err(Error::Config(_))), "{bad_url:?}");
    // A clock on a Redis builder is refused without the `test-util` feature, which this
    // crate enables (tests pin the scripts' clock with it); a trybuild case tests the
    // refusal in a build without it (ui-tests/tests/pass/clock-on-redis-is-refused.rs).
}

#[tokio::test]
async fn connect_to_nothing_fails_within_the_connect_timeout() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let started = Instant::now();
    let result = Redguard::redis(url)
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await;
    assert!(matches!(result, Err(Error::Backend(_))), "{result:?}");
    assert!(started.elapsed() < Duration::from_millis(500) + SLACK);
}

#[tokio::test]
async fn killed_server_gives_backend_errors_then_recovers_after_restart() {
    let mut server = RedisServer::start();
    let rg = connect(&server, FailMode::Closed).await;
    let tokens = rg.tokens();
    let token = tokens.issue("a", Duration::from_secs(60)).await.unwrap();

    server.kill();
    for _ in 0..3 {
        let started = Instant::now();
        let result = tokens.consume("a", &token).await;
        assert!(matches!(result, Err(Error::Backend(_))), "{result:?}");
        assert!(
            started.elapsed() < TIMEOUT + SLACK,
            "took {:?}",
            started.elapsed()
        );
    }

    // Restarted empty: the consume script is gone (NOSCRIPT) and must be re-loaded unasked.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    let recovered = loop {
        match tokens.issue("a", Duration::from_secs(60)).await {
            Ok(token) => break token,
            Err(Error::Backend(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("did not recover: {other:?}"),
        }
    };
    tokens.consume("a", &recovered).await.unwrap();
    let replay = tokens.consume("a", &recovered).await;
    assert!(matches!(replay, Err(Error::TokenUsed)), "{replay:?}");
}

#[tokio::test]
async fn script_flush_is_transparent() {
    let server = RedisServer::start();
    let rg = connect(&server, FailMode::Closed).await;
    let token = rg
        .tokens()
        .issue("a", Duration::from_secs(60))
        .await
        .unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.connection())
        .unwrap();
    rg.tokens().consume("a", &token).await.unwrap();
}

#[tokio::test]
async fn paused_server_times_out_instead_of_hanging() {
    let server = RedisServer::start();
    let rg = connect(&server, FailMode::Closed).await;
    let token = rg
        .tokens()
        .issue("a", Duration::from_secs(60))
        .await
        .unwrap();

    server.pause();
    for _ in 0..3 {
        let started = Instant::now();
        let result = rg.tokens().consume("a", &token).await;
        let elapsed = started.elapsed();
        server_resume_on_panic(&server, || {
            assert!(
                matches!(&result, Err(Error::Backend(err)) if err.is_timeout()),
                "{result:?}"
            );
            assert!(elapsed < TIMEOUT + SLACK, "took {elapsed:?}");
        });
    }
    server.resume();
    // The same connection serves again once Redis answers. The timed-out calls were already
    // written to the socket, so Redis ran them on resume (a timeout is an unknown outcome);
    // each was followed by a restore on the same connection, so the token, refused to the
    // caller, is not burnt.
    let deadline = Instant::now() + Duration::from_secs(5);
    let fresh = loop {
        match rg.tokens().issue("a", Duration::from_secs(60)).await {
            Ok(token) => break token,
            Err(Error::Backend(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("did not recover: {other:?}"),
        }
    };
    rg.tokens().consume("a", &token).await.unwrap();
    rg.tokens().consume("a", &fresh).await.unwrap();
}

fn server_resume_on_panic(server: &RedisServer, check: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)) {
        server.resume();
        std::panic::resume_unwind(panic);
    }
}

#[tokio::test]
async fn degradation_policy_applies_when_redis_is_down() {
    let mut server = RedisServer::start();
    let open = connect(&server, FailMode::Open).await;
    let closed = connect(&server, FailMode::Closed).await;
    let token = open
        .tokens()
        .issue("a", Duration::from_secs(60))
        .await
        .unwrap();
    server.kill();
    // Fail-open lets the call through; fail-closed refuses it.
    open.tokens().consume("a", &token).await.unwrap();
    let refused = closed.tokens().consume("a", &token).await;
    assert!(matches!(refused, Err(Error::Backend(_))), "{refused:?}");
    // Validation still comes first: a malformed token is refused even when failing open.
    let forged = open.tokens().consume("a", "bad token").await;
    assert!(matches!(forged, Err(Error::TokenUnknown)), "{forged:?}");
}

#[tokio::test]
async fn foreign_data_at_a_guard_key_is_reported_not_trusted() {
    let server = RedisServer::start();
    let rg = connect(&server, FailMode::Open).await;
    let token = "0123456789abcdef0123456789abcdef";
    let key = format!("redguard:token:{{tokens:{token}}}");
    let _: () = redis::cmd("LPUSH")
        .arg(&key)
        .arg("x")
        .query(&mut server.connection())
        .unwrap();
    let _: () = redis::cmd("EXPIRE")
        .arg(&key)
        .arg(60)
        .query(&mut server.connection())
        .unwrap();
    let result = rg.tokens().consume("a", token).await;
    match result {
        Err(Error::Corrupt { key: reported, .. }) => assert_eq!(reported, key),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// Issue 15: a handle on a connection the application already has (a `ConnectionManager`),
/// with lock waiters woken over a pub/sub connection opened from its client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_connection_manager_is_accepted() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let manager = client.get_connection_manager().await.unwrap();
    let rg = Redguard::redis_connection(client, manager)
        .prefix("own")
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    assert_eq!(rg.kind(), redguard::handle::StoreKind::Redis);
    let token = rg
        .tokens()
        .issue("t", Duration::from_secs(60))
        .await
        .unwrap();
    rg.tokens().consume("t", &token).await.unwrap();
    let limiter = redguard::limiter("own").rate("1/min").on(&rg);
    limiter.check().await.unwrap();
    assert!(matches!(limiter.check().await, Err(Error::RateLimited(_))));
    // A waiter is handed the lock when the holder releases it, well before its wait ends.
    let held = rg.lock("stock").acquire().await.unwrap();
    let waiter = {
        let rg = rg.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let guard = rg
                .lock("stock")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .unwrap();
            guard.release().await.unwrap();
            started.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await.unwrap();
    let waited = waiter.await.unwrap();
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.connection())
        .unwrap();
    assert!(keys.iter().all(|k| k.starts_with("own:")), "{keys:?}");
    server.assert_every_key_has_ttl();

    // TLS settings belong to the client of an existing connection.
    let client = redis::Client::open(server.url()).unwrap();
    let manager = client.get_connection_manager().await.unwrap();
    let err = Redguard::redis_connection(client, manager)
        .tls_root_ca(Vec::new())
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
}

/// Issue 45 (item 8): a connection known to be down fails at once. With Redis killed, after
/// the first few calls (each up to the timeout), 50 fail-open rate checks take far less than
/// 50 timeouts (the store's breaker fails them at once, one probe at a time going through);
/// after a restart the guards work again within about a second (a probe every 150 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_known_down_fails_at_once_and_recovers_after_a_restart() {
    let mut server = RedisServer::start();
    // Rate limits fail open (the default), tokens closed: a token issued means Redis answered.
    let rg = connect(&server, FailMode::Closed).await;
    let limiter = || {
        redguard::limiter("outage")
            .scope("it::redis_store::breaker")
            .rate("1000/s")
            .on(&rg)
    };
    assert!(limiter().decide().await.unwrap().allowed);
    server.kill();
    let first = Instant::now();
    for _ in 0..5 {
        assert!(limiter().decide().await.unwrap().allowed, "fails open");
    }
    let first = first.elapsed();
    let started = Instant::now();
    for _ in 0..50 {
        assert!(limiter().decide().await.unwrap().allowed, "fails open");
    }
    let outage = started.elapsed();
    eprintln!(
        "with Redis killed: the first 5 calls {:?} each, the next 50 {:?} each",
        first / 5,
        outage / 50
    );
    assert!(
        outage < TIMEOUT * 10,
        "50 fail-open checks took {outage:?} (timeout {TIMEOUT:?})"
    );

    server.restart();
    let restarted = Instant::now();
    let deadline = restarted + Duration::from_secs(10);
    loop {
        match rg.tokens().issue("a", Duration::from_secs(60)).await {
            Ok(_) => break,
            Err(Error::Backend(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(other) => panic!("did not recover: {other:?}"),
        }
    }
    let recovered = restarted.elapsed();
    eprintln!("the guards work again {recovered:?} after the restart");
    assert!(
        recovered < Duration::from_secs(1) + SLACK,
        "recovered {recovered:?} after the restart"
    );
    assert!(limiter().decide().await.unwrap().allowed);
}
