//! Quota overrides changed at run time (issue 28): `redguard::admin`'s `quota_*` on every
//! store, read by the deciding script itself, so one handle's override decides another
//! handle's next call; bad input refused with nothing written; a value that is not an
//! override ignored, never an unlimited key.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redguard::admin::{Admin, LimitSource, Quota, QuotaTtl, Usage};
use redguard::rate::Rate;
use redguard::{Error, Redguard, key::GuardKind, rate::Algorithm, rate::Limit, rate::Limiter};

const SCOPE: &str = "api::tenants";
const HOUR: QuotaTtl = QuotaTtl::For(Duration::from_secs(3600));

redguard_tests::conformance!(
    an_override_decides_the_next_call_and_clearing_restores,
    every_algorithm_takes_the_override,
    an_override_expires_with_its_ttl,
    a_rate_lowered_while_calls_are_in_flight_admits_nothing_beyond_it,
    bad_overrides_are_refused_and_nothing_is_written,
    listing_finds_the_overrides_of_a_scope,
    usage_agrees_with_the_next_decision,
);

// Prefix overrides: memory, a single node (also with declared keys) and Sentinel's master
// (on a Cluster, refused).
mod prefixes {
    use super::*;

    macro_rules! on_prefix_stores {
        ($($case:ident),* $(,)?) => {
            mod memory {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() {
                        super::$case(::redguard::Redguard::memory(), ::redguard::Redguard::memory()).await;
                    }
                )*
            }
            mod redis {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() {
                        let server = ::redguard_tests::RedisServer::start();
                        let one = ::redguard_tests::connect(&server).await;
                        let other = ::redguard_tests::connect(&server).await;
                        super::$case(one, other).await;
                        server.assert_every_key_has_ttl();
                    }
                )*
            }
            mod declared {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() {
                        let server = ::redguard_tests::RedisServer::start();
                        let one = ::redguard_tests::declared::connect(&server).await;
                        let other = ::redguard_tests::declared::connect(&server).await;
                        super::$case(one, other).await;
                        ::redguard_tests::declared::assert_none_undeclared(&server);
                    }
                )*
            }
            mod sentinel {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() {
                        let sentinel = ::redguard_tests::RedisSentinel::start_small();
                        let one = sentinel.connect().await;
                        let other = sentinel.connect().await;
                        super::$case(one, other).await;
                        sentinel.assert_every_key_has_ttl();
                    }
                )*
            }
        };
    }

    on_prefix_stores!(
        a_prefix_override_decides_every_key_it_starts,
        a_prefix_changed_while_two_handles_are_in_flight_admits_nothing_beyond_it,
        usage_names_the_rule_that_won,
    );

    /// `usage` on one handle names the rule another handle's next call is decided by: no
    /// matching prefix, the code; then the longest of three matching prefixes; then the key's
    /// own override; and its figures are that call's.
    async fn usage_names_the_rule_that_won(one: Redguard, other: Redguard) {
        let (one, other) = pair(one, other);
        let admin = Admin::new(one.clone());
        tenant(&other, "t1-acme").check().await.unwrap();
        let code = code_limit();
        let slow = |rate| Quota::new(rate, None).unwrap();
        admin
            .quota_set(SCOPE, "tenant:t2*", &slow("2/h"), HOUR)
            .await
            .unwrap();
        let usage = admin.usage(SCOPE, "tenant:t1-acme", &code).await.unwrap();
        assert_eq!(usage.source, LimitSource::Code, "{usage:?}");
        admin
            .quota_set(SCOPE, "tenant:t1*", &slow("7/h"), HOUR)
            .await
            .unwrap();
        admin
            .quota_set(SCOPE, "tenant:t1-*", &slow("9/h"), HOUR)
            .await
            .unwrap();
        admin
            .quota_set(SCOPE, "tenant:*", &slow("3/h"), HOUR)
            .await
            .unwrap();
        // Three match: the longest wins.
        let usage = admin.usage(SCOPE, "tenant:t1-acme", &code).await.unwrap();
        match &usage.source {
            LimitSource::Prefix { prefix } => assert!(prefix.ends_with("tenant:t1-*"), "{prefix}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            (usage.rate.as_str(), usage.burst, usage.used),
            ("9/3600s", 9, Some(1))
        );
        agrees(&usage, &other, "t1-acme").await;

        admin
            .quota_set(SCOPE, "tenant:t1-acme", &slow("5/h"), HOUR)
            .await
            .unwrap();
        let usage = admin.usage(SCOPE, "tenant:t1-acme", &code).await.unwrap();
        assert_eq!(
            (&usage.source, usage.rate.as_str(), usage.burst),
            (&LimitSource::Key, "5/3600s", 5)
        );
        agrees(&usage, &other, "t1-acme").await;

        // A prefix deny entry refuses the key whatever its override says; usage names it.
        admin
            .deny_add(SCOPE, "tenant:t1-*", Some("fraud ring"), HOUR)
            .await
            .unwrap();
        let usage = admin.usage(SCOPE, "tenant:t1-acme", &code).await.unwrap();
        let entry = usage.denied.as_ref().expect("denied");
        assert_eq!(entry.entry, "tenant:t1-*", "{usage:?}");
        agrees(&usage, &other, "t1-acme").await;
        let usage = admin.usage(SCOPE, "tenant:t2-acme", &code).await.unwrap();
        assert_eq!(usage.denied, None, "{usage:?}");
    }

    async fn limit(rg: &Redguard, id: &str) -> u64 {
        tenant(rg, id).peek().await.unwrap().limit
    }

    /// On memory both handles must share the store: the second is the first.
    fn pair(one: Redguard, other: Redguard) -> (Redguard, Redguard) {
        if one.kind() == redguard::handle::StoreKind::Memory {
            let _ = other;
            (one.clone(), one)
        } else {
            (one, other)
        }
    }

    /// Precedence exact key > longest prefix > code, on another handle's next call; a
    /// prefix's TTL and clearing; listing shows prefixes with a `*`.
    async fn a_prefix_override_decides_every_key_it_starts(one: Redguard, other: Redguard) {
        let (one, other) = pair(one, other);
        let admin = Admin::new(one.clone());
        tenant(&other, "acme").check().await.unwrap();
        let five = Quota::new("5/s", None).unwrap();
        let seven = Quota::new("7/s", None).unwrap();
        let nine = Quota::new("9/s", None).unwrap();
        admin
            .quota_set(SCOPE, "tenant:*", &five, HOUR)
            .await
            .unwrap();
        assert_eq!(limit(&other, "acme").await, 5);
        assert_eq!(limit(&other, "globex").await, 5);
        admin
            .quota_set(SCOPE, "tenant:ac*", &seven, QuotaTtl::Permanent)
            .await
            .unwrap();
        assert_eq!(limit(&other, "acme").await, 7, "the longest prefix");
        assert_eq!(limit(&other, "globex").await, 5);
        admin
            .quota_set(SCOPE, "tenant:acme", &nine, HOUR)
            .await
            .unwrap();
        assert_eq!(limit(&other, "acme").await, 9, "the exact key first");
        assert_eq!(limit(&other, "acorn").await, 7);
        // Another scope is not touched.
        let elsewhere = redguard::limiter("tenant:acme")
            .scope("api::other")
            .rate("1/min")
            .on(&other);
        assert_eq!(elsewhere.peek().await.unwrap().limit, 1);

        let got = admin.quota_get(SCOPE, "tenant:ac*").await.unwrap().unwrap();
        assert_eq!(
            (got.rate.as_deref(), got.expires_in_ms),
            (Some("7/1s"), None)
        );
        let listed = admin.quota_list(SCOPE, 1000).await.unwrap();
        let keys: Vec<&str> = listed.overrides.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys.len(), 3, "{keys:?}");
        assert!(
            keys.iter().filter(|k| k.ends_with('*')).count() == 2,
            "{keys:?}"
        );

        assert!(admin.quota_clear(SCOPE, "tenant:ac*").await.unwrap());
        assert!(!admin.quota_clear(SCOPE, "tenant:ac*").await.unwrap());
        assert_eq!(limit(&other, "acorn").await, 5);
        assert!(admin.quota_clear(SCOPE, "tenant:acme").await.unwrap());
        assert_eq!(limit(&other, "acme").await, 5);
        // A prefix override expires with its TTL.
        admin
            .quota_set(
                SCOPE,
                "tenant:*",
                &five,
                QuotaTtl::For(Duration::from_secs(1)),
            )
            .await
            .unwrap();
        assert_eq!(limit(&other, "acme").await, 5);
        tokio::time::sleep(Duration::from_millis(2100)).await;
        assert_eq!(limit(&other, "acme").await, 1, "expired: the code's limit");
        assert!(admin.quota_get(SCOPE, "tenant:*").await.unwrap().is_none());
        // Set again once the last one expired (the memory store stops looking for prefixes
        // while none is set): it decides again.
        admin
            .quota_set(SCOPE, "tenant:*", &seven, HOUR)
            .await
            .unwrap();
        assert_eq!(limit(&other, "acme").await, 7, "set again after it expired");
        // Cleared, so the hash is gone or has a TTL (checked by the harness).
        admin.quota_clear(SCOPE, "tenant:*").await.unwrap();
    }

    /// 64 tasks on two handles while the operator lowers a prefix from 100/h to 10/h: the key
    /// admits exactly 10 in all (the state is kept in units), and each handle sees the change.
    async fn a_prefix_changed_while_two_handles_are_in_flight_admits_nothing_beyond_it(
        one: Redguard,
        other: Redguard,
    ) {
        let (one, other) = pair(one, other);
        let admin = Admin::new(one.clone());
        let limiter = |rg: &Redguard| {
            redguard::limiter("tenant:busy")
                .scope(SCOPE)
                .rate("1/h")
                .on(rg)
        };
        // Make the scope known, then start on a 100/h prefix override.
        tenant(&one, "anchor").check().await.unwrap();
        admin
            .quota_set(
                SCOPE,
                "tenant:b*",
                &Quota::new("100/h", None).unwrap(),
                HOUR,
            )
            .await
            .unwrap();
        let old_admitted = Arc::new(AtomicU64::new(0));
        let new_admitted = Arc::new(AtomicU64::new(0));
        let new_seen = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let handle = if i % 2 == 0 {
                    one.clone()
                } else {
                    other.clone()
                };
                let limiter = limiter(&handle);
                let (old_admitted, new_admitted, new_seen, stop) = (
                    old_admitted.clone(),
                    new_admitted.clone(),
                    new_seen.clone(),
                    stop.clone(),
                );
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        tokio::task::yield_now().await;
                        let d = limiter.decide().await.unwrap();
                        match (d.limit, d.allowed) {
                            (100, true) => {
                                old_admitted.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            (100, false) => {}
                            (10, allowed) => {
                                new_seen[i % 2].fetch_add(1, Ordering::SeqCst);
                                new_admitted.fetch_add(u64::from(allowed), Ordering::SeqCst);
                            }
                            other => panic!("unexpected decision {other:?}"),
                        }
                    }
                })
            })
            .collect();
        while old_admitted.load(Ordering::SeqCst) < 4 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        admin
            .quota_set(SCOPE, "tenant:b*", &Quota::new("10/h", None).unwrap(), HOUR)
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while new_seen.iter().any(|n| n.load(Ordering::SeqCst) < 200)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.store(true, Ordering::SeqCst);
        for task in tasks {
            task.await.unwrap();
        }
        assert!(
            new_seen.iter().all(|n| n.load(Ordering::SeqCst) >= 200),
            "both handles see the new limit"
        );
        let (old, new) = (
            old_admitted.load(Ordering::SeqCst),
            new_admitted.load(Ordering::SeqCst),
        );
        assert!(old >= 4);
        assert_eq!(
            new,
            10u64.saturating_sub(old),
            "{old} at 100/h, then {new} at 10/h"
        );
        admin.quota_clear(SCOPE, "tenant:b*").await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_prefix_override_is_refused_on_a_cluster() {
        let cluster = redguard_tests::RedisCluster::start();
        let rg = cluster.connect().await;
        tenant(&rg, "acme").check().await.unwrap();
        let admin = Admin::new(rg.clone());
        let err = admin
            .quota_set(SCOPE, "tenant:*", &Quota::new("5/s", None).unwrap(), HOUR)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("Cluster"), "{err}");
        assert!(
            admin
                .quota_list(SCOPE, 1000)
                .await
                .unwrap()
                .overrides
                .is_empty()
        );
        assert_eq!(tenant(&rg, "acme").peek().await.unwrap().limit, 1);
    }

    /// A bounded number of prefixes: the one past the bound is refused, nothing written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn prefixes_are_bounded() {
        let rg = Redguard::memory();
        tenant(&rg, "acme").check().await.unwrap();
        let admin = Admin::new(rg.clone());
        let quota = Quota::new("5/s", None).unwrap();
        for i in 0..redguard::admin::MAX_PREFIX_OVERRIDES {
            admin
                .quota_set(SCOPE, &format!("t{i}:*"), &quota, HOUR)
                .await
                .unwrap();
        }
        let err = admin
            .quota_set(SCOPE, "tenant:*", &quota, HOUR)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err:?}");
        assert!(admin.quota_get(SCOPE, "tenant:*").await.unwrap().is_none());
        assert_eq!(tenant(&rg, "acme").peek().await.unwrap().limit, 1);
        // Replacing one that is there is not a new one.
        admin.quota_set(SCOPE, "t0:*", &quota, HOUR).await.unwrap();
    }
}

