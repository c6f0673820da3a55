//! Each admin repair racing a live guard, on memory and on Redis: the repair does what it
//! says to the state it read, and nothing to a holder, record or window that came after.
//! `REDGUARD_RACE_ROUNDS=N` runs N rounds of each (default: a short CI run).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redguard::admin::Admin;
use redguard::{Error, GuardKind, Redguard};

const SCOPE: &str = "ops::races";

fn rounds(short: usize) -> usize {
    std::env::var("REDGUARD_RACE_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(short)
}

/// Whether a worker that made `made` of its `rounds` goes on: until it made them and the
/// race ran (the operator's repair met live state at least once), for at most 30 s more. On
/// a loaded machine the operator can get no turn in the rounds alone.
fn go_on(made: usize, rounds: usize, raced: bool, since: std::time::Instant) -> bool {
    made < rounds || (!raced && since.elapsed() < Duration::from_secs(30))
}

macro_rules! races {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(redguard::Redguard::memory()).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let server = redguard_tests::RedisServer::start();
                    super::$case(redguard_tests::connect(&server).await).await;
                    server.assert_every_key_has_ttl();
                }
            )*
        }
    };
}

races!(
    unlock_never_frees_a_later_holder,
    forget_deletes_only_the_record_it_read,
    refunds_racing_checks_give_back_only_what_was_charged,
    resets_racing_checks_leave_only_later_calls,
);

/// Holders take the lock in turn, as fast as they can, while an operator runs `unlock`
/// without `--owner` over and over. Every holder that finds its lock freed by force must be
/// one the operator's unlock had read (its `before`): the unlock that freed a holder is the
/// one whose new fence is the first above the holder's token.
async fn unlock_never_frees_a_later_holder(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    let key = admin.key(GuardKind::Lock, SCOPE, "job:nightly").unwrap();
    let acquisitions = rounds(300);
    let freed = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut holders = Vec::new();
    let since = std::time::Instant::now();
    for _ in 0..3 {
        let (rg, freed) = (rg.clone(), Arc::clone(&freed));
        holders.push(tokio::spawn(async move {
            let mut made = 0;
            while go_on(
                made,
                acquisitions / 3,
                !freed.lock().unwrap().is_empty(),
                since,
            ) {
                made += 1;
                let guard = rg
                    .lock("job:nightly")
                    .scope(SCOPE)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
                    .expect("acquire");
                let fence = guard.fence();
                if fastrand::bool() {
                    tokio::task::yield_now().await;
                }
                match guard.release().await {
                    Ok(()) => {}
                    Err(Error::LockLost { .. }) => freed.lock().unwrap().push(fence),
                    Err(err) => panic!("release: {err}"),
                }
            }
        }));
    }
    let operator = {
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut unlocks = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                // The memory store never yields by itself: let the holders run.
                tokio::task::yield_now().await;
                let unlock = admin.unlock(&key, None).await.expect("unlock");
                if unlock.removed > 0 {
                    let seen: HashSet<u64> = unlock.before.iter().filter_map(|s| s.fence).collect();
                    unlocks.push((unlock.fence.expect("a new fence"), seen));
                }
            }
            unlocks
        })
    };
    for holder in holders {
        holder.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut unlocks = operator.await.unwrap();
    unlocks.sort_by_key(|(fence, _)| *fence);
    let freed = freed.lock().unwrap().clone();
    assert!(
        !freed.is_empty(),
        "no unlock landed on a holder: the race did not run"
    );
    let mut violations = Vec::new();
    for fence in &freed {
        let by = unlocks.iter().find(|(after, _)| after > fence);
        match by {
            Some((_, seen)) if seen.contains(fence) => {}
            _ => violations.push(*fence),
        }
    }
    assert!(
        violations.is_empty(),
        "{} of {} forced releases freed a holder the operator had not read: {violations:?}",
        violations.len(),
        freed.len()
    );
}

/// Callers charge a limit while an operator refunds one unit at a time: every unit given back
/// was charged (never more back than admitted), and what the store holds at the end is
/// exactly the admitted calls less the units given back.
async fn refunds_racing_checks_give_back_only_what_was_charged(rg: Redguard) {
    const BURST: u64 = 10_000;
    let admin = Admin::new(rg.clone());
    let key = admin.key(GuardKind::RateLimit, SCOPE, "sms:u-1").unwrap();
    let limiter = |rg: &Redguard| {
        redguard::limiter("sms:u-1")
            .scope(SCOPE)
            .rate("1/h")
            .burst(BURST)
            .on(rg)
    };
    let checks = rounds(300);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let landed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let since = std::time::Instant::now();
    let mut callers = Vec::new();
    for _ in 0..3 {
        let (rg, landed) = (rg.clone(), Arc::clone(&landed));
        callers.push(tokio::spawn(async move {
            let mut admitted = 0u64;
            let mut made = 0;
            while go_on(
                made,
                checks / 3,
                landed.load(std::sync::atomic::Ordering::SeqCst),
                since,
            ) {
                made += 1;
                if limiter(&rg).decide().await.expect("decide").allowed {
                    admitted += 1;
                }
                tokio::task::yield_now().await;
            }
            admitted
        }));
    }
    let operator = {
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut back = 0u64;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::task::yield_now().await;
                back += admin.refund(&key, 1).await.expect("refund");
                if back > 0 {
                    landed.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
            back
        })
    };
    let mut admitted = 0;
    for caller in callers {
        admitted += caller.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let back = operator.await.unwrap();
    assert!(back > 0, "no refund landed: the race did not run");
    assert!(
        back <= admitted,
        "{back} units given back for {admitted} charged"
    );
    let left = limiter(&rg).peek().await.unwrap().remaining;
    let used = BURST - 1 - left;
    assert_eq!(
        used,
        admitted - back,
        "{admitted} admitted, {back} given back, the store holds {used}"
    );
}

