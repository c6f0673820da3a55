//! Rate limits under a failing Redis: killed mid-run the limiter fails open (allow, log,
//! count), and enforces again once Redis is back, without a restart of the service. Also
//! reports the memory each algorithm's state takes in Redis.

use std::time::{Duration, Instant};

use redguard::{Error, Redguard, handle::FailMode, key::GuardKind, rate::Algorithm};
use redguard_tests::RedisServer;

/// `redguard_backend_errors_total{guard="rate", outcome}` so far (the counting recorder is
/// shared by the tests of this binary; each test reads its own difference).
fn backend_errors(outcome: &str) -> u64 {
    redguard_tests::metrics::install();
    redguard_tests::metrics::counter(
        "redguard_backend_errors_total",
        &[("guard", "rate"), ("outcome", outcome)],
    )
}

const TIMEOUT: Duration = Duration::from_millis(200);
/// Scheduling noise allowed on top of the timeout on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_fails_open_counts_and_recovers() {
    backend_errors("fail_open");
    let mut server = RedisServer::start();
    let rg = Redguard::redis(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let limiter = redguard::limiter("api").on(&rg).rate("5/min");
    for _ in 0..5 {
        assert!(limiter.decide().await.unwrap().allowed);
    }
    assert!(
        !limiter.decide().await.unwrap().allowed,
        "enforcing before the fault"
    );

    server.kill();
    let before = backend_errors("fail_open");
    for i in 0..10 {
        let started = Instant::now();
        let d = limiter.decide().await.unwrap();
        assert!(
            d.allowed,
            "call {i} during the outage was not let through: {d:?}"
        );
        assert!(
            started.elapsed() < TIMEOUT + SLACK,
            "call {i} took {:?}",
            started.elapsed()
        );
    }
    let counted = backend_errors("fail_open") - before;
    assert!(counted >= 10, "backend errors counted: {counted}");

    // Back, empty, on the same port: the same handle enforces again (reconnect, script
    // reloaded on NOSCRIPT) without being rebuilt.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut admitted = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "the limiter never enforced again"
        );
        let seen = backend_errors("fail_open");
        let d = limiter.decide().await.unwrap();
        if backend_errors("fail_open") != seen {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue; // still degraded
        }
        if d.allowed {
            admitted += 1;
        } else {
            break;
        }
    }
    assert_eq!(admitted, 5, "the fresh Redis admitted exactly the limit");
    server.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_refuses_while_down() {
    backend_errors("fail_closed");
    let mut server = RedisServer::start();
    let rg = Redguard::redis(server.url())
        .timeout(TIMEOUT)
        .fail_mode(GuardKind::RateLimit, FailMode::Closed)
        .connect()
        .await
        .unwrap();
    let limiter = redguard::limiter("api").on(&rg).rate("5/min");
    assert!(limiter.decide().await.unwrap().allowed);
    server.kill();
    let before = backend_errors("fail_closed");
    let err = limiter.decide().await.unwrap_err();
    assert!(matches!(err, Error::Backend(_)), "{err:?}");
    assert!(backend_errors("fail_closed") > before);
}

#[tokio::test]
async fn memory_usage_per_key() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let mut conn = server.connection();
    println!("MEMORY USAGE per key (Redis 7, state after N admitted calls):");
    for algorithm in Algorithm::ALL {
        for n in [10u64, 100] {
            let name = format!("{}-{n}", algorithm.as_str());
            let limiter = redguard::limiter(&name)
                .on(&rg)
                .algorithm(algorithm)
                .rate(redguard::rate::Rate::per_minute(1000));
            for _ in 0..n {
                assert!(limiter.decide().await.unwrap().allowed);
            }
            let key = format!("redguard:rate:{{limiter:{name}}}");
            let bytes: u64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .query(&mut conn)
                .unwrap();
            println!("  {algorithm:<16} after {n:>3} calls: {bytes:>5} bytes");
            if algorithm == Algorithm::SlidingWindow {
                // One entry per admitted call: grows with the calls in a window.
                assert!(bytes > n * 8, "{algorithm}: {bytes}");
            } else if algorithm == Algorithm::Gcra {
                // One unboxed integer: as small as redis-cell's native key (88 B).
                assert!(bytes <= 90, "{algorithm}: {bytes} bytes");
            } else {
                // O(1): the same size whatever the count.
                assert!(bytes <= 200, "{algorithm}: {bytes} bytes");
            }
        }
    }
    // GCRA with an interval below 1 ms that is not whole µs ("-<T ns><rrrrrr>"): still one
    // unboxed integer. 100 calls at 600,000/s fill 167 µs of the bucket, so the key expires
    // 167 µs after the last one: read it at once, both figures in one MULTI, and start over if
    // a loaded machine was slower than that.
    let limiter = redguard::limiter("gcra-ns")
        .on(&rg)
        .rate(redguard::rate::Rate::per_second(600_000));
    let key = "redguard:rate:{limiter:gcra-ns}";
    let mut attempts = 0;
    let (value, bytes) = loop {
        for _ in 0..100 {
            assert!(limiter.decide().await.unwrap().allowed);
        }
        let read: (Option<String>, Option<u64>) = redis::pipe()
            .atomic()
            .cmd("GET")
            .arg(key)
            .cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .query(&mut conn)
            .unwrap();
        attempts += 1;
        match read {
            (Some(value), Some(bytes)) => break (value, bytes),
            _ => assert!(attempts < 50, "the key expired before every read"),
        }
    };
    println!("  gcra at 600000/s ({value}): {bytes:>5} bytes");
    assert!(value.starts_with("-1667"), "{value}");
    assert!(bytes <= 90, "gcra (ns): {bytes} bytes");
    server.assert_every_key_has_ttl();
}
