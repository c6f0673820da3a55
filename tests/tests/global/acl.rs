//! redguard works under a Redis user restricted to the commands it uses and to keys and
//! channels under its prefix — the ACL lines the guide documents (`runtime/docs/servers.md`).

use std::time::{Duration, Instant};

use redguard::{Error, Redguard, key::KeyBuilder, lock::LockKind, rate::Algorithm};
use redguard_tests::RedisServer;

/// The guide's line ("Redis Cluster, TLS, restricted users"); `the_guide_shows_these_acls`
/// checks it is the one shown.
const ACL: &str = "on >secret ~redguard:* resetchannels &redguard:* -@all \
    +evalsha +eval +script|load +time +ping +hello +info +psubscribe +punsubscribe \
    +set +get +del +exists +type +hget +hset +hmget +hdel +hgetall +pexpire \
    +pexpiretime +pttl +publish +unlink +zadd +zcard +zcount +zrange +zrem +zremrangebyrank \
    +zremrangebyscore +zscore +wait";

/// A handle on `server` as the restricted user the guide documents.
async fn restricted(server: &RedisServer) -> Redguard {
    restricted_to(server, ACL).await
}

async fn restricted_to(server: &RedisServer, acl: &str) -> Redguard {
    let mut admin = server.connection();
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg("redguard");
    for rule in acl.split_whitespace() {
        setuser.arg(rule);
    }
    let _: () = setuser.query(&mut admin).unwrap();
    let url = format!("redis://redguard:secret@127.0.0.1:{}/", server.port());
    // Rate limits fail closed here, so that a refused command is an error, not an admission.
    Redguard::redis(url)
        .fail_mode(
            redguard::key::GuardKind::RateLimit,
            redguard::handle::FailMode::Closed,
        )
        .connect()
        .await
        .expect("connect as the restricted user")
}

/// Waiters are woken by the release notification, not by polling: under the documented ACL
/// too (a subscription outside the granted channels is refused, and waiters then poll
/// every 100 ms at best).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notifications_arrive_under_the_documented_acl() {
    let server = RedisServer::start();
    let rg = restricted(&server).await;
    for fair in [false, true] {
        let lock = move |rg: &Redguard| {
            let kind = if fair {
                LockKind::Fair
            } else {
                LockKind::Exclusive
            };
            rg.lock("acl:notify")
                .kind(kind)
                .wait(Duration::from_secs(5))
        };
        let mut handoffs = Vec::new();
        for _ in 0..9 {
            let held = lock(&rg).acquire().await.unwrap();
            let waiter = {
                let rg = rg.clone();
                tokio::spawn(async move {
                    let guard = lock(&rg).acquire().await.unwrap();
                    let entered = Instant::now();
                    guard.release().await.unwrap();
                    entered
                })
            };
            // The waiter has asked once and is asleep until woken.
            tokio::time::sleep(Duration::from_millis(150)).await;
            let released = Instant::now();
            held.release().await.unwrap();
            handoffs.push(waiter.await.unwrap() - released);
        }
        handoffs.sort();
        let median = handoffs[handoffs.len() / 2];
        println!("fair: {fair}, hand-offs {handoffs:?}");
        assert!(
            median < Duration::from_millis(25),
            "fair: {fair}: median hand-off {median:?}: waiters were polling, not notified"
        );
    }
}