/// The code's limit of [`tenant`], as `Admin::usage` takes it.
fn code_limit() -> Limit {
    Limit::new(
        Algorithm::Gcra,
        Rate::per_minute(1),
        None,
        1,
        Default::default(),
    )
    .unwrap()
}

/// `usage`'s peek is the next call's decision: it is made on `rg`, right after.
async fn agrees(usage: &Usage, rg: &Redguard, id: &str) {
    if let Some(entry) = &usage.denied {
        match tenant(rg, id).decide().await {
            Err(redguard::Error::Denied { reason, .. }) => assert_eq!(reason, entry.reason),
            other => panic!("usage said denied by {entry:?}, the call got {other:?}"),
        }
        return;
    }
    let d = tenant(rg, id).decide().await.unwrap();
    assert_eq!(
        (d.allowed, d.limit, d.remaining),
        (usage.next.allowed, usage.burst, usage.next.remaining),
        "{usage:?}"
    );
    if !d.allowed {
        let retry = u64::try_from(d.retry_after.as_millis()).unwrap();
        assert!(
            retry.abs_diff(usage.next.retry_after_ms) < 5_000,
            "{d:?} {usage:?}"
        );
    }
}

/// `usage` with no override, then the key's own: the rule, the limit in force and the
/// figures of the next call, which is then made and compared.
async fn usage_agrees_with_the_next_decision(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    let code = code_limit();
    let usage = admin.usage(SCOPE, "tenant:acme", &code).await.unwrap();
    assert_eq!(
        (&usage.source, usage.rate.as_str(), usage.burst, usage.used),
        (&LimitSource::Code, "1/min", 1, None)
    );
    agrees(&usage, &rg, "acme").await;
    // Used up: the next call is refused, and usage says so before it is made.
    let usage = admin.usage(SCOPE, "tenant:acme", &code).await.unwrap();
    assert_eq!(usage.used, Some(1), "{usage:?}");
    assert!(!usage.next.allowed);
    agrees(&usage, &rg, "acme").await;

    admin
        .quota_set(
            SCOPE,
            "tenant:acme",
            &Quota::new("100/h", Some(5)).unwrap(),
            HOUR,
        )
        .await
        .unwrap();
    let usage = admin.usage(SCOPE, "tenant:acme", &code).await.unwrap();
    assert_eq!(
        (&usage.source, usage.rate.as_str(), usage.burst),
        (&LimitSource::Key, "100/3600s", 5)
    );
    assert!(usage.next.allowed, "{usage:?}");
    agrees(&usage, &rg, "acme").await;
    // A neighbour without an override: the code's limit.
    let usage = admin.usage(SCOPE, "tenant:globex", &code).await.unwrap();
    assert_eq!(usage.source, LimitSource::Code);
    assert_eq!(usage.denied, None);
    agrees(&usage, &rg, "globex").await;
    // Denied: usage names the entry, and the next call is refused by it.
    admin
        .deny_add(SCOPE, "tenant:globex", Some("abuse"), HOUR)
        .await
        .unwrap();
    let usage = admin.usage(SCOPE, "tenant:globex", &code).await.unwrap();
    let entry = usage.denied.as_ref().expect("denied");
    assert_eq!(
        (entry.entry.as_str(), entry.reason.as_deref()),
        ("tenant:globex", Some("abuse"))
    );
    agrees(&usage, &rg, "globex").await;
}

