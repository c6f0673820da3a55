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

mod memory {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unlock_never_frees_a_later_holder() {
        super::unlock_never_frees_a_later_holder(redguard::Redguard::memory()).await;
    }
}

mod redis {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unlock_never_frees_a_later_holder() {
        let server = redguard_tests::RedisServer::start();
        super::unlock_never_frees_a_later_holder(redguard_tests::connect(&server).await).await;
        server.assert_every_key_has_ttl();
    }
}

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
    for _ in 0..3 {
        let (rg, freed) = (rg.clone(), Arc::clone(&freed));
        holders.push(tokio::spawn(async move {
            for _ in 0..acquisitions / 3 {
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
