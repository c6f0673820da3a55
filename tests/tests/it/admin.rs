//! `redguard::admin` on every store: decoding each guard's state (every lock kind and rate
//! algorithm), the repairs, scans, and refusing keys that are not redguard's.

use std::time::Duration;

use redguard::__private::store::{Begin, Finish, IdemFinish};
use redguard::admin::{Admin, LockKindName, ScanSelect};
use redguard::{Algorithm, Error, GuardKind, KeyBuilder, Limit, Rate, Redguard};

const SCOPE: &str = "ops::admin";

redguard_tests::conformance!(
    idempotency_record,
    lock_kinds,
    unlock_is_fenced,
    rate_algorithms,
    rate_repairs,
    scan_counts,
    foreign_keys_refused,
);

async fn idempotency_record(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    let key = admin
        .key(GuardKind::Idempotency, SCOPE, "order:7:req-1")
        .unwrap();
    assert!(admin.inspect(&key).await.unwrap().record.is_none());
    let body = KeyBuilder::new().text("order:7:req-1").finish().unwrap();
    let full = rg.key(GuardKind::Idempotency, SCOPE, &body).unwrap();
    assert_eq!(full.as_str(), key.as_str(), "the guards' own layout");
    let ttl = Duration::from_secs(600);
    let begin = Begin {
        key: &full,
        owner: "exec-1",
        fingerprint: "fp-abc",
        ttl,
        replicas: None,
    };
    redguard::__private::store::of(&rg)
        .idem_begin(begin)
        .await
        .unwrap();
    let seen = admin.inspect(&key).await.unwrap();
    let record = seen.record.expect("a record");
    assert_eq!(record.status, "processing");
    assert_eq!(record.owner, "exec-1");
    assert_eq!(record.fingerprint.as_deref(), Some("fp-abc"));
    assert!(record.age_ms.unwrap() < 5_000, "{record:?}");
    let left = record.ttl_ms.unwrap();
    assert!(left > 590_000 && left <= 600_000, "{record:?}");
    assert!(seen.problems.is_empty(), "{:?}", seen.problems);

    let finish = Finish {
        key: &full,
        owner: "exec-1",
        outcome: IdemFinish::Success(b"{\"order_id\":1}"),
        ttl,
        replicas: None,
    };
    redguard::__private::store::of(&rg)
        .idem_finish(finish)
        .await
        .unwrap();
    let record = admin.inspect(&key).await.unwrap().record.unwrap();
    assert_eq!(record.status, "success");
    assert_eq!(record.result_bytes, Some(14));

    let forgotten = admin.forget(&key).await.unwrap().expect("it was there");
    assert_eq!(forgotten.status, "success");
    assert!(admin.inspect(&key).await.unwrap().is_empty());
    // The retry runs again.
    assert_eq!(
        redguard::__private::store::of(&rg)
            .idem_begin(begin)
            .await
            .unwrap(),
        redguard::__private::store::IdemBegin::Started
    );
}

