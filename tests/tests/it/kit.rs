//! `redguard::testing`, the kit for users' own code: each checker catches a deliberately
//! broken body and passes the correct one; each fault kind exposes the handler bug it is
//! for; the explorer finds a broken handler and reproduces it from the seed; the
//! pass-through handle refuses nothing.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use redguard::clock::ManualClock;
use redguard::handle::FailMode;
use redguard::key::GuardKind;
use redguard::testing::{At, Explore, Fault, Faults, History, Point};
use redguard::{Error, Redguard, dist_lock, idempotent, rate_limit};
use redguard_tests::RedisServer;

const MS: Duration = Duration::from_millis(1);

async fn memory(clock: &ManualClock) -> Redguard {
    Redguard::memory_builder()
        .clock(clock.clone())
        .connect()
        .await
        .expect("memory handle")
}

// ---- the bodies under test ----------------------------------------------------------------

/// The payment's charge, guarded: the effect is what must happen once.
#[idempotent(key = "{payment}", expire = 60)]
async fn charge(history: &History, payment: &str) -> redguard::Result<()> {
    history.effect(payment);
    Ok(())
}

/// The same charge with no guard at all.
async fn charge_unguarded(history: &History, payment: &str) -> redguard::Result<()> {
    history.effect(payment);
    Ok(())
}

/// A charge whose body checks a database backstop first (a unique payment id).
#[idempotent(key = "{payment}", expire = 60)]
async fn charge_backstopped(
    history: &History,
    ledger: &Mutex<HashSet<String>>,
    payment: &str,
) -> redguard::Result<()> {
    let fresh = ledger.lock().expect("ledger").insert(payment.to_owned());
    if fresh {
        history.effect(payment);
    }
    Ok(())
}

/// The restock section: its work awaited inside the lock.
#[dist_lock(key = "sku:{sku}", wait = "5s", lease = "10s")]
async fn restock(history: &History, sku: &str) -> redguard::Result<()> {
    let fence = redguard::lock::fence().unwrap_or(0);
    history
        .held(sku, fence, async {
            tokio::task::yield_now().await;
            tokio::time::sleep(2 * MS).await;
            Ok::<_, Error>(())
        })
        .await
}

/// The bug: the section's work is spawned and outlives the lock.
#[dist_lock(key = "sku:{sku}", wait = "5s", lease = "10s")]
async fn restock_detached(
    history: &History,
    sku: &str,
) -> redguard::Result<tokio::task::JoinHandle<redguard::Result<()>>> {
    let fence = redguard::lock::fence().unwrap_or(0);
    let (history, sku) = (history.clone(), sku.to_owned());
    Ok(tokio::spawn(async move {
        history
            .held(&sku, fence, async {
                // Long enough that the next holder's work starts before it ends, however
                // loaded the machine: the lock is released as soon as this is spawned.
                tokio::time::sleep(50 * MS).await;
                Ok::<_, Error>(())
            })
            .await
    }))
}

#[dist_lock(key = "sku:{sku}", wait = "5s", lease = "10s")]
async fn locked<T>(sku: &str, work: impl Future<Output = T>) -> redguard::Result<T> {
    Ok(work.await)
}

#[rate_limit(key = "user:{user}", rate = "5/s", burst = 5)]
async fn order(history: &History, user: u64) -> redguard::Result<()> {
    history.admitted(&format!("user:{user}"));
    Ok(())
}

/// The bug: the limit is keyed on the request, so it never applies to the user.
#[rate_limit(key = "user:{user}:{request}", rate = "5/s", burst = 5)]
async fn order_per_request(history: &History, user: u64, request: u64) -> redguard::Result<()> {
    history.admitted(&format!("user:{user}"));
    Ok(())
}

// ---- checkers -----------------------------------------------------------------------------

