//! Redis Cluster failover: kill the master serving a guard's key while calls keep coming; its
//! replica is promoted and the same client recovers by itself.

use std::time::{Duration, Instant};

use redguard::{Error, Redguard, handle::FailMode, key::GuardKind, key::KeyBuilder};
use redguard_tests::{RedisCluster, after_failover};

async fn call(rg: &Redguard) -> Result<u64, Error> {
    let key = KeyBuilder::new()
        .text("order:")
        .part("id", &7u64)
        .finish()?;
    rg.scope(
        redguard::idempotency(key)
            .scope("failover")
            .expire(Duration::from_secs(600))
            .run(async { Ok::<_, Error>(7) }),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_recover_after_a_master_fails_over() {
    let mut cluster = RedisCluster::start();
    // Fail closed, so the outage shows as errors instead of being absorbed by fail-open.
    let rg = Redguard::redis_cluster(cluster.urls())
        .timeout(Duration::from_millis(250))
        .fail_mode(GuardKind::Idempotency, FailMode::Closed)
        .connect()
        .await
        .unwrap();
    assert_eq!(call(&rg).await.unwrap(), 7);
    let victim = cluster.master_of("redguard:idem:{failover:order:7}");

    cluster.node(victim).kill();
    let killed = Instant::now();
    let mut failures = 0;
    let recovered = loop {
        let started = Instant::now();
        match call(&rg).await {
            Ok(value) => {
                assert_eq!(value, 7);
                break killed.elapsed();
            }
            Err(Error::Backend(_)) => failures += 1,
            Err(other) => panic!("unexpected {other:?}"),
        }
        // Every call is bounded, outage or not.
        assert!(started.elapsed() < Duration::from_millis(250 + 500));
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "no recovery after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("master killed: {failures} failed calls, recovered after {recovered:?}");
    assert!(
        failures > 0,
        "the kill was not noticed: the wrong node was killed"
    );
    // The promoted replica now serves the slot (every node learns it by gossip, soon).
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.master_of("redguard:idem:{failover:order:7}") == victim {
        assert!(Instant::now() < deadline, "no node reports the promotion");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.assert_every_key_has_ttl();
}

/// The replica of a key's master misses the last acquisitions (stopped while they happen),
/// then the master dies and the replica takes over: its fencing tokens must still be larger
/// than every token the dead master handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_across_a_failover_that_lost_writes() {
    let mut cluster = RedisCluster::start();
    let rg = Redguard::redis_cluster(cluster.urls())
        .timeout(Duration::from_millis(250))
        .connect()
        .await
        .unwrap();
    let guard = rg.lock("fence:k").acquire().await.unwrap();
    guard.release().await.unwrap();
    let master = cluster.master_of("redguard:lock:{lock:fence:k}");
    let replica = cluster.replica_of(master);
    // Let the replica catch up with the first acquisition, then stop it.
    let _: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query(&mut cluster.node(master).connection())
        .unwrap();
    // Stopped, and cut off: what the master writes from now on never reaches it (a stopped
    // replica would still find it in its socket buffer when continued).
    cluster.node(replica).pause();
    let _: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut cluster.node(master).connection())
        .unwrap();
    let mut last = 0;
    for _ in 0..3 {
        let guard = rg.lock("fence:k").acquire().await.unwrap();
        last = guard.fence();
        guard.release().await.unwrap();
    }
    cluster.node(master).kill();
    cluster.node(replica).resume();
    let killed = Instant::now();
    let fence = after_failover(killed, || rg.lock("fence:k").acquire())
        .await
        .fence();
    println!("last token on the dead master {last}, first on the promoted replica {fence}");
    assert!(
        fence > last,
        "the promoted replica handed out {fence} after the dead master's {last}"
    );
}
