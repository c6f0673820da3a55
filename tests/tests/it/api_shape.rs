//! The three guards share one shape: `x(key)` on the current handle or `rg.x(key)`, `.on(&rg)`
//! binding a handle over the current one, `.scope(..)` with the entry point's name as the
//! default, and `run(body)`. Each claim is checked on every guard, against the store.

use std::sync::atomic::{AtomicU32, Ordering};

use redguard::{Error, Redguard};

/// `.on(&b)` runs on `b` even inside a scope of `a`: the guard's state is in `b` only.
#[tokio::test]
async fn on_binds_the_handle_over_the_current_one() {
    let (a, b) = (Redguard::memory(), Redguard::memory());
    let held = a
        .scope(async { redguard::lock("k").on(&b).acquire().await })
        .await
        .unwrap();
    assert!(
        b.lock("k").try_acquire().await.unwrap().is_none(),
        "not held on b"
    );
    assert!(
        a.lock("k").try_acquire().await.unwrap().is_some(),
        "held on a"
    );
    held.release().await.unwrap();

    a.scope(async {
        redguard::limiter("k")
            .on(&b)
            .rate("1/min")
            .check()
            .await
            .unwrap();
    })
    .await;
    assert!(
        b.limiter("k").rate("1/min").check().await.is_err(),
        "not charged on b"
    );
    assert!(
        a.limiter("k").rate("1/min").check().await.is_ok(),
        "charged on a"
    );

    let runs = AtomicU32::new(0);
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(7)
    };
    a.scope(redguard::idempotency("k").on(&b).run(body()))
        .await
        .unwrap();
    b.idempotency("k").run(body()).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "b replays the record");
    a.idempotency("k").run(body()).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a has no record");
}

/// With no `.scope(..)`, each guard's scope is its entry point's name, and the free fn and
/// the method address the same key.
#[tokio::test]
async fn the_default_scope_is_the_entry_points_name() {
    let rg = Redguard::memory();
    let held = rg.scope(redguard::lock("k").acquire()).await.unwrap();
    let same = rg.lock("k").scope(redguard::lock::DEFAULT_LOCK_SCOPE);
    assert!(same.try_acquire().await.unwrap().is_none());
    let other = rg.lock("k").scope("elsewhere");
    assert!(other.try_acquire().await.unwrap().is_some());
    assert_eq!(redguard::lock::DEFAULT_LOCK_SCOPE, "lock");
    held.release().await.unwrap();

    rg.scope(redguard::limiter("k").rate("1/min").check())
        .await
        .unwrap();
    let same = rg.limiter("k").scope(redguard::rate::DEFAULT_LIMITER_SCOPE);
    assert!(same.rate("1/min").check().await.is_err());
    assert_eq!(redguard::rate::DEFAULT_LIMITER_SCOPE, "limiter");

    let first = rg.scope(redguard::idempotency("k").run(async { Ok::<_, Error>(1) }));
    assert_eq!(first.await.unwrap(), 1);
    let same = rg
        .idempotency("k")
        .scope(redguard::idempotency::DEFAULT_IDEMPOTENCY_SCOPE)
        .run(async { Ok::<_, Error>(2) });
    assert_eq!(
        same.await.unwrap(),
        1,
        "replayed from the default scope's record"
    );
    assert_eq!(
        redguard::idempotency::DEFAULT_IDEMPOTENCY_SCOPE,
        "idempotency"
    );
}

/// `run` runs the body only when the guard lets it: a refusal is the guard's error, and the
/// body has not run.
#[tokio::test]
async fn run_skips_the_body_on_a_refusal() {
    let rg = Redguard::memory();
    let runs = AtomicU32::new(0);
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(())
    };
    let held = rg.lock("busy").acquire().await.unwrap();
    let refused = rg.lock("busy").run(body()).await;
    assert!(
        matches!(refused, Err(Error::LockTimeout { .. })),
        "{refused:?}"
    );
    held.release().await.unwrap();

    let limiter = rg.limiter("once").rate("1/min");
    limiter.run(body()).await.unwrap();
    let refused = limiter.run(body()).await;
    assert!(matches!(refused, Err(Error::RateLimited(_))), "{refused:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A limiter built once serves many keys: `key` changes only the key, each with its own
/// budget, and a bad key is reported on use, not swallowed into a shared key.
#[tokio::test]
async fn a_limiter_is_reused_per_key() {
    let rg = Redguard::memory();
    let per_user = rg.limiter("unused").scope("login").rate("2/min");
    for user in 0..50u64 {
        let mine = per_user.key(redguard::key("user:{id}").part("id", &user));
        mine.check().await.unwrap();
        mine.check().await.unwrap();
        assert!(mine.check().await.is_err(), "user {user} has a budget of 2");
    }
    let err = per_user
        .key(redguard::key("user:{id}").part("id", "a b"))
        .check()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidKey { .. }), "{err:?}");
    let err = per_user
        .key(redguard::key("user:{id}"))
        .check()
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Config(_)),
        "an unfilled placeholder: {err:?}"
    );
}
