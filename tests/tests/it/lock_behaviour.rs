//! Lock behaviour over time on both stores: the watchdog, losing a lock, timeouts, hand-off
//! latency through release notifications, and `#[dist_lock]` end to end.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use redguard::lock::OnLost;
use redguard::{Error, LockKind, ManualClock, Redguard};
use redguard_tests::RedisServer;

const LEASE: Duration = Duration::from_secs(1);

async fn redis() -> (RedisServer, Redguard) {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    (server, rg)
}

/// A body running 3× the lease keeps the lock: others are refused all along.
async fn watchdog_keeps_lock(rg: Redguard) {
    let contender = rg.clone();
    let refused = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&refused);
    let outcome = rg
        .lock("long")
        .lease(LEASE)
        .run(async move {
            let until = Instant::now() + LEASE * 3;
            while Instant::now() < until {
                tokio::time::sleep(LEASE / 4).await;
                // Another task: within this one the lock would be re-entered.
                let other = contender.clone();
                let attempt = tokio::spawn(async move { other.lock("long").try_acquire().await });
                match attempt.await.expect("attempt")? {
                    None => seen.fetch_add(1, Ordering::SeqCst),
                    Some(_) => panic!("the lock was free while its holder ran"),
                };
            }
            Ok::<_, Error>("done")
        })
        .await;
    assert_eq!(outcome.unwrap(), "done");
    assert!(refused.load(Ordering::SeqCst) >= 10);
    assert!(rg.lock("long").try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_lock_memory() {
    watchdog_keeps_lock(Redguard::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_lock_redis() {
    let (server, rg) = redis().await;
    watchdog_keeps_lock(rg).await;
    server.assert_every_key_has_ttl();
}

/// A section under `run` starts its renewal task only when its first renewal falls due (a
/// third of the lease): a short section never has one, a long one has it from then on and
/// keeps the lock; a guard from `acquire` has it at once. Dropping a long section mid-way
/// leaves no task behind and frees the key.
async fn renewal_starts_when_due(rg: Redguard) {
    let probe = rg.clone();
    rg.lock("short")
        .lease(LEASE)
        .run(async {
            tokio::time::sleep(LEASE / 10).await;
            assert_eq!(probe.live_watchdogs(), 0, "a short section started a task");
            Ok::<_, Error>(())
        })
        .await
        .unwrap();

    let probe = rg.clone();
    rg.lock("long")
        .lease(LEASE)
        .run(async {
            tokio::time::sleep(LEASE / 5).await;
            assert_eq!(probe.live_watchdogs(), 0, "started before it was due");
            tokio::time::sleep(LEASE / 5).await;
            assert_eq!(probe.live_watchdogs(), 1, "not started once due");
            tokio::time::sleep(LEASE).await;
            let other = probe.clone();
            let taken = tokio::spawn(async move { other.lock("long").try_acquire().await });
            assert!(
                taken.await.unwrap().unwrap().is_none(),
                "the lock lapsed although its section ran"
            );
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    // An aborted task is dropped on the runtime's next turns.
    let deadline = Instant::now() + Duration::from_secs(2);
    while rg.live_watchdogs() != 0 {
        assert!(
            Instant::now() < deadline,
            "the long section's task outlived it"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let guard = rg.lock("guard").lease(LEASE).acquire().await.unwrap();
    assert_eq!(rg.live_watchdogs(), 1, "a guard from acquire has no task");
    guard.release().await.unwrap();

    let section = rg.lock("dropped").lease(LEASE).run(async {
        tokio::time::sleep(LEASE * 10).await;
        Ok::<_, Error>(())
    });
    assert!(
        tokio::time::timeout(LEASE / 2, section).await.is_err(),
        "the section ended early"
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    while rg.live_watchdogs() != 0 || rg.lock("dropped").try_acquire().await.unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "a dropped section left its task or its key"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_starts_when_due_memory() {
    renewal_starts_when_due(Redguard::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_starts_when_due_redis() {
    let (server, rg) = redis().await;
    renewal_starts_when_due(rg).await;
    server.assert_every_key_has_ttl();
}

/// The key disappears under a holder (`expire` deletes it): the body is cancelled with
/// `LockLost`, a new owner takes the key, and the old holder's release leaves it alone.
async fn lost_lock_cancels_body(rg: Redguard, expire: impl Fn()) {
    let holder = rg.clone();
    let started = Arc::new(AtomicU32::new(0));
    let finished = Arc::new(AtomicU32::new(0));
    let (s, f) = (Arc::clone(&started), Arc::clone(&finished));
    let running = tokio::spawn(async move {
        holder
            .lock("lost")
            .lease(LEASE)
            .run(async move {
                s.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(LEASE * 5).await;
                f.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(())
            })
            .await
    });
    while started.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    expire();
    let thief = rg
        .lock("lost")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let lost_at = Instant::now();
    let outcome = running.await.unwrap();
    assert!(
        matches!(outcome, Err(Error::LockLost { .. })),
        "{outcome:?}"
    );
    assert!(
        lost_at.elapsed() < LEASE,
        "noticed after {:?}",
        lost_at.elapsed()
    );
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "the body was not cancelled"
    );
    // The stale holder's release did not free the new owner's lock.
    assert!(rg.lock("lost").try_acquire().await.unwrap().is_none());
    thief.release().await.unwrap();
    assert!(rg.lock("lost").try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lock_cancels_body_memory() {
    let clock = ManualClock::new();
    let rg = Redguard::memory_builder()
        .clock(clock.clone())
        .connect()
        .await
        .unwrap();
    lost_lock_cancels_body(rg, || clock.advance(LEASE * 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lock_cancels_body_redis() {
    let (server, rg) = redis().await;
    lost_lock_cancels_body(rg, || {
        let mut conn = server.connection();
        let deleted: i64 = redis::cmd("DEL")
            .arg("redguard:lock:{lock:lost}")
            .query(&mut conn)
            .unwrap();
        assert_eq!(deleted, 1);
    })
    .await;
    server.assert_every_key_has_ttl();
}

/// `on_lost = continue`: the body finishes and its result is returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lock_can_continue() {
    let clock = ManualClock::new();
    let rg = Redguard::memory_builder()
        .clock(clock.clone())
        .connect()
        .await
        .unwrap();
    let outcome = rg
        .lock("cont")
        .lease(LEASE)
        .on_lost(OnLost::Continue)
        .run(async {
            clock.advance(LEASE * 2);
            tokio::time::sleep(LEASE).await;
            Ok::<_, Error>(7)
        })
        .await;
    assert_eq!(outcome.unwrap(), 7);
}

/// `wait` is honoured: a waiter gives up within a few ms of the bound.
async fn wait_timeout_is_honoured(rg: Redguard) {
    let _held = rg.lock("busy").acquire().await.unwrap();
    let wait = Duration::from_millis(200);
    let mut overshoot = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        let outcome = rg.lock("busy").wait(wait).acquire().await;
        assert!(
            matches!(outcome, Err(Error::LockTimeout { .. })),
            "{outcome:?}"
        );
        let waited = started.elapsed();
        assert!(waited >= wait, "{waited:?}");
        overshoot.push(waited - wait);
    }
    overshoot.sort();
    println!(
        "wait {wait:?}: overshoot median {:?}, max {:?}",
        overshoot[overshoot.len() / 2],
        overshoot[overshoot.len() - 1]
    );
    assert!(overshoot[overshoot.len() / 2] < Duration::from_millis(50));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_timeout_is_honoured_memory() {
    wait_timeout_is_honoured(Redguard::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_timeout_is_honoured_redis() {
    let (server, rg) = redis().await;
    wait_timeout_is_honoured(rg).await;
    server.assert_every_key_has_ttl();
}

/// Hand-off latency: from the holder starting its release to the waiter (on another handle,
/// so through Redis pub/sub) returning from `acquire`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_latency_through_pubsub() {
    let server = RedisServer::start();
    let a = redguard_tests::connect(&server).await;
    let b = redguard_tests::connect(&server).await;
    let mut latencies = Vec::new();
    for _ in 0..100 {
        let held = a.lock("relay").acquire().await.unwrap();
        let waiter = b.clone();
        let waiting = tokio::spawn(async move {
            waiter
                .lock("relay")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        });
        // Let the waiter subscribe, try, and go to sleep.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let released_at = Instant::now();
        held.release().await.unwrap();
        let next = waiting.await.unwrap().unwrap();
        latencies.push(released_at.elapsed());
        next.release().await.unwrap();
    }
    latencies.sort();
    let p50 = latencies[latencies.len() / 2];
    let p99 = latencies[latencies.len() * 99 / 100];
    println!(
        "hand-off latency over {} releases: p50 {p50:?}, p99 {p99:?}",
        latencies.len()
    );
    // Polling alone would take up to 500 ms with a live subscription.
    assert!(
        p50 < Duration::from_millis(100),
        "p50 {p50:?}: not woken by the release"
    );
    server.assert_every_key_has_ttl();
}

#[derive(Debug)]
enum OrderError {
    Lock(Error),
    OutOfStock,
}

impl From<Error> for OrderError {
    fn from(err: Error) -> Self {
        OrderError::Lock(err)
    }
}

#[redguard::dist_lock(key = "stock:{sku}", wait = "100ms", lease = "2s")]
async fn reserve(sku: &str, hold: Duration, stock: u32) -> Result<u64, OrderError> {
    tokio::time::sleep(hold).await;
    if stock == 0 {
        return Err(OrderError::OutOfStock);
    }
    Ok(redguard::fence().expect("a fence inside the lock"))
}

/// `#[dist_lock]` end to end: exclusion, the fence, the user's error type, refusals.
async fn attribute_end_to_end(rg: Redguard) {
    rg.scope(async {
        let first = reserve("SK1", Duration::ZERO, 1).await.unwrap();
        let second = reserve("SK1", Duration::ZERO, 1).await.unwrap();
        assert!(second > first);
        assert!(matches!(
            reserve("SK1", Duration::ZERO, 0).await,
            Err(OrderError::OutOfStock)
        ));
        // The business error released the lock too.
        let (slow, blocked) = tokio::join!(reserve("SK2", Duration::from_millis(400), 1), async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            reserve("SK2", Duration::ZERO, 1).await
        });
        assert!(slow.is_ok());
        assert!(
            matches!(blocked, Err(OrderError::Lock(Error::LockTimeout { .. }))),
            "{blocked:?}"
        );
        let bad = reserve("no spaces", Duration::ZERO, 1).await;
        assert!(
            matches!(bad, Err(OrderError::Lock(Error::InvalidKey { .. }))),
            "{bad:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attribute_end_to_end_memory() {
    attribute_end_to_end(Redguard::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attribute_end_to_end_redis() {
    let (server, rg) = redis().await;
    attribute_end_to_end(rg).await;
    server.assert_every_key_has_ttl();
}

/// Redis down: locks fail closed by default; the body does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_down_fails_closed() {
    let (mut server, rg) = redis().await;
    server.kill();
    let ran = AtomicU32::new(0);
    let outcome = rg
        .lock("down")
        .run(async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(())
        })
        .await;
    assert!(matches!(outcome, Err(Error::Backend(_))), "{outcome:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// Callers locking `{A, B}`, `{B, A}` and `{B}` concurrently: no deadlock, never two inside B;
/// a set that cannot be completed is rolled back.
async fn multi_lock_is_all_or_nothing(rg: Redguard) {
    let in_b = Arc::new(AtomicU32::new(0));
    let sets: [&[&str]; 3] = [&["A", "B"], &["B", "A"], &["B"]];
    let tasks: Vec<_> = sets
        .into_iter()
        .map(|set| {
            let rg = rg.clone();
            let in_b = Arc::clone(&in_b);
            let set: Vec<String> = set.iter().map(|k| k.to_string()).collect();
            tokio::spawn(async move {
                for _ in 0..100 {
                    let guard = rg
                        .lock_all(set.iter())
                        .wait(Duration::from_secs(10))
                        .acquire()
                        .await
                        .expect("no deadlock, no timeout");
                    assert_eq!(in_b.fetch_add(1, Ordering::SeqCst), 0, "two holders of B");
                    tokio::task::yield_now().await;
                    in_b.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("multi-locks deadlocked");

    // B is busy: {A, B} gives up after `wait` and leaves A free.
    let b = rg.lock("B").acquire().await.unwrap();
    let outcome = rg
        .lock_all(["A", "B"])
        .wait(Duration::from_millis(100))
        .acquire()
        .await;
    assert!(
        matches!(outcome, Err(Error::LockTimeout { .. })),
        "{outcome:?}"
    );
    let probe = rg.clone();
    let a_free =
        tokio::spawn(async move { probe.lock("A").try_acquire().await.unwrap().is_some() });
    assert!(a_free.await.unwrap(), "A stayed locked after the rollback");
    b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_is_all_or_nothing_memory() {
    multi_lock_is_all_or_nothing(Redguard::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_is_all_or_nothing_redis() {
    let (server, rg) = redis().await;
    multi_lock_is_all_or_nothing(rg).await;
    server.assert_every_key_has_ttl();
}

/// A semaphore of 3: many tasks, never more than 3 inside, and all 3 slots get used.
async fn semaphore_never_exceeds_permits(rg: Redguard) {
    let inside = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (rg, inside, peak) = (rg.clone(), Arc::clone(&inside), Arc::clone(&peak));
            tokio::spawn(async move {
                for _ in 0..20 {
                    rg.lock("exports")
                        .permits(3)
                        .wait(Duration::from_secs(10))
                        .run(async {
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            peak.fetch_max(now, Ordering::SeqCst);
                            assert!(now <= 3, "{now} holders of 3 permits");
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                            Ok::<_, Error>(())
                        })
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(peak.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_never_exceeds_permits_memory() {
    semaphore_never_exceeds_permits(Redguard::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_never_exceeds_permits_redis() {
    let (server, rg) = redis().await;
    semaphore_never_exceeds_permits(rg).await;
    server.assert_every_key_has_ttl();
}

/// Readers and writers mixed: never a writer with anyone else inside, readers overlap, and
/// writers are not starved by a stream of readers.
async fn read_write_lock_excludes_writers(rg: Redguard) {
    let readers = Arc::new(AtomicU32::new(0));
    let writers = Arc::new(AtomicU32::new(0));
    let peak_readers = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let rg = rg.clone();
            let (readers, writers, peak) = (
                Arc::clone(&readers),
                Arc::clone(&writers),
                Arc::clone(&peak_readers),
            );
            tokio::spawn(async move {
                let write = i % 4 == 0;
                for _ in 0..15 {
                    let kind = if write {
                        LockKind::Write
                    } else {
                        LockKind::Read
                    };
                    let builder = rg.lock("catalog").kind(kind).wait(Duration::from_secs(20));
                    builder
                        .run(async {
                            if write {
                                assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0);
                                assert_eq!(readers.load(Ordering::SeqCst), 0, "reader + writer");
                            } else {
                                let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                                peak.fetch_max(now, Ordering::SeqCst);
                                assert_eq!(writers.load(Ordering::SeqCst), 0, "writer + reader");
                            }
                            tokio::time::sleep(Duration::from_millis(3)).await;
                            if write {
                                writers.fetch_sub(1, Ordering::SeqCst);
                            } else {
                                readers.fetch_sub(1, Ordering::SeqCst);
                            }
                            Ok::<_, Error>(())
                        })
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("writers starved");
    assert!(
        peak_readers.load(Ordering::SeqCst) >= 2,
        "readers never shared the lock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_lock_excludes_writers_memory() {
    read_write_lock_excludes_writers(Redguard::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_lock_excludes_writers_redis() {
    let (server, rg) = redis().await;
    read_write_lock_excludes_writers(rg).await;
    server.assert_every_key_has_ttl();
}

/// A fair lock goes to waiters in arrival order; a waiter that is cancelled leaves the queue
/// at once instead of holding up the ones behind it until its place lapses. Each waiter has
/// its own handle (as if in its own process), so only the store orders them.
async fn fair_lock_is_fifo(handles: Vec<Redguard>) {
    let held = handles[0].lock("payout").fair().acquire().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (i, rg) in handles[1..].iter().cloned().enumerate() {
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(async move {
            let guard = rg
                .lock("payout")
                .fair()
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap();
            order.lock().unwrap().push((i, Instant::now()));
            tokio::time::sleep(Duration::from_millis(5)).await;
            guard.release().await.unwrap();
        }));
        // Arrivals 30 ms apart: each has queued before the next arrives.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    waiters[2].abort();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    for (i, waiter) in waiters.into_iter().enumerate() {
        let outcome = waiter.await;
        assert_eq!(outcome.is_err(), i == 2, "waiter {i}: {outcome:?}");
    }
    let order = order.lock().unwrap();
    let ids: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(ids, [0, 1, 3, 4, 5]);
    let took = order[order.len() - 1].1 - released_at;
    println!("5 fair hand-offs took {took:?}");
    // A lapsing place would stall the queue for FAIR_REGISTRATION (2 s).
    assert!(took < Duration::from_secs(1), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lock_is_fifo_memory() {
    let store = redguard::__private::store::MemoryStore::new();
    let handles = (0..7)
        .map(|_| redguard::__private::store::handle(store.clone()))
        .collect();
    fair_lock_is_fifo(handles).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lock_is_fifo_redis() {
    let server = RedisServer::start();
    let mut handles = Vec::new();
    for _ in 0..7 {
        handles.push(redguard_tests::connect(&server).await);
    }
    fair_lock_is_fifo(handles).await;
    server.assert_every_key_has_ttl();
}

/// Redis stops answering while a lock is held: renewals fail, and before the lease can run
/// out unrenewed the holder gives the lock up and its body is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_store_while_holding_is_a_lost_lock() {
    let (server, rg) = redis().await;
    let paused = Arc::new(AtomicU32::new(0));
    let flag = Arc::clone(&paused);
    let started = Instant::now();
    let outcome = rg
        .lock("paused")
        .lease(LEASE)
        .run(async {
            server.pause();
            flag.store(1, Ordering::SeqCst);
            // Marks a body that ran on well past its lease.
            tokio::time::sleep(LEASE * 3 / 2).await;
            flag.store(2, Ordering::SeqCst);
            tokio::time::sleep(LEASE * 10).await;
            Ok::<_, Error>(())
        })
        .await;
    let took = started.elapsed();
    server.resume();
    // Cancelled before the lease ran out in Redis.
    assert_eq!(
        paused.load(Ordering::SeqCst),
        1,
        "the body ran past the lease"
    );
    assert!(
        matches!(outcome, Err(Error::LockLost { .. })),
        "{outcome:?}"
    );
    assert!(took < LEASE * 2, "noticed after {took:?}");
    println!("lost lock noticed {took:?} after acquiring (lease {LEASE:?})");
}