async fn lock_kinds(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    let wait = Duration::from_millis(50);

    // Exclusive, two levels deep.
    let key = admin.key(GuardKind::Lock, SCOPE, "stock:SK-1").unwrap();
    let (nested, fence) = rg
        .scope(rg.lock("stock:SK-1").scope(SCOPE).run(async {
            let inner = rg.lock("stock:SK-1").scope(SCOPE).acquire().await?;
            let seen = admin.inspect(&key).await?;
            inner.release().await?;
            Ok::<_, Error>((seen, redguard::fence().unwrap()))
        }))
        .await
        .unwrap();
    let lock = &nested.locks[0];
    assert_eq!(lock.kind, LockKindName::Exclusive);
    assert_eq!(lock.depth, Some(2), "{lock:?}");
    assert_eq!(lock.fence, Some(fence));
    assert_eq!(lock.fence_counter, Some(fence));
    assert!(lock.owner.as_deref().is_some_and(|o| !o.is_empty()));
    let lease = lock.lease_left_ms.unwrap();
    assert!(lease > 20_000 && lease <= 30_000, "{lock:?}");
    assert!(lock.held_for_ms.unwrap() < 5_000, "{lock:?}");
    assert!(nested.problems.is_empty(), "{:?}", nested.problems);

    // Fair, with a waiter queued.
    let fair = rg
        .lock("fair:1")
        .scope(SCOPE)
        .fair()
        .acquire()
        .await
        .unwrap();
    let waiter = rg.lock("fair:1").scope(SCOPE).fair().wait(wait).acquire();
    assert!(waiter.await.is_err());
    let key = admin.key(GuardKind::Lock, SCOPE, "fair:1").unwrap();
    let seen = admin.inspect(&key).await.unwrap();
    let lock = &seen.locks[0];
    assert_eq!(lock.kind, LockKindName::Fair);
    assert_eq!(lock.fence, Some(fair.fence()));
    // A waiter that gave up leaves the queue at once.
    assert!(lock.waiters.unwrap_or(0) <= 1, "{lock:?}");

    // Semaphore, two of three permits.
    let a = rg
        .lock("sem:1")
        .scope(SCOPE)
        .permits(3)
        .acquire()
        .await
        .unwrap();
    let b = rg
        .lock("sem:1")
        .scope(SCOPE)
        .permits(3)
        .acquire()
        .await
        .unwrap();
    let key = admin.key(GuardKind::Lock, SCOPE, "sem:1").unwrap();
    let lock = admin.inspect(&key).await.unwrap().locks.remove(0);
    assert_eq!(lock.kind, LockKindName::Semaphore);
    assert_eq!(lock.holders.len(), 2, "{lock:?}");
    assert!(lock.holders.iter().all(|h| h.lease_left_ms > 20_000));
    assert_eq!(lock.fence_counter, Some(a.fence().max(b.fence())));

    // Read/write: two readers, then a writer announcing itself.
    let r1 = rg
        .lock("doc:1")
        .scope(SCOPE)
        .read()
        .acquire()
        .await
        .unwrap();
    let r2 = rg
        .lock("doc:1")
        .scope(SCOPE)
        .read()
        .acquire()
        .await
        .unwrap();
    let writer = rg.lock("doc:1").scope(SCOPE).write().wait(wait).acquire();
    assert!(writer.await.is_err());
    let key = admin.key(GuardKind::Lock, SCOPE, "doc:1").unwrap();
    let lock = admin.inspect(&key).await.unwrap().locks.remove(0);
    assert_eq!(lock.kind, LockKindName::ReadWrite);
    assert_eq!(lock.holders.len(), 2, "{lock:?}");
    assert!(lock.owner.is_none(), "no writer: {lock:?}");
    for guard in [r1, r2] {
        guard.release().await.unwrap();
    }
    let w = rg
        .lock("doc:1")
        .scope(SCOPE)
        .write()
        .wait(Duration::from_secs(3))
        .acquire()
        .await
        .unwrap();
    let lock = admin.inspect(&key).await.unwrap().locks.remove(0);
    assert_eq!(lock.fence, Some(w.fence()));
    assert!(lock.holders.is_empty());

    // A raw key names its kind by its suffix.
    let raw = admin
        .raw_key(&format!("{}:sem", key_of(&rg, "sem:1")))
        .unwrap();
    let seen = admin.inspect(&raw).await.unwrap();
    assert_eq!(seen.locks.len(), 1);
    assert_eq!(seen.locks[0].kind, LockKindName::Semaphore);

    for guard in [fair, a, b, w] {
        guard.release().await.unwrap();
    }
}

fn key_of(rg: &Redguard, body: &str) -> String {
    let body = KeyBuilder::new().text(body).finish().unwrap();
    rg.key(GuardKind::Lock, SCOPE, &body).unwrap().to_string()
}

async fn unlock_is_fenced(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    let stuck = rg.lock("stock:SK-9").scope(SCOPE).acquire().await.unwrap();
    let key = admin.key(GuardKind::Lock, SCOPE, "stock:SK-9").unwrap();
    let unlocked = admin.unlock(&key, Some("somebody-else")).await.unwrap();
    assert_eq!(unlocked.removed, 0, "another owner's lock is not touched");
    let unlocked = admin.unlock(&key, None).await.unwrap();
    assert_eq!(unlocked.removed, 1);
    assert_eq!(unlocked.before[0].fence, Some(stuck.fence()));
    assert!(unlocked.fence.unwrap() > stuck.fence());
    let next = rg.lock("stock:SK-9").scope(SCOPE).acquire().await.unwrap();
    assert!(next.fence() > unlocked.fence.unwrap());
    // The old holder's release finds someone else's lock and leaves it.
    let _ = stuck.release().await;
    assert_eq!(
        admin.inspect(&key).await.unwrap().locks[0].fence,
        Some(next.fence())
    );
    let last = next.fence();
    next.release().await.unwrap();
    let free = admin.inspect(&key).await.unwrap();
    assert!(free.locks.is_empty());
    assert!(free.fence_counter.unwrap() >= last);
    // Semaphore: one holder freed by owner.
    let a = rg
        .lock("sem:9")
        .scope(SCOPE)
        .permits(2)
        .acquire()
        .await
        .unwrap();
    let b = rg
        .lock("sem:9")
        .scope(SCOPE)
        .permits(2)
        .acquire()
        .await
        .unwrap();
    let key = admin.key(GuardKind::Lock, SCOPE, "sem:9").unwrap();
    let owner = admin.inspect(&key).await.unwrap().locks[0].holders[0]
        .owner
        .clone();
    let unlocked = admin.unlock(&key, Some(&owner)).await.unwrap();
    assert_eq!(unlocked.removed, 1);
    assert_eq!(admin.inspect(&key).await.unwrap().locks[0].holders.len(), 1);
    let _ = a.release().await;
    let _ = b.release().await;
}