#[tokio::test]
async fn never_twice_catches_an_unguarded_charge() {
    let (history, rg) = (History::new(), Redguard::memory());
    rg.scope(async {
        for _ in 0..3 {
            charge(&history, "pay-1").await.expect("charge");
        }
    })
    .await;
    history.assert_never_twice();

    for _ in 0..3 {
        charge_unguarded(&history, "pay-2").await.expect("charge");
    }
    let twice = history.check_never_twice().expect_err("charged thrice");
    assert_eq!(
        twice.calls.len(),
        2,
        "the shortest counter-example: {twice}"
    );
    assert!(twice.calls.iter().all(|c| c.key == "pay-2"), "{twice}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_together_catches_work_that_outlives_its_lock() {
    let (history, rg) = (History::new(), Redguard::memory());
    rg.scope(async {
        let all = join_all((0..8).map(|_| restock(&history, "a"))).await;
        assert!(all.into_iter().all(|r| r.is_ok()));
    })
    .await;
    history.assert_never_together();
    history.assert_fences_increase();

    let broken = History::new();
    rg.scope(async {
        let spawned = join_all((0..8).map(|_| restock_detached(&broken, "b"))).await;
        for task in spawned {
            task.expect("locked").await.expect("task").expect("section");
        }
    })
    .await;
    let together = broken.check_never_together().expect_err("overlapped");
    assert_eq!(together.calls.len(), 2, "{together}");
}

/// An overlap after the earlier holder was told its lock was lost (`LockLost`, or its body
/// dropped by the lock's `run`) is the documented window, not a violation; the same overlap
/// by a holder that was never told is.
#[tokio::test]
async fn never_together_allows_a_holder_told_its_lock_was_lost() {
    for told in [true, false] {
        let history = History::new();
        let (started, second_started) = tokio::sync::oneshot::channel::<()>();
        let first = history.held("l", 1, async {
            let _ = second_started.await;
            if told {
                Err(Error::LockLost { key: "l".into() })
            } else {
                Ok(())
            }
        });
        let second = history.held("l", 2, async {
            let _ = started.send(());
            Ok::<_, Error>(())
        });
        let _ = tokio::join!(first, second);
        assert_eq!(
            history.check_never_together().is_err(),
            !told,
            "{:#?}",
            history.calls()
        );
    }
}

#[tokio::test]
async fn fences_increase_catches_a_fence_read_outside_the_lock() {
    let (history, rg) = (History::new(), Redguard::memory());
    rg.scope(async {
        for _ in 0..4 {
            // Read inside the section: the lock's own token.
            locked("c", async {
                let fence = redguard::lock::fence().unwrap_or(0);
                history.held("c", fence, async { Ok::<_, Error>(()) }).await
            })
            .await
            .expect("locked")
            .expect("section");
        }
        history.assert_fences_increase();

        let broken = History::new();
        for _ in 0..4 {
            // Read before the section: no lock is held there, so no token.
            let fence = redguard::lock::fence().unwrap_or(0);
            locked("d", broken.held("d", fence, async { Ok::<_, Error>(()) }))
                .await
                .expect("locked")
                .expect("section");
        }
        let stale = broken
            .check_fences_increase()
            .expect_err("fence 0 each time");
        assert_eq!(stale.calls.len(), 2, "{stale}");
    })
    .await;
}

#[tokio::test]
async fn at_most_catches_a_limit_keyed_on_the_request() {
    let clock = ManualClock::new();
    let rg = memory(&clock).await;
    let history = History::with_clock(clock.clone());
    rg.scope(async {
        for _ in 0..20 {
            let _ = order(&history, 1).await;
            clock.advance(10 * MS);
        }
    })
    .await;
    history.assert_at_most(5, Duration::from_secs(1));

    let broken = History::with_clock(clock.clone());
    rg.scope(async {
        for request in 0..20 {
            order_per_request(&broken, 2, request)
                .await
                .expect("never limited");
            clock.advance(10 * MS);
        }
    })
    .await;
    let over = broken
        .check_at_most(5, Duration::from_secs(1))
        .expect_err("20 admitted");
    assert_eq!(over.calls.len(), 6, "limit + 1 calls: {over}");
}

// ---- faults -------------------------------------------------------------------------------

/// Fail: a handler that, when the guard cannot reach its store, charges without it.
#[tokio::test]
async fn fail_exposes_a_handler_that_bypasses_a_failing_guard() {
    async fn deliver(history: &History, bypass: bool) -> redguard::Result<()> {
        match charge(history, "pay-f").await {
            Err(Error::Backend(_)) if bypass => charge_unguarded(history, "pay-f").await,
            other => other,
        }
    }
    for bypass in [false, true] {
        let history = History::new();
        let faults = Faults::new().inject(At::point(Point::IdemBegin).nth(1), Fault::Fail);
        let rg = redguard::testing::faulty(&Redguard::memory(), faults.clone());
        rg.scope(async {
            let _ = deliver(&history, bypass).await; // the queue redelivers on error
            deliver(&history, bypass).await.expect("second delivery");
        })
        .await;
        assert_eq!(faults.injected().len(), 1);
        assert_eq!(history.check_never_twice().is_err(), bypass);
    }
}

/// ReplyLost: every rate decision is made (and charged), then its reply lost; a limit left
/// fail-open admits every call it could not hear about, past its limit, one set fail-closed
/// admits none.
#[tokio::test]
async fn reply_lost_exposes_a_quota_left_fail_open() {
    for mode in [FailMode::Closed, FailMode::Open] {
        let clock = ManualClock::new();
        let rg = Redguard::memory_builder()
            .clock(clock.clone())
            .fail_mode(GuardKind::RateLimit, mode)
            .connect()
            .await
            .expect("memory handle");
        let history = History::with_clock(clock.clone());
        let faults = Faults::new().inject(At::point(Point::RateCheck), Fault::ReplyLost);
        let rg = redguard::testing::faulty(&rg, faults.clone());
        rg.scope(async {
            for _ in 0..20 {
                let _ = order(&history, 3).await;
                clock.advance(10 * MS);
            }
        })
        .await;
        assert_eq!(faults.injected().len(), 20);
        assert_eq!(
            history.check_at_most(5, Duration::from_secs(1)).is_err(),
            mode == FailMode::Open
        );
    }
}

/// ApplyTwice: a begin retried by the client finds its own PROCESSING record and is refused
/// as in progress; a handler that runs the charge anyway when told "in progress" charges
/// twice.
#[tokio::test]
async fn apply_twice_exposes_a_handler_that_runs_anyway_when_in_progress() {
    async fn deliver(history: &History, anyway: bool) -> redguard::Result<()> {
        match charge(history, "pay-t").await {
            Err(Error::InProgress) if anyway => charge_unguarded(history, "pay-t").await,
            other => other,
        }
    }
    for anyway in [false, true] {
        let clock = ManualClock::new();
        let history = History::new();
        let faults = Faults::new().inject(At::point(Point::IdemBegin).nth(1), Fault::ApplyTwice);
        let rg = redguard::testing::faulty(&memory(&clock).await, faults.clone());
        rg.scope(async {
            let first = deliver(&history, anyway).await;
            assert!(
                anyway || matches!(first, Err(Error::InProgress)),
                "{first:?}"
            );
            // The stranded PROCESSING record expires; the redelivery runs.
            clock.advance(Duration::from_secs(61));
            deliver(&history, anyway).await.expect("redelivery");
        })
        .await;
        assert_eq!(faults.injected().len(), 1);
        assert_eq!(history.check_never_twice().is_err(), anyway);
    }
}

/// LoseWrite: the SUCCESS record is lost after it was acknowledged (a failover); the
/// redelivery runs the body again, and only a database backstop keeps the charge single.
#[tokio::test]
async fn lose_write_exposes_a_body_without_a_backstop() {
    for backstop in [true, false] {
        let (history, ledger) = (History::new(), Mutex::new(HashSet::new()));
        let faults = Faults::new().inject(At::point(Point::IdemFinish).nth(1), Fault::LoseWrite);
        let rg = redguard::testing::faulty(&Redguard::memory(), faults.clone());
        rg.scope(async {
            for _ in 0..2 {
                if backstop {
                    charge_backstopped(&history, &ledger, "pay-l").await
                } else {
                    charge(&history, "pay-l").await
                }
                .expect("charge");
            }
        })
        .await;
        assert_eq!(history.check_never_twice().is_err(), !backstop);
    }
}

/// ExpireEarly: the lock's key expires while its holder runs, another holder takes it; a
/// store of stock that takes any write lets the stale holder's write land after the new
/// holder's, one that refuses a fence below the highest it saw does not.
#[tokio::test]
async fn expire_early_exposes_writes_that_ignore_the_fence() {
    for fenced in [true, false] {
        let clock = ManualClock::new();
        let history = History::new();
        let faults = Faults::new().inject(
            At::point(Point::LockAcquire).nth(1),
            Fault::ExpireEarly(Duration::from_secs(1)),
        );
        let rg = redguard::testing::faulty(&memory(&clock).await, faults.clone());
        let highest = Arc::new(Mutex::new(0u64));
        let write = |fence: u64| {
            let (history, highest) = (history.clone(), Arc::clone(&highest));
            async move {
                let refused = {
                    let mut seen = highest.lock().expect("stock");
                    let refused = fenced && fence < *seen;
                    *seen = fence.max(*seen);
                    refused
                };
                if refused {
                    return;
                }
                let _ = history
                    .held("stock", fence, async { Ok::<_, Error>(()) })
                    .await;
            }
        };
        let (first_in, first_go) = tokio::sync::oneshot::channel();
        let (second_done, second_wait) = tokio::sync::oneshot::channel::<()>();
        rg.scope(async {
            let first = locked("e", async {
                let fence = redguard::lock::fence().unwrap_or(0);
                let _ = first_in.send(());
                let _ = second_wait.await; // stalled (a GC pause) past its key's expiry
                write(fence).await;
            });
            let second = async {
                let _ = first_go.await;
                clock.advance(Duration::from_secs(2));
                locked("e", async {
                    write(redguard::lock::fence().unwrap_or(0)).await
                })
                .await
                .expect("second holder");
                let _ = second_done.send(());
            };
            let (first, ()) = tokio::join!(first, second);
            let _ = first;
        })
        .await;
        assert_eq!(faults.injected().len(), 1);
        assert_eq!(
            history.check_fences_increase().is_err(),
            !fenced,
            "{:?}",
            history.calls()
        );
    }
}

/// Stall: renewals that stall past the lease lose the lock; a body that goes on after the
/// loss (`on_lost = "continue"`) overlaps the next holder, the default (cancel) does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_exposes_a_body_that_continues_after_its_lock_is_lost() {
    #[dist_lock(key = "stall:{sku}", wait = "10s", lease = "1s")]
    async fn cancelled(history: &History, sku: &str) -> redguard::Result<()> {
        section(history, sku).await
    }
    #[dist_lock(key = "stall:{sku}", wait = "10s", lease = "1s", on_lost = "continue")]
    async fn continued(history: &History, sku: &str) -> redguard::Result<()> {
        section(history, sku).await
    }
    async fn section(history: &History, sku: &str) -> redguard::Result<()> {
        let fence = redguard::lock::fence().unwrap_or(0);
        history
            .held(sku, fence, async {
                tokio::time::sleep(Duration::from_millis(2500)).await;
                Ok::<_, Error>(())
            })
            .await
    }
    for go_on in [false, true] {
        let history = History::new();
        let faults = Faults::new().inject(
            At::point(Point::LockRenew),
            Fault::Stall(Duration::from_secs(5)),
        );
        let rg = redguard::testing::faulty(&Redguard::memory(), faults.clone());
        rg.scope(async {
            let holder = async {
                let _ = if go_on {
                    continued(&history, "s").await
                } else {
                    cancelled(&history, "s").await
                };
            };
            let next = async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = cancelled(&history, "s").await;
            };
            tokio::join!(holder, next);
        })
        .await;
        assert!(!faults.injected().is_empty(), "no renewal was stalled");
        assert_eq!(
            history.check_never_together().is_err(),
            go_on,
            "{:#?}",
            history.calls()
        );
    }
}