fn tenant(rg: &Redguard, id: &str) -> Limiter {
    redguard::limiter(redguard::key("tenant:{id}").part("id", id))
        .scope(SCOPE)
        .rate("1/min")
        .on(rg)
}

async fn an_override_decides_the_next_call_and_clearing_restores(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    tenant(&rg, "acme").check().await.unwrap();
    assert!(!tenant(&rg, "acme").decide().await.unwrap().allowed);
    // Slow enough that nothing drains during the test on a loaded machine.
    let gold = Quota::new("100/h", Some(5)).unwrap();
    let set = admin
        .quota_set(SCOPE, "tenant:acme", &gold, HOUR)
        .await
        .unwrap();
    assert_eq!(
        (set.rate.as_deref(), set.burst),
        (Some("100/3600s"), Some(5))
    );
    // The unit owed at 1/min is one unit at 100/h: four more fit the burst of 5.
    for remaining in (0..4).rev() {
        let d = tenant(&rg, "acme").decide().await.unwrap();
        assert!(d.allowed, "{d:?}");
        assert_eq!((d.limit, d.remaining), (5, remaining));
    }
    assert!(!tenant(&rg, "acme").decide().await.unwrap().allowed);
    // Only that key: its neighbour keeps the code's limit.
    let other = tenant(&rg, "globex").decide().await.unwrap();
    assert_eq!(other.limit, 1);
    let seen = admin
        .quota_get(SCOPE, "tenant:acme")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.burst, Some(5));
    assert!(seen.expires_in_ms.unwrap() > 3_500_000, "{seen:?}");
    assert!(seen.problem.is_none());

    assert!(admin.quota_clear(SCOPE, "tenant:acme").await.unwrap());
    assert!(!admin.quota_clear(SCOPE, "tenant:acme").await.unwrap());
    assert!(
        admin
            .quota_get(SCOPE, "tenant:acme")
            .await
            .unwrap()
            .is_none()
    );
    // The five units owed are five units at 1/min again: rejected, for about five minutes.
    let d = tenant(&rg, "acme").decide().await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.limit, 1);
    assert!(d.retry_after > Duration::from_secs(230), "{d:?}");
}

