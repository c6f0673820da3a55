//! Every cancellation point of every lock operation (issue 13, part 2): acquire (free and
//! contended) and release of every kind, `run` (acquisition, renewals, release), nested
//! entries and releases, `lock_all`; on the memory store and on Redis, dropped after every
//! poll and, on Redis, while Redis is paused (see `redguard_tests::cancel`).
//!
//! After each drop, and once the cleanups it spawned have run: no lock is held by an owner
//! that is gone (another owner can take it); inside nested levels, the levels still running
//! hold the lock and, on Redis, the lock hash's `depth` is the number of live levels; no
//! renewal task of the handle is left running; no key lacks a TTL. One test runs the stores
//! one after the other.

use std::time::Duration;

use redguard::{Error, LockGuard};
use redguard_tests::cancel::{self, Attempt, Harness, LEASE, LockKind, Stall, Verdict};

/// Long enough for the contended waits: the holders release after [`HOLD`].
const WAIT: Duration = Duration::from_secs(2);
/// How long a contending holder keeps the lock before releasing it.
const HOLD: Duration = Duration::from_millis(20);
/// `run`'s lease: renewed every lease/3, so [`RUN_BODY`] outlasts one renewal.
const RUN_LEASE: Duration = Duration::from_secs(1);
const RUN_BODY: Duration = Duration::from_millis(350);
/// Besides the stalls from the start: Redis paused just before the first renewal (at about
/// 333 ms), dropping while the renewal is in flight, after it timed out and while the
/// release waits behind it.
const RUN_STALLS: [Stall; 5] = [
    Stall::at(0, 60, 5),
    Stall::at(0, 300, 200),
    Stall::at(320, 60, 345),
    Stall::at(320, 300, 340),
    Stall::at(320, 300, 520),
];

#[tokio::test]
async fn every_cancellation_point_of_every_lock_operation() {
    let mut memory = Harness::memory();
    lock_operations(&mut memory).await;
    let mut redis = Harness::redis().await;
    lock_operations(&mut redis).await;
    cancel::finish([memory, redis]);
}

async fn lock_operations(h: &mut Harness) {
    for kind in LockKind::ALL {
        let name = kind.name();
        h.sweep(&format!("acquire {name}"), |at| acquire(at, kind))
            .await;
        h.sweep(&format!("acquire {name}, contended"), |at| {
            contended(at, kind)
        })
        .await;
        h.sweep(&format!("release {name}"), |at| release(at, kind))
            .await;
        h.sweep_stalls(&format!("run {name}"), &RUN_STALLS, |at| run(at, kind))
            .await;
    }
    h.sweep_stalls(
        "acquire write, waiting for readers",
        &[Stall::at(0, 60, 5)],
        writer_waiting_for_readers,
    )
    .await;
    for kind in LockKind::REENTRANT {
        let name = kind.name();
        h.sweep(&format!("nested acquire {name} (level 3)"), |at| {
            nested(at, kind, Nested::Acquire)
        })
        .await;
        h.sweep(&format!("nested release {name} (level 3)"), |at| {
            nested(at, kind, Nested::Release)
        })
        .await;
    }
    h.sweep("lock_all of 3", |at| lock_all(at, false)).await;
    h.sweep("lock_all of 3, contended", |at| lock_all(at, true))
        .await;
}

/// Takes a free lock.
async fn acquire(at: Attempt, kind: LockKind) -> Verdict {
    let key = at.key("acquire");
    let outcome = at.drive(kind.builder(&at.rg, &key).acquire()).await;
    let mut v = Verdict::new(outcome.is_some());
    finish_acquisition(&mut v, &at, kind, &key, outcome).await;
    at.settle().await;
    expect_free(&mut v, &at, kind, &key, "after the acquisition").await;
    v
}

/// Waits for a lock other owners hold for [`HOLD`].
async fn contended(at: Attempt, kind: LockKind) -> Verdict {
    let key = at.key("contended");
    let holders = kind.hold_against(&at.rg, &key).await;
    let releasing = release_later(holders);
    let outcome = at
        .drive(kind.builder(&at.rg, &key).wait(WAIT).acquire())
        .await;
    let mut v = Verdict::new(outcome.is_some());
    finish_acquisition(&mut v, &at, kind, &key, outcome).await;
    releasing.await.expect("holders' release");
    at.settle().await;
    expect_free(&mut v, &at, kind, &key, "after the holders left").await;
    v
}

