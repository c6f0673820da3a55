//! redguard works under a Redis user restricted to the commands it uses and to keys and
//! channels under its prefix — the ACL line the README documents.

use std::time::Duration;

use redguard::{Algorithm, Error, Idempotency, KeyBuilder, Redguard};
use redguard_tests::RedisServer;

/// Keep in sync with README.md ("Redis Cluster, TLS, restricted users").
const ACL: &str = "on >secret ~redguard:* resetchannels &redguard:* -@all \
    +evalsha +eval +script|load +time +ping +hello +psubscribe +punsubscribe \
    +set +get +del +exists +type +hget +hset +hmget +hdel +hgetall +hincrby +incr +pexpire \
    +pexpiretime +pttl +publish +unlink +zadd +zcard +zcount +zrange +zrem +zremrangebyrank \
    +zremrangebyscore +zscore";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_guard_works_under_the_documented_acl() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg("redguard");
    for rule in ACL.split_whitespace() {
        setuser.arg(rule);
    }
    let _: () = setuser.query(&mut admin).unwrap();
    let url = format!("redis://redguard:secret@127.0.0.1:{}/", server.port());
    // Rate limits fail closed here, so that a refused command is an error, not an admission.
    let rg = Redguard::redis(url)
        .fail_mode(redguard::GuardKind::RateLimit, redguard::FailMode::Closed)
        .connect()
        .await
        .expect("connect as the restricted user");

    // Tokens.
    let token = rg
        .tokens()
        .issue("acl", Duration::from_secs(60))
        .await
        .unwrap();
    rg.tokens().consume("acl", &token).await.unwrap();

    // Idempotency: first run, replay.
    for _ in 0..2 {
        let key = KeyBuilder::new().part("id", &1u64).finish().unwrap();
        let value = rg
            .scope(Idempotency::new("acl", key).run(async { Ok::<_, Error>(5) }))
            .await
            .unwrap();
        assert_eq!(value, 5);
    }

    // Locks, with a waiter woken through pub/sub, and the other kinds.
    let held = rg.lock("acl:lock").acquire().await.unwrap();
    let waiter = {
        let rg = rg.clone();
        tokio::spawn(async move {
            rg.lock("acl:lock")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .map(|guard| guard.fence())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first = held.fence();
    held.release().await.unwrap();
    assert!(waiter.await.unwrap().unwrap() > first);
    rg.lock("acl:fair")
        .fair()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    rg.lock("acl:sem")
        .permits(2)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    rg.lock("acl:rw")
        .read()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    rg.lock("acl:rw")
        .write()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // Rate limits, every algorithm.
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        let decision = redguard::limiter("acl:rate:")
            .part("algorithm", algorithm.as_str())
            .rate("10/s")
            .algorithm(algorithm)
            .block(Duration::from_secs(1))
            .on(&rg)
            .check()
            .await
            .unwrap();
        assert!(decision.allowed, "{algorithm:?}");
    }

    // The sliding log's other paths: dropping entries that left the window, the search for
    // the entry whose leaving makes room, and a state replaced by another algorithm's.
    let log = redguard::limiter("acl:log")
        .rate("3/100ms")
        .algorithm(Algorithm::SlidingWindow)
        .on(&rg);
    for _ in 0..3 {
        assert!(log.check().await.unwrap().allowed);
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    assert!(!log.clone().cost(3).check().await.unwrap().allowed);
    let replaced = redguard::limiter("acl:log").rate("3/100ms").on(&rg);
    assert!(replaced.check().await.unwrap().allowed);

    // The user cannot touch anything outside the prefix.
    let mut restricted = redis::Client::open(format!(
        "redis://redguard:secret@127.0.0.1:{}/",
        server.port()
    ))
    .unwrap()
    .get_connection()
    .unwrap();
    let outside: redis::RedisResult<()> = redis::cmd("SET")
        .arg("other:key")
        .arg(1)
        .query(&mut restricted);
    assert!(outside.is_err());
    server.assert_every_key_has_ttl();
}