/// With a narrower channel grant (publishing allowed, the pattern not), the subscription is
/// refused: counted (and logged once), and
/// waiters still get the lock by polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_subscription_is_counted_and_waiters_poll() {
    redguard_tests::metrics::install();
    let refused =
        || redguard_tests::metrics::counter("redguard_lock_subscription_refused_total", &[]);
    let before = refused();
    let server = RedisServer::start();
    let rg = restricted_to(&server, &ACL.replace("&redguard:*", "&redguard:lock:*")).await;
    let held = rg.lock("acl:refused").acquire().await.unwrap();
    let waiter = {
        let rg = rg.clone();
        tokio::spawn(async move {
            rg.lock("acl:refused")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .map(drop)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release().await.unwrap();
    waiter
        .await
        .unwrap()
        .expect("a polling waiter gets the lock");
    assert!(
        refused() > before,
        "the refused subscription was not counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_guard_works_under_the_documented_acl() {
    let server = RedisServer::start();
    let rg = restricted(&server).await;

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
            .scope(
                redguard::idempotency(key)
                    .scope("acl")
                    .run(async { Ok::<_, Error>(5) }),
            )
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
        let decision = redguard::limiter(
            redguard::key("acl:rate:{algorithm}").part("algorithm", algorithm.as_str()),
        )
        .rate("10/s")
        .algorithm(algorithm)
        .block(Duration::from_secs(1))
        .on(&rg)
        .decide()
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
        assert!(log.decide().await.unwrap().allowed);
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    assert!(!log.clone().cost(3).decide().await.unwrap().allowed);
    let replaced = redguard::limiter("acl:log").rate("3/100ms").on(&rg);
    assert!(replaced.decide().await.unwrap().allowed);

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

    // What an operator's readiness probe adds, and a second instance's connect.
    for _ in 0..3 {
        let health = rg.health().await.unwrap();
        assert!(health.server.is_some(), "{health:?}");
        assert_eq!(
            health.eviction.map(|e| e.policy).as_deref(),
            Some("noeviction")
        );
    }
    restricted_to(&server, ACL).await;
    // Only the test's own write outside the prefix was refused.
    assert_denials(&server, &["other:key"]);
}

/// The entries of `ACL LOG` (each refused command, key or channel is one), as the refused
/// object's names: what operators alert on.
fn denials(server: &RedisServer) -> Vec<String> {
    let log: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .query(&mut server.connection())
        .unwrap();
    log.iter()
        .map(|entry| match entry.get("object") {
            Some(redis::Value::BulkString(object)) => String::from_utf8_lossy(object).into_owned(),
            other => format!("{other:?}"),
        })
        .collect()
}

#[track_caller]
fn assert_denials(server: &RedisServer, expected: &[&str]) {
    let found = denials(server);
    assert_eq!(found, expected, "ACL LOG: {found:?}");
}

/// A user granted less than the documented line (no `INFO`) is sent nothing it may not run
/// either: connect and `health` leave no `ACL LOG` entry, and the version check still runs
/// (from a script).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_info_is_sent_nothing_it_may_not_run() {
    let server = RedisServer::start();
    let rg = restricted_to(&server, &ACL.replace(" +info ", " ")).await;
    rg.lock("acl:noinfo")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for _ in 0..3 {
        let health = rg.health().await.unwrap();
        assert_eq!((health.server, health.eviction), (None, None));
    }
    assert_denials(&server, &[]);
}

/// The guide's lines ("Redis Sentinel"): on the data nodes the line above plus
/// `+role`; on the sentinels, asking for the master and hearing its announcements.
const SENTINEL_NODE_ACL: &str = "+role";
const SENTINEL_ACL: &str = "on >s3 -@all +sentinel|get-master-addr-by-name +subscribe \
    resetchannels &+switch-master &+selected-slave &+promoted-slave";

/// A Sentinel handle under restricted users on the data nodes and on the sentinels (each
/// with its own credentials) works, follows a killed master, and gets release notifications
/// from the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_works_under_the_documented_acls() {
    let mut sentinel = redguard_tests::RedisSentinel::start();
    let set_user = |conn: &mut redis::Connection, name: &str, acl: &str| {
        let mut setuser = redis::cmd("ACL");
        setuser.arg("SETUSER").arg(name);
        for rule in acl.split_whitespace() {
            setuser.arg(rule);
        }
        let _: () = setuser.query(conn).unwrap();
    };
    for node in 0..3 {
        set_user(
            &mut sentinel.node(node).connection(),
            "redguard",
            &format!("{ACL} {SENTINEL_NODE_ACL}"),
        );
    }
    for addr in sentinel.sentinel_addrs() {
        let mut conn = redis::Client::open(format!("redis://{addr}/"))
            .unwrap()
            .get_connection()
            .unwrap();
        set_user(&mut conn, "watcher", SENTINEL_ACL);
    }
    let rg = sentinel
        .builder()
        .node_auth("redguard", "secret")
        .sentinel_auth("watcher", "s3")
        .fail_mode(
            redguard::key::GuardKind::RateLimit,
            redguard::handle::FailMode::Closed,
        )
        .connect()
        .await
        .expect("connect as the restricted users");
    let work = |rg: Redguard| async move {
        let lock = rg.lock("acl:sentinel").acquire().await?;
        lock.release().await?;
        let key = KeyBuilder::new().text("acl:").part("n", &1u64).finish()?;
        rg.scope(
            redguard::idempotency(key)
                .scope("acl")
                .run(async { Ok::<_, Error>(1) }),
        )
        .await?;
        redguard::limiter("acl:")
            .rate("10/s")
            .on(&rg)
            .check()
            .await?;
        Ok::<_, Error>(())
    };
    work(rg.clone()).await.unwrap();

    let old = sentinel.kill_master();
    let sentinel = sentinel.promoted(old).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(err) = work(rg.clone()).await {
        assert!(matches!(err, Error::Backend(_)), "{err:?}");
        assert!(
            Instant::now() < deadline,
            "not back 10 s after the kill: {err:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = KeyBuilder::new().text("acl:watch").finish().unwrap();
    let key = rg
        .key(redguard::key::GuardKind::Lock, "acl", &body)
        .unwrap();
    assert!(
        redguard::__private::store::of(&rg)
            .lock_watch(&key)
            .await
            .is_live(),
        "no release subscription on the new master"
    );
    sentinel.assert_every_key_has_ttl();
}

/// Guards with `.replicas` send `WAIT`, granted by the documented line: on this server without
/// replicas the write is refused as unconfirmed, not as a command the user may not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_writes_work_under_the_documented_acl() {
    let server = RedisServer::start();
    let rg = restricted(&server).await;
    let err = rg
        .lock("acl:replicas")
        .replicas(1, Duration::from_millis(20))
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            redguard::Error::Backend(redguard::BackendError::Unconfirmed { .. })
        ),
        "got {err:?}"
    );
}

/// The ACL lines tested here are the ones the guide shows, word for word.
#[test]
fn the_guide_shows_these_acls() {
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../runtime/docs/servers.md"
    ))
    .expect("read runtime/docs/servers.md");
    let shown = |user: &str| {
        guide
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("ACL SETUSER {user} ")))
            .unwrap_or_else(|| panic!("the guide shows no ACL line for {user}"))
            .to_owned()
    };
    let words = |line: &str| {
        line.split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(words(&shown("redguard")), words(ACL));
    assert_eq!(words(&shown("watcher")), words(SENTINEL_ACL));
    assert!(
        guide.contains(&format!("plus `{SENTINEL_NODE_ACL}`")),
        "the guide names the data nodes' extra grant for Sentinel"
    );
}