/// Rules pick operations by key pattern and by call number; the rest go through.
#[tokio::test]
async fn faults_pick_operations_by_key_pattern_and_call_number() {
    let history = History::new();
    let faults = Faults::new()
        .inject(At::any().key("*pay-k2*"), Fault::Fail)
        .inject(At::point(Point::IdemBegin).nth(3), Fault::Fail);
    let rg = redguard::testing::faulty(&Redguard::memory(), faults.clone());
    let results = rg
        .scope(async {
            let mut results = Vec::new();
            for payment in ["pay-k1", "pay-k2", "pay-k3", "pay-k4", "pay-k2"] {
                results.push(charge(&history, payment).await.is_ok());
            }
            results
        })
        .await;
    // The 3rd begin is pay-k3's; both of pay-k2's are refused by the pattern.
    assert_eq!(results, [true, false, false, true, false]);
    let injected = faults.injected();
    let (k2, others): (Vec<_>, Vec<_>) = injected.iter().partition(|i| i.key.contains("pay-k2"));
    assert!(k2.len() >= 2, "{injected:?}");
    assert_eq!(others.len(), 1, "{injected:?}");
    assert!(others[0].point == Point::IdemBegin && others[0].key.contains("pay-k3"));
}

/// The faulty store works on a real Redis handle too (and writes no key without a TTL).
#[tokio::test]
async fn faults_strike_on_redis() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let history = History::new();
    let faults = Faults::new().inject(At::point(Point::IdemFinish).nth(1), Fault::LoseWrite);
    let faulty = redguard::testing::faulty(&rg, faults.clone());
    faulty
        .scope(async {
            charge(&history, "pay-redis").await.expect("charge");
            charge(&history, "pay-redis").await.expect("charge again");
        })
        .await;
    assert_eq!(faults.injected().len(), 1);
    assert!(faults.injected()[0].key.contains("pay-redis"));
    assert!(
        history.check_never_twice().is_err(),
        "the lost record ran the body again"
    );
    server.assert_every_key_has_ttl();
}