/// A writer waiting for readers announces itself, keeping new readers (and writers) out for
/// up to `WRITER_INTENT` after its last attempt; a writer that gives up or is dropped leaves
/// the announcement to expire (documented). So the key must be free within that, not at once.
async fn writer_waiting_for_readers(at: Attempt) -> Verdict {
    let key = at.key("writer");
    let reader = LockKind::Read.builder(&at.rg, &key).acquire().await;
    let releasing = release_later(vec![reader.expect("take a read lock")]);
    let outcome = at
        .drive(LockKind::Write.builder(&at.rg, &key).wait(WAIT).acquire())
        .await;
    let mut v = Verdict::new(outcome.is_some());
    finish_acquisition(&mut v, &at, LockKind::Write, &key, outcome).await;
    releasing.await.expect("reader's release");
    at.settle().await;
    // Another writer, waiting out the announcement.
    let probe = at.rg.clone();
    let probe_key = key.clone();
    let taken = tokio::spawn(async move {
        let guard = LockKind::Write
            .builder(&probe, &probe_key)
            .wait(redguard::__private::store::WRITER_INTENT + Duration::from_millis(500))
            .acquire()
            .await?;
        guard.release().await
    })
    .await
    .expect("probe task");
    v.check(taken.is_ok(), || {
        format!(
            "still taken {:?} after the drop: {taken:?}",
            redguard::__private::store::WRITER_INTENT
        )
    });
    v
}

/// Releases a held lock.
async fn release(at: Attempt, kind: LockKind) -> Verdict {
    let key = at.key("release");
    let guard = kind.builder(&at.rg, &key).acquire().await;
    let guard = guard.expect("take the lock to release");
    let outcome = at.drive(guard.release()).await;
    let mut v = Verdict::new(outcome.is_some());
    if let Some(Err(err)) = &outcome {
        v.check(matches!(err, Error::Backend(_)), || {
            format!("release failed: {err:?}")
        });
    }
    at.settle().await;
    expect_free(&mut v, &at, kind, &key, "after the release").await;
    v
}

/// `run`: acquisition, a body outlasting a renewal, release.
async fn run(at: Attempt, kind: LockKind) -> Verdict {
    let key = at.key("run");
    let body = async {
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        tokio::time::sleep(RUN_BODY).await;
        tokio::task::yield_now().await;
        Ok::<_, Error>(())
    };
    let outcome = at
        .drive(kind.builder(&at.rg, &key).lease(RUN_LEASE).run(body))
        .await;
    let mut v = Verdict::new(outcome.is_some());
    if let Some(Err(err)) = &outcome {
        // Redis paused past the call timeout: the acquisition is refused (unknown, undone).
        v.check(matches!(err, Error::Backend(_)), || {
            format!("run failed: {err:?}")
        });
    }
    at.settle().await;
    expect_free(&mut v, &at, kind, &key, "after run").await;
    v
}

#[derive(Debug, Clone, Copy)]
enum Nested {
    Acquire,
    Release,
}

/// Inside two levels of `run`, enters a third level (`Acquire`), or leaves a third level
/// entered beforehand (`Release`). The two outer levels must keep the lock whatever happens
/// to the third, and release it when they end.
async fn nested(at: Attempt, kind: LockKind, op: Nested) -> Verdict {
    let key = at.key("nested");
    let rg = at.rg.clone();
    let mut found = None;
    let levels = kind.builder(&rg, &key).run(async {
        kind.builder(&rg, &key)
            .run(async {
                found = Some(third_level(&at, kind, &key, op).await);
                Ok::<_, Error>(())
            })
            .await
    });
    let levels = levels.await;
    let mut v = found.unwrap_or_else(|| {
        // Stop sweeping: the outer levels never ran the body.
        let mut v = Verdict::new(true);
        v.check(false, || "the outer levels did not run".to_owned());
        v
    });
    v.check(levels.is_ok(), || {
        format!("the outer levels ended with {levels:?}")
    });
    at.settle().await;
    expect_free(&mut v, &at, kind, &key, "after the outer levels").await;
    v
}