async fn every_algorithm_takes_the_override(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    for algorithm in Algorithm::ALL {
        let key = format!("algo:{}", algorithm.as_str());
        let limiter = || {
            redguard::limiter(&key)
                .scope(SCOPE)
                .rate("1/h")
                .algorithm(algorithm)
                .on(&rg)
        };
        limiter().check().await.unwrap();
        admin
            .quota_set(SCOPE, &key, &Quota::new("4/h", Some(4)).unwrap(), HOUR)
            .await
            .unwrap();
        let mut admitted = 1;
        for _ in 0..10 {
            let d = limiter().decide().await.unwrap();
            assert_eq!(d.limit, 4, "{algorithm:?}");
            admitted += u64::from(d.allowed);
        }
        assert_eq!(admitted, 4, "{algorithm:?}");
        admin.quota_clear(SCOPE, &key).await.unwrap();
    }
}

async fn an_override_expires_with_its_ttl(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    tenant(&rg, "brief").check().await.unwrap();
    let ttl = QuotaTtl::For(Duration::from_secs(1));
    admin
        .quota_set(
            SCOPE,
            "tenant:brief",
            &Quota::new("1000/s", None).unwrap(),
            ttl,
        )
        .await
        .unwrap();
    assert!(tenant(&rg, "brief").decide().await.unwrap().allowed);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(
        admin
            .quota_get(SCOPE, "tenant:brief")
            .await
            .unwrap()
            .is_none()
    );
    // The units owed at 1000/s were repaid meanwhile: the code's 1/min admits one call.
    let d = tenant(&rg, "brief").decide().await.unwrap();
    assert!(d.allowed && d.limit == 1, "{d:?}");
    assert!(!tenant(&rg, "brief").decide().await.unwrap().allowed);
}