// ---- the explorer and the pass-through handle ---------------------------------------------

/// A redelivered payment charged by a body with no backstop of its own: a lost record between
/// the two deliveries charges twice.
async fn deliver_twice(trial: redguard::testing::Trial) {
    let history = &trial.history;
    trial
        .rg
        .scope(async {
            for _ in 0..2 {
                let _ = charge(history, "pay-x").await;
                trial.advance(Duration::from_millis(20)).await;
            }
        })
        .await;
}

/// A redelivered payment charged by a body without a backstop: the explorer finds a
/// schedule that charges twice (the record lost or expired before the redelivery), and the
/// seed it prints fails again alone; the backstopped body survives the same exploration.
#[tokio::test]
async fn explore_finds_a_missing_backstop_and_replays_its_seed() {
    let explore = || Explore::new().runs(200).probability(0.3);
    let broken = deliver_twice;
    let failure = explore()
        .try_run(broken)
        .await
        .expect_err("a lost record makes it charge twice");
    let shown = failure.to_string();
    assert!(shown.contains(&format!("seed {}", failure.seed)), "{shown}");
    assert!(shown.contains("never_twice"), "{shown}");
    assert!(!failure.schedule.is_empty(), "{shown}");

    let again = explore()
        .seed(failure.seed)
        .runs(1)
        .try_run(broken)
        .await
        .expect_err("the same seed fails again");
    assert_eq!(again.schedule, failure.schedule);

    let explored = explore()
        .run(async |trial| {
            let (history, ledger) = (&trial.history, Mutex::new(HashSet::new()));
            trial
                .rg
                .scope(async {
                    for _ in 0..2 {
                        let _ = charge_backstopped(history, &ledger, "pay-x").await;
                        trial.advance(Duration::from_millis(20)).await;
                    }
                })
                .await;
        })
        .await;
    assert_eq!(explored.runs, 200);
    assert!(explored.faults > 0);
}