/// The operation on the third level, and the checks while levels 1 and 2 still run.
async fn third_level(at: &Attempt, kind: LockKind, key: &str, op: Nested) -> Verdict {
    let entered = |at: &Attempt| kind.builder(&at.rg, key).acquire();
    let v = match op {
        Nested::Acquire => {
            let outcome = at.drive(entered(at)).await;
            let mut v = Verdict::new(outcome.is_some());
            match outcome {
                Some(Ok(guard)) => {
                    expect_depth(&mut v, at, kind, key, 3, "with level 3 entered").await;
                    let left = guard.release().await;
                    v.check(left.is_ok(), || format!("leaving level 3: {left:?}"));
                }
                Some(Err(err)) => v.check(matches!(err, Error::Backend(_)), || {
                    format!("entering level 3 failed: {err:?}")
                }),
                None => {}
            }
            v
        }
        Nested::Release => {
            let guard = entered(at).await.expect("enter level 3");
            let outcome = at.drive(guard.release()).await;
            let mut v = Verdict::new(outcome.is_some());
            if let Some(Err(err)) = &outcome {
                v.check(matches!(err, Error::Backend(_)), || {
                    format!("leaving level 3 failed: {err:?}")
                });
            }
            v
        }
    };
    let mut v = v;
    at.settle().await;
    expect_depth(&mut v, at, kind, key, 2, "while levels 1 and 2 run").await;
    let taken = kind.free_for_others(&at.rg, key).await;
    v.check(matches!(taken, Ok(false)), || {
        format!("another owner could take the lock while levels 1 and 2 run ({taken:?})")
    });
    v
}

/// Takes three locks all-or-nothing; `contended`: the middle one is held for [`HOLD`].
async fn lock_all(at: Attempt, contended: bool) -> Verdict {
    let keys: Vec<String> = ["a", "b", "c"].iter().map(|k| at.key(k)).collect();
    let releasing = if contended {
        let holders = LockKind::Exclusive.hold_against(&at.rg, &keys[1]).await;
        Some(release_later(holders))
    } else {
        None
    };
    let outcome = at
        .drive(at.rg.lock_all(&keys).wait(WAIT).lease(LEASE).acquire())
        .await;
    let mut v = Verdict::new(outcome.is_some());
    match outcome {
        Some(Ok(guard)) => {
            for key in &keys {
                let taken = LockKind::Exclusive.free_for_others(&at.rg, key).await;
                v.check(matches!(taken, Ok(false)), || {
                    format!("`{key}` taken by lock_all, yet free for others ({taken:?})")
                });
            }
            let released = guard.release().await;
            v.check(released.is_ok(), || format!("release: {released:?}"));
        }
        Some(Err(err)) => v.check(matches!(err, Error::Backend(_)), || {
            format!("lock_all failed: {err:?}")
        }),
        None => {}
    }
    if let Some(releasing) = releasing {
        releasing.await.expect("holder's release");
    }
    at.settle().await;
    for key in &keys {
        expect_free(&mut v, &at, LockKind::Exclusive, key, "after lock_all").await;
    }
    v
}

/// For an acquisition that completed: a guard must hold the lock, and is released; an error
/// may only be the store's (an unknown outcome, which the runtime undoes).
async fn finish_acquisition(
    v: &mut Verdict,
    at: &Attempt,
    kind: LockKind,
    key: &str,
    outcome: Option<Result<LockGuard, Error>>,
) {
    match outcome {
        Some(Ok(guard)) => {
            let taken = kind.free_for_others(&at.rg, key).await;
            v.check(matches!(taken, Ok(false)), || {
                format!("acquired, yet free for others ({taken:?})")
            });
            let released = guard.release().await;
            v.check(released.is_ok(), || format!("release: {released:?}"));
        }
        Some(Err(err)) => v.check(matches!(err, Error::Backend(_)), || {
            format!("acquisition failed: {err:?}")
        }),
        None => {}
    }
}

/// Another owner can take `key` (asked again if the store itself failed to answer).
async fn expect_free(v: &mut Verdict, at: &Attempt, kind: LockKind, key: &str, when: &str) {
    let mut free = kind.free_for_others(&at.rg, key).await;
    for _ in 0..3 {
        if !matches!(free, Err(Error::Backend(_))) {
            break;
        }
        at.settle().await;
        free = kind.free_for_others(&at.rg, key).await;
    }
    v.check(matches!(free, Ok(true)), || {
        format!(
            "{} `{key}` not free for another owner {when}: {free:?}",
            kind.name()
        )
    });
}

/// On Redis, the lock hash's `depth` is `levels`.
async fn expect_depth(
    v: &mut Verdict,
    at: &Attempt,
    kind: LockKind,
    key: &str,
    levels: u32,
    when: &str,
) {
    let Some(view) = at.view() else {
        return;
    };
    let hash = kind.hash(key);
    let depth = view.field(&hash, "depth").await;
    v.check(depth == Some(levels.to_string()), || {
        format!("depth {depth:?} {when}, expected {levels} (`{hash}`)")
    });
}

/// Releases `guards` after [`HOLD`], in a task of its own.
fn release_later(guards: Vec<LockGuard>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep(HOLD).await;
        for guard in guards {
            // A release that times out in a stall still runs when Redis resumes.
            let _ = guard.release().await;
        }
    })
}
