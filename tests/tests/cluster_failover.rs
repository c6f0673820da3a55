//! Redis Cluster failover: kill the master serving a guard's key while calls keep coming; its
//! replica is promoted and the same client recovers by itself.

use std::time::{Duration, Instant};

use redguard::{Error, FailMode, GuardKind, Idempotency, KeyBuilder, Redguard};
use redguard_tests::RedisCluster;

async fn call(rg: &Redguard) -> Result<u64, Error> {
    let key = KeyBuilder::new()
        .text("order:")
        .part("id", &7u64)
        .finish()?;
    rg.scope(
        Idempotency::new("failover", key)
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