#[tokio::test]
async fn passthrough_lets_every_call_through() {
    let history = History::new();
    let rg = redguard::testing::passthrough();
    rg.scope(async {
        for _ in 0..3 {
            charge(&history, "pay-p").await.expect("runs each time");
        }
        for _ in 0..20 {
            order(&history, 9).await.expect("never limited");
        }
        restock(&history, "p").await.expect("granted");
        restock(&history, "p").await.expect("granted");
    })
    .await;
    assert!(history.check_never_twice().is_err(), "every charge ran");
    assert!(history.check_at_most(5, Duration::from_secs(1)).is_err());
    history.assert_fences_increase();
}

/// The explorer on a real Redis: each run's keys are its own (a fault-free exploration whose
/// body expects a first execution every run fails if runs share keys: the second would
/// replay), and the missing backstop is found there too, with a seed that fails again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explore_runs_on_redis_with_each_run_apart() {
    let server = RedisServer::start();
    let redis = redguard_tests::connect(&server).await;

    let explored = Explore::new()
        .on(&redis)
        .runs(5)
        .probability(0.0)
        .run(async |trial| {
            let history = &trial.history;
            trial.rg.scope(charge(history, "pay-r")).await.unwrap();
            assert_eq!(history.calls().len(), 1, "a run found another's record");
        })
        .await;
    assert_eq!(explored.runs, 5);

    let explore = || Explore::new().on(&redis).runs(60).probability(0.3);
    let broken = deliver_twice;
    let failure = explore()
        .try_run(broken)
        .await
        .expect_err("a lost record makes it charge twice");
    assert!(failure.to_string().contains("never_twice"), "{failure}");
    let again = explore()
        .seed(failure.seed)
        .runs(1)
        .try_run(broken)
        .await
        .expect_err("the same seed fails again");
    assert_eq!(again.schedule.len(), failure.schedule.len());
    server.assert_every_key_has_ttl();
}