/// 64 tasks call one key at 100/h (burst 100) while the operator lowers it to 10/h (burst
/// 10). The state is kept in units and the script reads the override with the state, so
/// the calls decided after the change see every unit admitted before it: together they
/// never pass the new burst.
async fn a_rate_lowered_while_calls_are_in_flight_admits_nothing_beyond_it(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    let limiter = || {
        redguard::limiter("tenant:busy")
            .scope(SCOPE)
            .rate("100/h")
            .on(&rg)
    };
    let old_admitted = Arc::new(AtomicU64::new(0));
    let new_admitted = Arc::new(AtomicU64::new(0));
    let new_seen = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let limiter = limiter();
            let (old_admitted, new_admitted, new_seen, stop) = (
                old_admitted.clone(),
                new_admitted.clone(),
                new_seen.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    // The memory store answers without yielding: let the operator's task run.
                    tokio::task::yield_now().await;
                    let d = limiter.decide().await.unwrap();
                    match (d.limit, d.allowed) {
                        (100, true) => {
                            old_admitted.fetch_add(1, Ordering::SeqCst);
                            // Slow the old limit down so the change lands mid-way.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        (100, false) => {}
                        (10, allowed) => {
                            new_seen.fetch_add(1, Ordering::SeqCst);
                            new_admitted.fetch_add(u64::from(allowed), Ordering::SeqCst);
                        }
                        other => panic!("unexpected decision {other:?}"),
                    }
                }
            })
        })
        .collect();
    while old_admitted.load(Ordering::SeqCst) < 4 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    admin
        .quota_set(
            SCOPE,
            "tenant:busy",
            &Quota::new("10/h", None).unwrap(),
            HOUR,
        )
        .await
        .unwrap();
    // Every task sees the new limit many times over.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while new_seen.load(Ordering::SeqCst) < 500 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    let (old, new) = (
        old_admitted.load(Ordering::SeqCst),
        new_admitted.load(Ordering::SeqCst),
    );
    assert!(
        new_seen.load(Ordering::SeqCst) >= 500,
        "the new limit was not seen"
    );
    assert!(old >= 4);
    assert_eq!(
        new,
        10u64.saturating_sub(old),
        "{old} admitted at 100/h, then {new} at 10/h: the new burst is 10 in all"
    );
    admin.quota_clear(SCOPE, "tenant:busy").await.unwrap();
}