async fn rate_algorithms(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    for algorithm in Algorithm::ALL {
        let text = format!("user:{}", algorithm.as_str());
        let limiter = || {
            let l = redguard::limiter(&format!("{text}:"))
                .part("n", &1u32)
                .scope(SCOPE)
                .rate("10/min")
                .algorithm(algorithm)
                .on(&rg);
            if algorithm.is_window() {
                l
            } else {
                l.burst(10)
            }
        };
        for _ in 0..3 {
            assert!(limiter().decide().await.unwrap().allowed);
        }
        let key = admin
            .key(GuardKind::RateLimit, SCOPE, &format!("{text}:1"))
            .unwrap();
        let seen = admin.inspect(&key).await.unwrap();
        let state = seen
            .rate
            .as_ref()
            .unwrap_or_else(|| panic!("{algorithm}: {seen:?}"));
        assert_eq!(state.algorithm, algorithm.as_str(), "{seen:?}");
        assert_eq!(state.used, Some(3), "{algorithm}: {seen:?}");
        assert!(seen.problems.is_empty(), "{algorithm}: {:?}", seen.problems);
        let burst = (!algorithm.is_window()).then_some(10);
        let limit = Limit::new(algorithm, Rate::per_minute(10), burst, 1, Duration::ZERO).unwrap();
        let decided = admin.inspect_rate(&key, &limit).await.unwrap();
        let decision = decided.decision.unwrap();
        assert!(decision.allowed);
        assert_eq!(decision.remaining, 6, "{algorithm}: {decision:?}");
        // Peeking charged nothing.
        assert_eq!(
            admin.inspect(&key).await.unwrap().rate.unwrap().used,
            Some(3)
        );
    }
}

async fn rate_repairs(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    for algorithm in Algorithm::ALL {
        let text = format!("login:{}", algorithm.as_str());
        let limiter = || {
            let l = redguard::limiter(&format!("{text}:"))
                .part("ip", &"10.0.0.1")
                .scope(SCOPE)
                .rate("3/min")
                .algorithm(algorithm)
                .block(Duration::from_secs(60))
                .on(&rg);
            if algorithm.is_window() { l } else { l.burst(3) }
        };
        for _ in 0..3 {
            assert!(limiter().decide().await.unwrap().allowed);
        }
        let key = admin
            .key(GuardKind::RateLimit, SCOPE, &format!("{text}:10.0.0.1"))
            .unwrap();
        let back = admin.refund(&key, 2).await.unwrap();
        assert_eq!(back, 2, "{algorithm}");
        assert_eq!(
            admin.inspect(&key).await.unwrap().rate.unwrap().used,
            Some(1),
            "{algorithm}"
        );
        for _ in 0..2 {
            assert!(
                limiter().decide().await.unwrap().allowed,
                "{algorithm}: refunded"
            );
        }
        // Over the limit: a penalty.
        assert!(!limiter().decide().await.unwrap().allowed);
        let penalty = admin
            .inspect(&key)
            .await
            .unwrap()
            .rate
            .unwrap()
            .penalty_left_ms;
        assert!(penalty.unwrap() > 50_000, "{algorithm}: {penalty:?}");
        assert_eq!(admin.reset(&key).await.unwrap(), 2, "{algorithm}");
        assert!(admin.inspect(&key).await.unwrap().is_empty());
        assert!(
            limiter().decide().await.unwrap().allowed,
            "{algorithm}: reset"
        );
    }
}

