//! No renewal task outlives its guard, and a cancelled caller frees its lock promptly.
//!
//! Each store's handle counts its own renewal tasks (`Redguard::live_watchdogs`).

use std::time::{Duration, Instant};

use redguard::{Error, Redguard};
use redguard_tests::RedisServer;

/// Waits (boundedly) until every renewal task of `rg` is gone.
async fn assert_no_watchdog_left(rg: &Redguard, after: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while rg.live_watchdogs() != 0 {
        assert!(
            Instant::now() < deadline,
            "{} renewal tasks still alive after {after}",
            rg.live_watchdogs()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (boundedly) until another task can take `key`, returning how long it took.
async fn freed_within(rg: &Redguard, key: &str, bound: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let probe = rg.clone();
        let owned = key.to_owned();
        // From another task, so a lock held by this one is not re-entered.
        let got = tokio::spawn(async move { probe.lock(owned).try_acquire().await })
            .await
            .unwrap()
            .unwrap();
        if let Some(guard) = got {
            guard.release().await.unwrap();
            return started.elapsed();
        }
        assert!(
            started.elapsed() < bound,
            "`{key}` still held after {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[redguard::dist_lock(key = "mixed:{n}", wait = "50ms", lease = "2s", scope = "lock")]
async fn mixed(n: u32, outcome: u32) -> redguard::Result<u32> {
    match outcome {
        0 => Ok(n),
        1 => Err(Error::Config("business error".into())),
        2 => panic!("boom"),
        _ => {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(n)
        }
    }
}

async fn cases(rg: Redguard) {
    assert_no_watchdog_left(&rg, "the start").await;

    // 1,000 guarded calls: ok, error, panic, refused (lock held), cancelled mid-body; then
    // every key is free again.
    let blocker = rg.lock("mixed:999").acquire().await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..1000u32 {
        let rg = rg.clone();
        tasks.push(tokio::spawn(async move {
            rg.scope(async move {
                match i % 5 {
                    0 => mixed(i, 0).await.map(drop),
                    1 => mixed(i, 1).await.map(drop),
                    2 => mixed(i, 2).await.map(drop),
                    3 => mixed(999, 0).await.map(drop),
                    _ => {
                        // Dropped while holding (or waiting): the caller gave up.
                        let _ = tokio::time::timeout(Duration::from_millis(1), mixed(i, 3)).await;
                        Ok(())
                    }
                }
            })
            .await
        }));
    }
    let (mut ok, mut refused, mut errors, mut panics) = (0, 0, 0, 0);
    for task in tasks {
        match task.await {
            Ok(Ok(())) => ok += 1,
            Ok(Err(Error::LockTimeout { .. })) => refused += 1,
            Ok(Err(_)) => errors += 1,
            Err(join) if join.is_panic() => panics += 1,
            Err(join) => panic!("{join}"),
        }
    }
    println!("1000 calls: {ok} ok, {refused} refused, {errors} errors, {panics} panics");
    assert_eq!((ok, refused, errors, panics), (400, 200, 200, 200));
    blocker.release().await.unwrap();
    assert_no_watchdog_left(&rg, "1000 guarded calls").await;
    for n in (0..1000).filter(|n| n % 5 != 3) {
        freed_within(&rg, &format!("mixed:{n}"), Duration::from_secs(1)).await;
    }

    // Cancelled while holding: the lock is freed at once, not after the lease.
    let holder = rg.clone();
    let task = tokio::spawn(async move {
        holder
            .lock("cancel-hold")
            .lease(Duration::from_secs(30))
            .run(async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, Error>(())
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        rg.lock("cancel-hold")
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    task.abort();
    let freed = freed_within(&rg, "cancel-hold", Duration::from_secs(1)).await;
    println!("freed {freed:?} after cancelling its holder");
    assert_no_watchdog_left(&rg, "cancelling a holder").await;

    // Cancelled while waiting: nothing is left behind, the holder keeps its lock, and a later
    // waiter still gets it.
    let held = rg.lock("cancel-wait").acquire().await.unwrap();
    let waiter = rg.clone();
    let waiting = tokio::spawn(async move {
        waiter
            .lock("cancel-wait")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    assert!(
        rg.lock("cancel-wait")
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    held.release().await.unwrap();
    freed_within(&rg, "cancel-wait", Duration::from_millis(500)).await;
    assert_no_watchdog_left(&rg, "cancelling a waiter").await;

    // A guard dropped without `release` (early return, `?`) frees the key in the background.
    let guard = rg.lock("dropped").acquire().await.unwrap();
    drop(guard);
    freed_within(&rg, "dropped", Duration::from_millis(500)).await;
    assert_no_watchdog_left(&rg, "dropping a guard").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_leaks_and_prompt_release_on_cancellation() {
    cases(Redguard::memory()).await;
    let server = RedisServer::start();
    // 1,000 calls at once on a loaded 2-core machine: a generous per-call timeout, so every
    // outcome is the one the call was built for, not a store timeout.
    let rg = Redguard::redis(server.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    cases(rg).await;
    server.assert_every_key_has_ttl();
}