async fn bad_overrides_are_refused_and_nothing_is_written(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    tenant(&rg, "acme").check().await.unwrap();
    let ok = Quota::new("10/s", None).unwrap();
    for (rate, burst) in [
        ("0/s", None),
        ("10/s", Some(0)),
        ("10/s", Some(2_000_000_000)),
        ("2000000000/s", None),
        ("10/31d", None),
        ("10/0ms", None),
        ("ten/s", None),
    ] {
        assert!(
            matches!(Quota::new(rate, burst), Err(Error::InvalidLimit(_))),
            "{rate} {burst:?}"
        );
    }
    let refused = [
        ("api::unused", "tenant:acme", HOUR),
        (SCOPE, "tenant:acme", QuotaTtl::For(Duration::ZERO)),
        (
            SCOPE,
            "tenant:acme",
            QuotaTtl::For(Duration::from_secs(400 * 86_400)),
        ),
        (SCOPE, "tenant:a*b*", HOUR),
        (SCOPE, "tenant:{acme}*", HOUR),
        (SCOPE, "tenant:{acme}", HOUR),
        (SCOPE, "", HOUR),
        ("bad scope", "tenant:acme", HOUR),
    ];
    for (scope, key, ttl) in refused {
        let err = admin.quota_set(scope, key, &ok, ttl).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::Config(_) | Error::InvalidLimit(_) | Error::InvalidKey { .. }
            ),
            "{scope} {key}: {err:?}"
        );
        assert!(!err.to_string().is_empty());
    }
    assert!(
        admin
            .quota_get(SCOPE, "tenant:acme")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        admin
            .quota_list(SCOPE, 1000)
            .await
            .unwrap()
            .overrides
            .is_empty()
    );
    assert_eq!(tenant(&rg, "acme").peek().await.unwrap().limit, 1);
}