/// Executions of one key begin and succeed in turn while an operator runs `forget` over and
/// over. A record an execution loses (its SUCCESS gone right after it was recorded, or its
/// PROCESSING gone before it finished) must have been reported by a forget in that very
/// state: a forget that read a PROCESSING record and then deleted the SUCCESS written
/// meanwhile would let a retry run a finished operation again.
async fn forget_deletes_only_the_record_it_read(rg: Redguard) {
    use redguard::__private::store::{Begin, Finish, IdemBegin, IdemFinish, IdemFinished};
    let admin = Admin::new(rg.clone());
    let key = admin.key(GuardKind::Idempotency, SCOPE, "order:9").unwrap();
    let body = redguard::KeyBuilder::new()
        .text("order:9")
        .finish()
        .unwrap();
    let full = rg.key(GuardKind::Idempotency, SCOPE, &body).unwrap();
    let executions = rounds(300);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let found = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let since = std::time::Instant::now();
    let executor = {
        let (rg, found) = (rg.clone(), Arc::clone(&found));
        tokio::spawn(async move {
            let ttl = Duration::from_secs(60);
            let mut lost = Vec::new();
            // The last SUCCESS recorded: a begin that then starts afresh finds it deleted.
            let mut succeeded: Option<String> = None;
            let mut i = 0;
            while go_on(
                i,
                executions,
                found.load(std::sync::atomic::Ordering::SeqCst),
                since,
            ) {
                i += 1;
                let owner = format!("exec-{i}");
                let begin = Begin {
                    key: &full,
                    owner: &owner,
                    fingerprint: "",
                    ttl,
                    replicas: None,
                };
                match redguard::__private::store::of(&rg)
                    .idem_begin(begin)
                    .await
                    .expect("begin")
                {
                    IdemBegin::Started => {
                        if let Some(owner) = succeeded.take() {
                            lost.push(("success".to_owned(), owner));
                        }
                    }
                    _ => {
                        // The SUCCESS not yet forgotten: let the operator run.
                        tokio::task::yield_now().await;
                        continue;
                    }
                }
                tokio::task::yield_now().await;
                let finish = Finish {
                    key: &full,
                    owner: &owner,
                    outcome: IdemFinish::Success(b"1"),
                    ttl,
                    replicas: None,
                };
                match redguard::__private::store::of(&rg)
                    .idem_finish(finish)
                    .await
                    .expect("finish")
                {
                    IdemFinished::Recorded => succeeded = Some(owner),
                    _ => {
                        lost.push(("processing".to_owned(), owner));
                        continue;
                    }
                }
                tokio::task::yield_now().await;
            }
            lost
        })
    };
    let operator = {
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut seen = HashSet::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::task::yield_now().await;
                if let Some(before) = admin.forget(&key).await.expect("forget") {
                    seen.insert((before.status, before.owner));
                    found.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
            seen
        })
    };
    let lost = executor.await.unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = operator.await.unwrap();
    assert!(
        !seen.is_empty(),
        "no forget found a record: the race did not run"
    );
    let wrong: Vec<_> = lost.iter().filter(|l| !seen.contains(*l)).collect();
    assert!(
        wrong.is_empty(),
        "{} of {} executions lost a record no forget had read: {wrong:?}",
        wrong.len(),
        lost.len()
    );
}

/// Callers charge a limit while an operator resets it over and over. At the end the store
/// holds the calls charged after the last reset: at least those that started after it
/// returned, at most those that ended after it started.
async fn resets_racing_checks_leave_only_later_calls(rg: Redguard) {
    use std::time::Instant;
    const BURST: u64 = 10_000;
    let admin = Admin::new(rg.clone());
    let key = admin
        .key(GuardKind::RateLimit, SCOPE, "export:u-2")
        .unwrap();
    let limiter = |rg: &Redguard| {
        redguard::limiter("export:u-2")
            .scope(SCOPE)
            .rate("1/h")
            .burst(BURST)
            .on(rg)
    };
    let checks = rounds(300);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut callers = Vec::new();
    for _ in 0..3 {
        let (rg, done) = (rg.clone(), Arc::clone(&done));
        callers.push(tokio::spawn(async move {
            let mut admitted = Vec::new();
            // Charging until the resets stop, then some more: the last reset lands among
            // the calls.
            let mut after = 0;
            while after < 10 {
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    after += 1;
                }
                let start = Instant::now();
                let allowed = limiter(&rg).decide().await.expect("decide").allowed;
                assert!(allowed, "a limit of {BURST} refused");
                admitted.push((start, Instant::now()));
                tokio::task::yield_now().await;
            }
            admitted
        }));
    }
    let operator = {
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut last = None;
            for _ in 0..checks / 10 {
                tokio::task::yield_now().await;
                let start = Instant::now();
                admin.reset(&key).await.expect("reset");
                last = Some((start, Instant::now()));
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            last
        })
    };
    let mut admitted = Vec::new();
    for caller in callers {
        admitted.extend(caller.await.unwrap());
    }
    let (reset_start, reset_end) = operator
        .await
        .unwrap()
        .expect("no reset ran: the race did not run");
    let used = BURST - 1 - limiter(&rg).peek().await.unwrap().remaining;
    let surely = admitted
        .iter()
        .filter(|(start, _)| *start > reset_end)
        .count() as u64;
    let maybe = admitted
        .iter()
        .filter(|(_, end)| *end > reset_start)
        .count() as u64;
    assert!(
        (surely..=maybe).contains(&used),
        "the store holds {used} calls; between {surely} and {maybe} came after the last reset"
    );
}
