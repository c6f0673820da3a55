//! Lock store operations and the lock API, on both stores (see `redguard_tests::conformance!`).

use std::time::Duration;

use redguard::__private::store::{Acquire, LockAcquire, LockRelease, Release};
use redguard::{Error, Redguard, key::GuardKind, key::KeyBuilder};

redguard_tests::conformance!(
    acquire_is_exclusive_and_fenced,
    fences_increase_across_owners,
    renew_only_by_owner,
    release_is_compare_and_delete,
    nested_levels_are_named,
    fences_follow_the_store_clock,
    release_keeps_key_for_hold_at_least,
    lease_expiry_frees_the_key,
    watch_wakes_on_release,
    a_release_nobody_waits_for_is_not_announced,
    fair_release_hands_over_to_the_head,
    a_lapsed_place_at_the_head_does_not_take_a_free_lock,
    api_timeout_held_and_release,
    api_run_exposes_fence_and_reenters,
    api_rejects_bad_settings,
    semaphore_admits_n_holders,
    read_write_modes_exclude,
);

fn key(rg: &Redguard, body: &str) -> redguard::key::Key {
    let body = KeyBuilder::new().text(body).finish().unwrap();
    rg.key(GuardKind::Lock, "conf", &body).unwrap()
}

const LEASE: Duration = Duration::from_secs(5);

fn acq<'a>(
    key: &'a redguard::key::Key,
    owner: &'a str,
    lease: Duration,
    level: u32,
) -> Acquire<'a> {
    Acquire {
        key,
        owner,
        lease,
        level,
        waiting: false,
        replicas: None,
    }
}

fn rel<'a>(key: &'a redguard::key::Key, owner: &'a str, level: u32, keep: Duration) -> Release<'a> {
    Release {
        key,
        owner,
        level,
        keep,
    }
}

async fn acquire_is_exclusive_and_fenced(rg: Redguard) {
    let k = key(&rg, "a");
    let store = redguard::__private::store::of(&rg);
    let first = store
        .lock_acquire(acq(&k, "alice", LEASE, 1))
        .await
        .unwrap();
    let LockAcquire::Acquired { fence, depth: 1 } = first else {
        panic!("{first:?}")
    };
    assert!(fence > 0);
    match store.lock_acquire(acq(&k, "bob", LEASE, 1)).await.unwrap() {
        LockAcquire::Held { ttl } => assert!(ttl <= LEASE && ttl > LEASE / 2, "{ttl:?}"),
        other => panic!("{other:?}"),
    }
}