async fn listing_finds_the_overrides_of_a_scope(rg: Redguard) {
    let admin = Admin::new(rg.clone());
    tenant(&rg, "a").check().await.unwrap();
    let quota = Quota::new("5/s", Some(9)).unwrap();
    for id in ["a", "b", "c"] {
        let key = format!("tenant:{id}");
        admin.quota_set(SCOPE, &key, &quota, HOUR).await.unwrap();
    }
    // A permanent one is kept without a TTL: cleared below, so no key is left without one.
    admin
        .quota_set(SCOPE, "tenant:d", &quota, QuotaTtl::Permanent)
        .await
        .unwrap();
    let listed = admin.quota_list(SCOPE, 1000).await.unwrap();
    assert!(!listed.truncated);
    let keys: Vec<&str> = listed.overrides.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    assert!(keys.iter().all(|k| k.contains("{api::tenants:tenant:")));
    let permanent: Vec<_> = listed
        .overrides
        .iter()
        .filter(|o| o.expires_in_ms.is_none())
        .collect();
    assert_eq!(permanent.len(), 1);
    assert!(permanent[0].key.ends_with(":tenant:d}"));
    for id in ["a", "b", "c", "d"] {
        assert!(
            admin
                .quota_clear(SCOPE, &format!("tenant:{id}"))
                .await
                .unwrap()
        );
    }
    assert!(
        admin
            .quota_list(SCOPE, 1000)
            .await
            .unwrap()
            .overrides
            .is_empty()
    );
}

