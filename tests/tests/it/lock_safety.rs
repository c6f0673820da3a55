//! Locks keep their promise when a store call's outcome is unknown: a nested level released or
//! acquired by a future that was dropped mid-call, an acquisition that timed out while Redis
//! was stalled, and fencing tokens after a replica took over with the last writes lost.

use std::time::{Duration, Instant};

use redguard::lock::Kind;
use redguard::{Error, LockBuilder, LockKind, Redguard};
use redguard_tests::RedisServer;

/// Redis stalls (SIGSTOP) for longer than the handle's timeout while the future runs.
const STALL: Duration = Duration::from_millis(400);
const TIMEOUT: Duration = Duration::from_millis(100);

async fn connect(server: &RedisServer) -> Redguard {
    Redguard::redis(server.url())
        .timeout(TIMEOUT)
        .connect()
        .await
        .expect("connect to the test redis-server")
}

/// Whether another task (another owner) can take `lock` right now; releases it if so.
async fn free_for_others<K: Kind + Send + 'static>(
    lock: impl FnOnce() -> LockBuilder<K> + Send + 'static,
) -> bool {
    tokio::spawn(async move {
        match lock().try_acquire().await.expect("probe the lock") {
            Some(guard) => {
                guard.release().await.expect("release the probe");
                true
            }
            None => false,
        }
    })
    .await
    .expect("probe task")
}

/// Waits until Redis has answered everything that was queued while it was stopped.
async fn settle(rg: &Redguard) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while redguard::__private::store::of(rg).time().await.is_err() {
        assert!(Instant::now() < deadline, "Redis did not come back");
    }
}

/// A nested release whose future is dropped while Redis is stalled must not release the
/// outer level too (the dropped release's guard sends its release again on drop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_nested_release_keeps_the_outer_level() {
    let server = RedisServer::start();
    let rg = connect(&server).await;
    let probe = rg.clone();
    let overlap = rg
        .lock("stock:nested-release")
        .run(async {
            let inner = rg.lock("stock:nested-release").acquire().await?;
            server.pause();
            let cancelled = tokio::time::timeout(Duration::from_millis(20), inner.release()).await;
            assert!(
                cancelled.is_err(),
                "the release finished while Redis was stopped"
            );
            tokio::time::sleep(STALL).await;
            server.resume();
            settle(&rg).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            // The outer level still runs: nobody else may hold the lock now.
            let probe = probe.clone();
            Ok::<_, Error>(free_for_others(move || probe.lock("stock:nested-release")).await)
        })
        .await
        .unwrap();
    assert!(
        !overlap,
        "another owner took the lock while its outer level was still held"
    );
    let probe = rg.clone();
    assert!(free_for_others(move || probe.lock("stock:nested-release")).await);
    server.assert_every_key_has_ttl();
}

/// A nested acquisition whose future is dropped in flight must not leave a level behind that
/// keeps the key taken after the outer level was released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_nested_acquire_does_not_outlive_the_outer_release() {
    let server = RedisServer::start();
    let rg = connect(&server).await;
    let probe = rg.clone();
    rg.lock("stock:nested-acquire")
        .run(async {
            server.pause();
            let cancelled = tokio::time::timeout(
                Duration::from_millis(20),
                rg.lock("stock:nested-acquire").acquire(),
            )
            .await;
            assert!(
                cancelled.is_err(),
                "the acquisition finished while Redis was stopped"
            );
            tokio::time::sleep(STALL).await;
            server.resume();
            settle(&rg).await;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    let started = Instant::now();
    while !free_for_others({
        let probe = probe.clone();
        move || probe.lock("stock:nested-acquire")
    })
    .await
    {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the key stayed taken after its outer level was released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An acquisition that timed out while Redis was stopped may still run when Redis resumes;
/// it is undone, for every kind of lock, so the key is free again within a round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_timed_out_in_a_stall_are_undone() {
    let server = RedisServer::start();
    let rg = connect(&server).await;
    for kind in [
        LockKind::Exclusive,
        LockKind::Fair,
        LockKind::Semaphore { permits: 1 },
        LockKind::Read,
        LockKind::Write,
    ] {
        let name = format!("{kind:?}");
        let key = format!("ghost:{}", name.split(' ').next().unwrap_or_default());
        server.pause();
        let outcome = rg
            .lock(key.as_str())
            .kind(kind)
            .lease(Duration::from_secs(30))
            .acquire()
            .await;
        assert!(
            matches!(outcome, Err(Error::Backend(_))),
            "{name}: {outcome:?}"
        );
        tokio::time::sleep(STALL).await;
        server.resume();
        settle(&rg).await;
        // Writers conflict with readers and with each other: probe with a writer (or the
        // same kind for the others).
        let probe = rg.clone();
        let probe_key = key.clone();
        let probe_kind = if kind == LockKind::Read {
            LockKind::Write
        } else {
            kind
        };
        let free = free_for_others(move || probe.lock(probe_key.as_str()).kind(probe_kind)).await;
        assert!(
            free,
            "{name}: an acquisition nobody holds kept the key taken"
        );
    }
    server.assert_every_key_has_ttl();
}

/// A replica promoted while the old master still serves clients: tokens handed out by the
/// new master after the promotion are larger than every token the old one handed out before
/// them, though the new master never saw the old one's last increments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_across_a_promotion_that_lost_writes() {
    let master = RedisServer::start();
    let replica = RedisServer::start();
    let mut conn = replica.connection();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port())
        .query(&mut conn)
        .unwrap();
    let old = connect(&master).await;
    let guard = old.lock("fence:k").acquire().await.unwrap();
    let mut fences = vec![("old", guard.fence())];
    guard.release().await.unwrap();
    // Wait until the replica has the counter, then promote it.
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(20_000)
        .query(&mut master.connection())
        .unwrap();
    assert_eq!(acked, 1, "the replica did not catch up");
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut conn)
        .unwrap();
    let new = connect(&replica).await;
    // Alternate: each acquisition, on either master, must get a larger token than every
    // acquisition before it in time.
    for _ in 0..5 {
        for (name, rg) in [("old", &old), ("new", &new)] {
            let guard = rg.lock("fence:k").acquire().await.unwrap();
            fences.push((name, guard.fence()));
            guard.release().await.unwrap();
        }
    }
    for pair in fences.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "token {:?} after {:?}: {fences:?}",
            pair[1],
            pair[0]
        );
    }
}