async fn scan_counts(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    let mut guards = Vec::new();
    for i in 0..5 {
        let lock = rg
            .lock(format!("scan:{i}").as_str())
            .scope("ops::scan")
            .acquire();
        guards.push(lock.await.unwrap());
    }
    for i in 0..3 {
        redguard::limiter("scan:")
            .part("i", &i)
            .scope("ops::scan")
            .rate("5/s")
            .on(&rg)
            .check()
            .await
            .unwrap();
    }
    let report = admin
        .scan(&ScanSelect::guard(GuardKind::Lock).scope("ops::scan"))
        .await
        .unwrap();
    let group = |role: &str| report.groups.iter().find(|g| g.role == role).cloned();
    let held = group("exclusive").unwrap_or_else(|| panic!("{report:?}"));
    assert_eq!(held.count, 5, "{report:?}");
    assert!(held.oldest_ms.unwrap() < 10_000);
    assert_eq!(group("fence").unwrap().count, 5);
    assert!(!report.truncated);
    let rates = admin
        .scan(&ScanSelect::guard(GuardKind::RateLimit).scope("ops::scan"))
        .await
        .unwrap();
    assert_eq!(rates.keys, 3, "{rates:?}");
    let bounded = admin.scan(&ScanSelect::all().limit(4)).await.unwrap();
    assert_eq!(bounded.keys, 4);
    assert!(bounded.truncated);
    for guard in guards {
        guard.release().await.unwrap();
    }
}

async fn foreign_keys_refused(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    for raw in [
        "sessions:42",
        "redguardx:lock:{a:b}",
        "other:lock:{a:b}",
        "redguard:lock:{a:b}:weird",
        "redguard:rate:{a:b}:fence",
        "redguard:lock:{a b}",
        "redguard:lock:a:b",
        "redguard:nope:{a:b}",
        "redguard:token:{a:b}",
    ] {
        let err = admin.raw_key(raw).unwrap_err();
        assert!(
            matches!(err, Error::InvalidKey { .. } | Error::Config(_)),
            "{raw}: {err:?}"
        );
    }
    assert!(admin.key(GuardKind::Lock, SCOPE, "stock:{SK-1}").is_err());
    assert!(
        admin
            .key(GuardKind::Lock, "bad scope", "stock:SK-1")
            .is_err()
    );
    // A repair of the wrong guard is refused too.
    let lock = admin.key(GuardKind::Lock, SCOPE, "stock:SK-1").unwrap();
    assert!(admin.forget(&lock).await.is_err());
    assert!(admin.reset(&lock).await.is_err());
}

/// Issue 25, finding 7: `reset` of a limit with `local = true` and a 15-minute penalty, made
/// through the operator's own handle, must reach the instance that refused the key. It used
/// to keep refusing locally for the penalty's 900 s while the store said allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_reaches_another_instances_local_tier() {
    let server = redguard_tests::RedisServer::start();
    let service = redguard_tests::connect(&server).await;
    let operator = redguard_tests::connect(&server).await;
    let limiter = |rg: &Redguard| {
        redguard::limiter("export:")
            .part("user", "u-1")
            .rate("1/h")
            .block(Duration::from_secs(15 * 60))
            .local(true)
            .on(rg)
    };
    assert!(limiter(&service).decide().await.unwrap().allowed);
    let refused = limiter(&service).decide().await.unwrap();
    assert!(
        !refused.allowed && refused.retry_after > Duration::from_secs(800),
        "{refused:?}"
    );

    // The refusing instance listens for resets (pub/sub) from its first kept refusal on.
    let mut direct = server.connection();
    let subscribed = std::time::Instant::now();
    while ::redis::cmd("PUBSUB")
        .arg("NUMPAT")
        .query::<i64>(&mut direct)
        .unwrap()
        < 1
    {
        assert!(
            subscribed.elapsed() < Duration::from_secs(10),
            "never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let admin = Admin::new(operator.clone());
    let key = admin
        .key(GuardKind::RateLimit, "limiter", "export:u-1")
        .unwrap();
    let before_reset = std::time::Instant::now();
    assert_eq!(admin.reset(&key).await.unwrap(), 2, "state and penalty");
    assert!(limiter(&operator).peek().await.unwrap().allowed);
    // The announcement reaches the refusing instance's store.
    let body = KeyBuilder::new().text("export:u-1").finish().unwrap();
    let full = service.key(GuardKind::RateLimit, "limiter", &body).unwrap();
    while !redguard::__private::store::of(&service).rate_reset_after(&full, before_reset) {
        assert!(
            before_reset.elapsed() < Duration::from_secs(10),
            "the reset was never announced to the other instance"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // At once now; within a second in any case (the local tier's recheck), with a margin for
    // a loaded machine.
    let reset_at = std::time::Instant::now();
    let admitted = loop {
        let decision = limiter(&service).decide().await.unwrap();
        if decision.allowed {
            break reset_at.elapsed();
        }
        assert!(
            reset_at.elapsed() < Duration::from_secs(10),
            "the refusing instance still refuses {:?} after the reset: {decision:?}",
            reset_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Admitted once, then refused by the store again (1/h): the reset did not lift the limit.
    assert!(!limiter(&service).decide().await.unwrap().allowed);
    eprintln!("admitted {admitted:?} after the reset");
    server.assert_every_key_has_ttl();
}