/// Two handles (two instances of a service) on one Redis: one sets the override, the
/// other's very next call is decided with it; clearing it restores the other's limit.
async fn set_on_one_handle_decides_on_another(one: Redguard, other: Redguard) {
    tenant(&other, "acme").check().await.unwrap();
    assert!(!tenant(&other, "acme").decide().await.unwrap().allowed);
    let admin = Admin::new(one);
    // 100/h, not faster: the units owed must not drain between the calls on a loaded machine
    // (at 100/s they drained in 20 ms and the last call was admitted).
    admin
        .quota_set(
            SCOPE,
            "tenant:acme",
            &Quota::new("100/h", Some(3)).unwrap(),
            HOUR,
        )
        .await
        .unwrap();
    let d = tenant(&other, "acme").decide().await.unwrap();
    assert!(d.allowed && d.limit == 3, "{d:?}");
    admin.quota_clear(SCOPE, "tenant:acme").await.unwrap();
    let d = tenant(&other, "acme").decide().await.unwrap();
    assert!(!d.allowed && d.limit == 1, "{d:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_on_one_redis_handle_decides_on_another() {
    let server = redguard_tests::RedisServer::start();
    let one = redguard_tests::connect(&server).await;
    let other = redguard_tests::connect(&server).await;
    set_on_one_handle_decides_on_another(one, other).await;
    server.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_on_one_cluster_handle_decides_on_another() {
    let cluster = redguard_tests::RedisCluster::start();
    let one = cluster.connect().await;
    let other = cluster.connect().await;
    set_on_one_handle_decides_on_another(one, other).await;
    cluster.assert_every_key_has_ttl();
}

/// Values at the override key that are not overrides (written by hand: another shape,
/// numbers outside the grammar's bounds, another type) are ignored: the code's limit
/// decides, never an unlimited key, and `quota get` shows the problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_is_not_an_override_is_ignored() {
    let server = redguard_tests::RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let admin = Admin::new(rg.clone());
    tenant(&rg, "edited").check().await.unwrap();
    let state = admin
        .key(GuardKind::RateLimit, SCOPE, "tenant:edited")
        .unwrap();
    let key = format!("{}:quota", state.as_str());
    assert_eq!(admin.raw_key(&key).unwrap().as_str(), state.as_str());
    let mut conn = server.connection();
    let set = |conn: &mut ::redis::Connection, value: &str| {
        let _: () = ::redis::cmd("SET")
            .arg(&key)
            .arg(value)
            .arg("EX")
            .arg(60)
            .query(conn)
            .unwrap();
    };
    let garbage = [
        "unlimited",
        "q1 1000 1000000 1000 1",
        "q1 100 1000000 0 10000000",
        "q1 100 1000000 2000000000 10000000",
        "q1 100 1000000 200 10000000 extra",
        "q1 100 100 200 1000",
    ];
    for value in garbage {
        set(&mut conn, value);
        // The code's limit decides (1/min, one unit owed), on both scripts.
        let d = tenant(&rg, "edited").decide().await.unwrap();
        assert!(!d.allowed && d.limit == 1, "{value:?}: {d:?}");
        let both = tenant(&rg, "edited").and(tenant(&rg, "other"));
        let ds = both.decide().await.unwrap();
        assert!(!ds[0].allowed && ds[0].limit == 1, "{value:?}: {ds:?}");
        let seen = admin
            .quota_get(SCOPE, "tenant:edited")
            .await
            .unwrap()
            .unwrap();
        assert!(seen.problem.is_some(), "{value:?}: {seen:?}");
        // `usage` says the same: the code decides, the value is listed as ignored.
        let usage = admin
            .usage(SCOPE, "tenant:edited", &code_limit())
            .await
            .unwrap();
        assert_eq!(usage.source, LimitSource::Code, "{value:?}: {usage:?}");
        assert_eq!(usage.ignored.len(), 1, "{value:?}: {usage:?}");
        assert!(
            !usage.next.allowed && usage.burst == 1,
            "{value:?}: {usage:?}"
        );
    }
    let _: () = ::redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    let _: () = ::redis::cmd("HSET")
        .arg(&key)
        .arg("rate")
        .arg("1000000/s")
        .query(&mut conn)
        .unwrap();
    let _: () = ::redis::cmd("EXPIRE")
        .arg(&key)
        .arg(60)
        .query(&mut conn)
        .unwrap();
    let d = tenant(&rg, "edited").decide().await.unwrap();
    assert!(!d.allowed && d.limit == 1, "a hash: {d:?}");
    let seen = admin
        .quota_get(SCOPE, "tenant:edited")
        .await
        .unwrap()
        .unwrap();
    assert!(seen.problem.is_some());
    server.assert_every_key_has_ttl();
}

/// A production keyspace is larger than one bounded scan: with two million other keys in
/// Redis, an override for a key of a scope whose limit has run is set — at once when the key's
/// own state is there, and with a warning when only the bounded scan could tell (it ran out
/// of budget before meeting a key of the scope: not a proof that none exists). Before, the
/// scan alone decided, and refused as "no rate limit of this scope" unless it happened to meet
/// the scope's key among the first 64,000 it read (the bench's full run hit this after its
/// earlier rows had filled Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_in_use_is_found_among_millions_of_other_keys() {
    let server = redguard_tests::RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let mut conn = server.connection();
    let filled: u64 = ::redis::cmd("EVAL")
        .arg(
            "for i = 1, tonumber(ARGV[1]) do redis.call('SET', 'filler:' .. i, 'x', 'EX', 3600) end \
             return redis.call('DBSIZE')",
        )
        .arg(0)
        .arg(2_000_000)
        .query(&mut conn)
        .expect("fill the keyspace");
    assert!(filled >= 2_000_000);
    assert!(tenant(&rg, "big").check().await.is_ok());

    let admin = Admin::new(rg.clone());
    let quota = Quota::new("10/min", None).unwrap();
    // Keys whose state is not (yet) in the store: only the scan can tell the scope is in use.
    for id in ["new-1", "new-2", "new-3"] {
        admin
            .quota_set(SCOPE, &format!("tenant:{id}"), &quota, HOUR)
            .await
            .expect("an override the bounded scan cannot confirm");
    }
    admin
        .quota_set(SCOPE, "tenant:big", &quota, HOUR)
        .await
        .expect("an exact-key override of a key in use");
    assert_eq!(tenant(&rg, "big").peek().await.unwrap().limit, 10);
    // A scope no limit uses, on a keyspace small enough to read whole, is still refused.
    ::redis::cmd("FLUSHALL").query::<()>(&mut conn).unwrap();
    assert!(matches!(
        admin.quota_set(SCOPE, "tenant:big", &quota, HOUR).await,
        Err(Error::Config(_))
    ));
    server.assert_every_key_has_ttl();
}