async fn fences_increase_across_owners(rg: Redguard) {
    let k = key(&rg, "f");
    let store = redguard::__private::store::of(&rg);
    let mut last = 0;
    for i in 0..20 {
        let owner = format!("o{i}");
        let LockAcquire::Acquired { fence, .. } =
            store.lock_acquire(acq(&k, &owner, LEASE, 1)).await.unwrap()
        else {
            panic!("not acquired")
        };
        assert!(fence > last, "{fence} after {last}");
        last = fence;
        let released = store
            .lock_release(rel(&k, &owner, 1, Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(released, LockRelease::Released);
    }
}

async fn renew_only_by_owner(rg: Redguard) {
    let k = key(&rg, "r");
    let store = redguard::__private::store::of(&rg);
    assert!(!store.lock_renew(&k, "alice", LEASE).await.unwrap());
    store
        .lock_acquire(acq(&k, "alice", LEASE, 1))
        .await
        .unwrap();
    assert!(store.lock_renew(&k, "alice", LEASE).await.unwrap());
    assert!(!store.lock_renew(&k, "bob", LEASE).await.unwrap());
}

async fn release_is_compare_and_delete(rg: Redguard) {
    let k = key(&rg, "d");
    let store = redguard::__private::store::of(&rg);
    assert_eq!(
        store
            .lock_release(rel(&k, "alice", 1, Duration::ZERO))
            .await
            .unwrap(),
        LockRelease::NotOwner
    );
    store
        .lock_acquire(acq(&k, "alice", LEASE, 1))
        .await
        .unwrap();
    assert_eq!(
        store
            .lock_release(rel(&k, "bob", 1, Duration::ZERO))
            .await
            .unwrap(),
        LockRelease::NotOwner
    );
    // Bob's attempt changed nothing: still Alice's.
    assert!(matches!(
        store.lock_acquire(acq(&k, "bob", LEASE, 1)).await.unwrap(),
        LockAcquire::Held { .. }
    ));
    assert_eq!(
        store
            .lock_release(rel(&k, "alice", 1, Duration::ZERO))
            .await
            .unwrap(),
        LockRelease::Released
    );
    assert!(matches!(
        store.lock_acquire(acq(&k, "bob", LEASE, 1)).await.unwrap(),
        LockAcquire::Acquired { .. }
    ));
}

/// Nested levels are named: entering or leaving a level twice (a call sent again because its
/// caller gave up on the reply) counts once, and leaving level 1 frees the lock whatever the
/// depth, so no lost reply can leave the key taken or free it under an outer level.
async fn nested_levels_are_named(rg: Redguard) {
    let k = key(&rg, "n");
    let store = redguard::__private::store::of(&rg);
    let LockAcquire::Acquired { fence, depth: 1 } = store
        .lock_acquire(acq(&k, "alice", LEASE, 1))
        .await
        .unwrap()
    else {
        panic!()
    };
    for level in [2, 3, 3] {
        assert_eq!(
            store
                .lock_acquire(acq(&k, "alice", LEASE, level))
                .await
                .unwrap(),
            LockAcquire::Acquired {
                fence,
                depth: level
            }
        );
    }
    // Someone else's nested entry, or one after the lock is gone: lost, nothing changed.
    assert_eq!(
        store.lock_acquire(acq(&k, "bob", LEASE, 2)).await.unwrap(),
        LockAcquire::Lost
    );
    // Leaving level 3 twice leaves level 2 held.
    for _ in 0..2 {
        assert_eq!(
            store
                .lock_release(rel(&k, "alice", 3, Duration::ZERO))
                .await
                .unwrap(),
            LockRelease::Nested { depth: 2 }
        );
    }
    // A nested entry with a shorter lease does not cut the outer one short.
    store
        .lock_acquire(acq(&k, "alice", Duration::from_millis(100), 3))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(matches!(
        store.lock_acquire(acq(&k, "bob", LEASE, 1)).await.unwrap(),
        LockAcquire::Held { .. }
    ));
    // Leaving level 2 leaves level 3 with it.
    assert_eq!(
        store
            .lock_release(rel(&k, "alice", 2, Duration::ZERO))
            .await
            .unwrap(),
        LockRelease::Nested { depth: 1 }
    );
    // An entry at level 2 that arrives after the outer release is lost, not a new lock.
    store
        .lock_acquire(acq(&k, "alice", LEASE, 2))
        .await
        .unwrap();
    assert_eq!(
        store
            .lock_release(rel(&k, "alice", 1, Duration::ZERO))
            .await
            .unwrap(),
        LockRelease::Released
    );
    assert_eq!(
        store
            .lock_acquire(acq(&k, "alice", LEASE, 2))
            .await
            .unwrap(),
        LockAcquire::Lost
    );
    assert_eq!(
        store
            .lock_release(rel(&k, "alice", 1, Duration::ZERO))
            .await
            .unwrap(),
        LockRelease::NotOwner
    );
    assert!(matches!(
        store.lock_acquire(acq(&k, "bob", LEASE, 1)).await.unwrap(),
        LockAcquire::Acquired { .. }
    ));
}

/// Tokens are never below the store's clock in microseconds, so they keep increasing when the
/// counter is lost (a failover that dropped the last writes, or expiry).
async fn fences_follow_the_store_clock(rg: Redguard) {
    let store = redguard::__private::store::of(&rg);
    for kind in 0..3 {
        let k = key(&rg, &format!("clock{kind}"));
        let mut last = 0;
        for owner in ["alice", "bob"] {
            // Time passes between the two: the counter alone would hand out `last + 1`.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let before = u64::try_from(store.time().await.unwrap().as_micros()).unwrap();
            let outcome = match kind {
                0 => store.lock_acquire(acq(&k, owner, LEASE, 1)).await,
                1 => store.semaphore_acquire(acq(&k, owner, LEASE, 1), 1).await,
                _ => {
                    store
                        .fair_acquire(Acquire {
                            waiting: false,
                            ..acq(&k, owner, LEASE, 1)
                        })
                        .await
                }
            };
            let LockAcquire::Acquired { fence, .. } = outcome.unwrap() else {
                panic!("kind {kind}: {owner} not acquired")
            };
            assert!(
                fence >= before,
                "kind {kind}: token {fence} below the clock {before}"
            );
            assert!(fence > last);
            last = fence;
            let released = match kind {
                0 => store.lock_release(rel(&k, owner, 1, Duration::ZERO)).await,
                1 => store.semaphore_release(&k, owner).await,
                _ => store.fair_release(rel(&k, owner, 1, Duration::ZERO)).await,
            };
            assert_eq!(released.unwrap(), LockRelease::Released);
        }
    }
}

async fn release_keeps_key_for_hold_at_least(rg: Redguard) {
    let k = key(&rg, "h");
    let store = redguard::__private::store::of(&rg);
    store
        .lock_acquire(acq(&k, "alice", LEASE, 1))
        .await
        .unwrap();
    let keep = Duration::from_millis(400);
    assert_eq!(
        store.lock_release(rel(&k, "alice", 1, keep)).await.unwrap(),
        LockRelease::Released
    );
    // Kept by nobody: not even the old owner can renew or re-enter it.
    assert!(!store.lock_renew(&k, "alice", LEASE).await.unwrap());
    for owner in ["alice", "bob"] {
        assert!(matches!(
            store.lock_acquire(acq(&k, owner, LEASE, 1)).await.unwrap(),
            LockAcquire::Held { .. }
        ));
    }
    tokio::time::sleep(keep + Duration::from_millis(100)).await;
    assert!(matches!(
        store.lock_acquire(acq(&k, "bob", LEASE, 1)).await.unwrap(),
        LockAcquire::Acquired { .. }
    ));
}

async fn lease_expiry_frees_the_key(rg: Redguard) {
    let k = key(&rg, "e");
    let store = redguard::__private::store::of(&rg);
    let short = Duration::from_millis(200);
    store
        .lock_acquire(acq(&k, "alice", short, 1))
        .await
        .unwrap();
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    assert!(!store.lock_renew(&k, "alice", LEASE).await.unwrap());
    assert!(matches!(
        store.lock_acquire(acq(&k, "bob", LEASE, 1)).await.unwrap(),
        LockAcquire::Acquired { .. }
    ));
    // Alice's late release must not free Bob's lock.
    assert_eq!(
        store
            .lock_release(rel(&k, "alice", 1, Duration::ZERO))
            .await
            .unwrap(),
        LockRelease::NotOwner
    );
    assert!(store.lock_renew(&k, "bob", LEASE).await.unwrap());
}

async fn watch_wakes_on_release(rg: Redguard) {
    let k = key(&rg, "w");
    let store = redguard::__private::store::of(&rg);
    store
        .lock_acquire(acq(&k, "alice", LEASE, 1))
        .await
        .unwrap();
    let mut watch = store.lock_watch(&k).await;
    assert!(watch.is_live());
    // A waiter's attempt finds it held, which asks for the release to be announced.
    let waiting = Acquire {
        waiting: true,
        ..acq(&k, "bob", LEASE, 1)
    };
    assert!(matches!(
        store.lock_acquire(waiting).await.unwrap(),
        LockAcquire::Held { .. }
    ));
    store
        .lock_release(rel(&k, "alice", 1, Duration::ZERO))
        .await
        .unwrap();
    // Taken before the release, so the release is seen even though we wait only now.
    tokio::time::timeout(Duration::from_secs(2), watch.changed())
        .await
        .expect("release notification");
}

/// A release nobody waited for announces nothing on Redis (no `PUBLISH` on the uncontended
/// path); the in-memory store may announce it anyway.
async fn a_release_nobody_waits_for_is_not_announced(rg: Redguard) {
    let k = key(&rg, "quiet");
    let store = redguard::__private::store::of(&rg);
    store
        .lock_acquire(acq(&k, "alice", LEASE, 1))
        .await
        .unwrap();
    let mut watch = store.lock_watch(&k).await;
    store
        .lock_release(rel(&k, "alice", 1, Duration::ZERO))
        .await
        .unwrap();
    let announced = tokio::time::timeout(Duration::from_millis(300), watch.changed())
        .await
        .is_ok();
    if rg.kind() != redguard::handle::StoreKind::Memory {
        assert!(!announced, "an uncontended release was published");
    }
}

/// A fair lock's release hands it to the queue's head and tells the head alone, with its
/// fencing token; a head that gives up passes it on; one that vanishes holds it only for
/// `FAIR_REGISTRATION`, not for a lease.
async fn fair_release_hands_over_to_the_head(rg: Redguard) {
    let k = key(&rg, "fair");
    let store = redguard::__private::store::of(&rg);
    let quiet = Duration::from_millis(300);
    let fired = Duration::from_secs(2);
    let fair = |owner: &'static str| {
        store.fair_acquire(Acquire {
            waiting: true,
            ..acq(&k, owner, LEASE, 1)
        })
    };
    let alice = fair("alice").await.unwrap();
    let LockAcquire::Acquired { fence: first, .. } = alice else {
        panic!("{alice:?}");
    };
    let mut bob = store.fair_watch(&k, "bob").await;
    let mut carol = store.fair_watch(&k, "carol").await;
    let mut everyone = store.lock_watch(&k).await;
    assert!(bob.is_live() && carol.is_live());
    for waiter in ["bob", "carol", "dave"] {
        let queued = fair(waiter).await;
        assert!(matches!(queued, Ok(LockAcquire::Held { .. })), "{queued:?}");
    }
    let released = store
        .fair_release(rel(&k, "alice", 1, Duration::ZERO))
        .await;
    assert_eq!(released.unwrap(), LockRelease::Released);
    tokio::time::timeout(fired, bob.changed())
        .await
        .expect("the head is told the lock is its");
    let handed = bob.handed().expect("a fencing token with the hand-over");
    assert!(handed > first, "{handed} after {first}");
    assert!(
        tokio::time::timeout(quiet, carol.changed()).await.is_err(),
        "a waiter behind the head was woken by the release"
    );
    assert_eq!(carol.handed(), None);
    assert!(
        tokio::time::timeout(quiet, everyone.changed())
            .await
            .is_err(),
        "a fair release woke the lock's plain waiters"
    );
    // Handed over means held: by bob, for nobody else.
    let refused = store.lock_renew(&k, "carol", LEASE).await.unwrap();
    assert!(!refused);
    assert!(store.lock_renew(&k, "bob", LEASE).await.unwrap());
    // Bob gives up before taking it: it goes on to carol.
    store.fair_leave(&k, "bob").await.unwrap();
    tokio::time::timeout(fired, carol.changed())
        .await
        .expect("the next head is handed the lock when the head leaves");
    let to_carol = carol.handed().expect("carol's token");
    assert!(to_carol > handed);
    // Carol missed the notice and asks again: the lock she was handed is hers.
    let taken = fair("carol").await.unwrap();
    assert_eq!(
        taken,
        LockAcquire::Acquired {
            fence: to_carol,
            depth: 1
        }
    );
    // Dave is handed it next and never shows up: it frees once his registration would have
    // lapsed, not after a lease.
    store
        .fair_release(rel(&k, "carol", 1, Duration::ZERO))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let erin = loop {
        match store
            .fair_acquire(Acquire {
                waiting: false,
                ..acq(&k, "erin", LEASE, 1)
            })
            .await
            .unwrap()
        {
            LockAcquire::Held { .. } => tokio::time::sleep(Duration::from_millis(50)).await,
            taken => break taken,
        }
        assert!(
            started.elapsed() < LEASE,
            "a vanished head blocked the lock"
        );
    };
    assert!(matches!(erin, LockAcquire::Acquired { .. }), "{erin:?}");
    assert!(
        started.elapsed()
            <= redguard::__private::store::FAIR_REGISTRATION + Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
}

async fn api_timeout_held_and_release(rg: Redguard) {
    let guard = rg.lock("job:1").acquire().await.unwrap();
    assert!(guard.fence() > 0);
    let wait = Duration::from_millis(150);
    let started = std::time::Instant::now();
    let timed_out = rg.lock("job:1").wait(wait).acquire().await;
    let waited = started.elapsed();
    assert!(
        matches!(timed_out, Err(Error::LockTimeout { .. })),
        "{timed_out:?}"
    );
    assert!(
        waited >= wait && waited < wait + Duration::from_millis(100),
        "{waited:?}"
    );
    let skipped = rg.lock("job:1").skip_if_held().acquire().await;
    assert!(
        matches!(skipped, Err(Error::LockHeld { .. })),
        "{skipped:?}"
    );
    assert!(rg.lock("job:1").try_acquire().await.unwrap().is_none());
    let fence = guard.fence();
    guard.release().await.unwrap();
    let next = rg.lock("job:1").acquire().await.unwrap();
    assert!(next.fence() > fence);
    next.release().await.unwrap();
}

async fn api_run_exposes_fence_and_reenters(rg: Redguard) {
    let (outer, inner) = rg
        .lock("order:9")
        .run(async {
            let outer = redguard::lock::fence();
            // Same task: re-enters instead of deadlocking on itself, same token.
            let inner = rg
                .lock("order:9")
                .run(async { Ok::<_, Error>(redguard::lock::fence()) })
                .await?;
            Ok::<_, Error>((outer, inner))
        })
        .await
        .unwrap();
    assert!(outer.is_some());
    assert_eq!(outer, inner);
    // Released after the run: free for anyone.
    assert!(rg.lock("order:9").try_acquire().await.unwrap().is_some());

    // Depth limit: each level re-enters, the sixth is refused.
    fn nest(
        rg: Redguard,
        left: u32,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<u32, Error>> + Send>> {
        Box::pin(async move {
            let inner = rg.clone();
            rg.lock("deep")
                .run(async move {
                    if left == 0 {
                        Ok(0)
                    } else {
                        nest(inner, left - 1).await.map(|d| d + 1)
                    }
                })
                .await
        })
    }
    assert_eq!(nest(rg.clone(), 4).await.unwrap(), 4);
    let too_deep = nest(rg.clone(), 5).await;
    assert!(
        matches!(too_deep, Err(Error::LockTooDeep { depth: 5, .. })),
        "{too_deep:?}"
    );
    assert!(rg.lock("deep").try_acquire().await.unwrap().is_some());
}

async fn api_rejects_bad_settings(rg: Redguard) {
    for builder in [
        rg.lock("x").wait(Duration::from_secs(61)),
        rg.lock("x").lease(Duration::from_millis(999)),
        rg.lock("x").lease(Duration::from_secs(3601)),
    ] {
        let outcome = builder.acquire().await;
        assert!(matches!(outcome, Err(Error::Config(_))), "{outcome:?}");
    }
    let bad = rg.lock("a b").acquire().await;
    assert!(matches!(bad, Err(Error::InvalidKey { .. })), "{bad:?}");
}

async fn semaphore_admits_n_holders(rg: Redguard) {
    let k = key(&rg, "s");
    let store = redguard::__private::store::of(&rg);
    let mut last = 0;
    for owner in ["a", "b", "c"] {
        let LockAcquire::Acquired { fence, .. } = store
            .semaphore_acquire(acq(&k, owner, LEASE, 1), 3)
            .await
            .unwrap()
        else {
            panic!("{owner} refused")
        };
        assert!(fence > last);
        last = fence;
    }
    match store
        .semaphore_acquire(acq(&k, "d", LEASE, 1), 3)
        .await
        .unwrap()
    {
        LockAcquire::Held { ttl } => assert!(ttl <= LEASE, "{ttl:?}"),
        other => panic!("{other:?}"),
    }
    assert!(store.semaphore_renew(&k, "b", LEASE).await.unwrap());
    assert!(!store.semaphore_renew(&k, "d", LEASE).await.unwrap());
    assert_eq!(
        store.semaphore_release(&k, "d").await.unwrap(),
        LockRelease::NotOwner
    );
    assert_eq!(
        store.semaphore_release(&k, "b").await.unwrap(),
        LockRelease::Released
    );
    assert!(matches!(
        store
            .semaphore_acquire(acq(&k, "d", LEASE, 1), 3)
            .await
            .unwrap(),
        LockAcquire::Acquired { .. }
    ));
    // A holder whose lease ran out frees its slot.
    let short = Duration::from_millis(200);
    let k2 = key(&rg, "s2");
    store
        .semaphore_acquire(acq(&k2, "a", short, 1), 1)
        .await
        .unwrap();
    assert!(matches!(
        store
            .semaphore_acquire(acq(&k2, "b", LEASE, 1), 1)
            .await
            .unwrap(),
        LockAcquire::Held { .. }
    ));
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    assert!(!store.semaphore_renew(&k2, "a", LEASE).await.unwrap());
    assert!(matches!(
        store
            .semaphore_acquire(acq(&k2, "b", LEASE, 1), 1)
            .await
            .unwrap(),
        LockAcquire::Acquired { .. }
    ));
    for owner in ["a", "c", "d"] {
        store.semaphore_release(&k, owner).await.unwrap();
    }
}

async fn read_write_modes_exclude(rg: Redguard) {
    let k = key(&rg, "rw");
    let store = redguard::__private::store::of(&rg);
    let acquired = |outcome: LockAcquire| matches!(outcome, LockAcquire::Acquired { .. });
    // Readers share.
    assert!(acquired(
        store
            .rw_acquire(
                Acquire {
                    waiting: true,
                    ..acq(&k, "r1", LEASE, 1)
                },
                false
            )
            .await
            .unwrap()
    ));
    assert!(acquired(
        store
            .rw_acquire(
                Acquire {
                    waiting: true,
                    ..acq(&k, "r2", LEASE, 1)
                },
                false
            )
            .await
            .unwrap()
    ));
    // A writer that will not wait does not hold readers back.
    assert!(!acquired(
        store
            .rw_acquire(
                Acquire {
                    waiting: false,
                    ..acq(&k, "w0", LEASE, 1)
                },
                true
            )
            .await
            .unwrap()
    ));
    assert!(acquired(
        store
            .rw_acquire(
                Acquire {
                    waiting: true,
                    ..acq(&k, "r0", LEASE, 1)
                },
                false
            )
            .await
            .unwrap()
    ));
    store.rw_release_read(&k, "r0").await.unwrap();
    // A writer waits for them, and from then on new readers queue behind it.
    assert!(!acquired(
        store
            .rw_acquire(
                Acquire {
                    waiting: true,
                    ..acq(&k, "w1", LEASE, 1)
                },
                true
            )
            .await
            .unwrap()
    ));
    assert!(!acquired(
        store
            .rw_acquire(
                Acquire {
                    waiting: true,
                    ..acq(&k, "r3", LEASE, 1)
                },
                false
            )
            .await
            .unwrap()
    ));
    let readers = redguard::__private::store::rw_readers(&k);
    assert!(store.semaphore_renew(&readers, "r1", LEASE).await.unwrap());
    for reader in ["r1", "r2"] {
        assert_eq!(
            store.rw_release_read(&k, reader).await.unwrap(),
            LockRelease::Released
        );
    }
    assert_eq!(
        store.rw_release_read(&k, "r1").await.unwrap(),
        LockRelease::NotOwner
    );
    // Another writer cannot jump the announced one.
    assert!(!acquired(
        store
            .rw_acquire(
                Acquire {
                    waiting: true,
                    ..acq(&k, "w2", LEASE, 1)
                },
                true
            )
            .await
            .unwrap()
    ));
    let LockAcquire::Acquired { fence, .. } = store
        .rw_acquire(
            Acquire {
                waiting: true,
                ..acq(&k, "w1", LEASE, 1)
            },
            true,
        )
        .await
        .unwrap()
    else {
        panic!("the waiting writer did not get in")
    };
    assert!(fence > 0);
    assert!(!acquired(
        store
            .rw_acquire(
                Acquire {
                    waiting: true,
                    ..acq(&k, "r3", LEASE, 1)
                },
                false
            )
            .await
            .unwrap()
    ));
    assert!(!acquired(
        store
            .rw_acquire(
                Acquire {
                    waiting: true,
                    ..acq(&k, "w2", LEASE, 1)
                },
                true
            )
            .await
            .unwrap()
    ));
    assert!(store.lock_renew(&k, "w1", LEASE).await.unwrap());
    assert_eq!(
        store
            .lock_release(rel(&k, "w1", 1, Duration::ZERO))
            .await
            .unwrap(),
        LockRelease::Released
    );
    assert!(acquired(
        store
            .rw_acquire(
                Acquire {
                    waiting: true,
                    ..acq(&k, "r3", LEASE, 1)
                },
                false
            )
            .await
            .unwrap()
    ));
    store.rw_release_read(&k, "r3").await.unwrap();
}

/// A fair lock freed by its lease running out (no release to hand it over) goes to the first
/// waiter still registered: a waiter whose place lapsed (it stopped retrying for longer than
/// `FAIR_REGISTRATION`) comes back behind the ones that kept theirs, even though its old place
/// was at the head. Found by the lock model on Redis (the stale ticket at the head took it).
async fn a_lapsed_place_at_the_head_does_not_take_a_free_lock(rg: Redguard) {
    let k = key(&rg, "lapsed");
    let store = redguard::__private::store::of(&rg);
    let registration = redguard::__private::store::FAIR_REGISTRATION;
    let fair = |owner: &'static str, lease: Duration, waiting: bool| {
        store.fair_acquire(Acquire {
            waiting,
            ..acq(&k, owner, lease, 1)
        })
    };
    let started = std::time::Instant::now();
    // Alice holds it until her lease runs out, a little after bob's place lapses.
    let lease = registration + Duration::from_millis(400);
    let alice = fair("alice", lease, true).await.unwrap();
    assert!(matches!(alice, LockAcquire::Acquired { .. }), "{alice:?}");
    let bob = fair("bob", LEASE, true).await.unwrap();
    assert!(matches!(bob, LockAcquire::Held { .. }), "{bob:?}");
    tokio::time::sleep(registration + Duration::from_millis(200)).await;
    // Carol queues while bob's place has lapsed: hers is live for `registration`.
    let carol = fair("carol", LEASE, true).await.unwrap();
    let carol_at = std::time::Instant::now();
    assert!(matches!(carol, LockAcquire::Held { .. }), "{carol:?}");
    tokio::time::sleep(
        (started + lease + Duration::from_millis(200))
            .saturating_duration_since(std::time::Instant::now()),
    )
    .await;
    let bob = fair("bob", LEASE, true).await.unwrap();
    if carol_at.elapsed() < registration {
        assert!(
            matches!(bob, LockAcquire::Held { .. }),
            "bob's lapsed place took the lock ahead of carol: {bob:?}"
        );
        let carol = fair("carol", LEASE, true).await.unwrap();
        assert!(matches!(carol, LockAcquire::Acquired { .. }), "{carol:?}");
    }
}
