//! A server that may evict guard keys (`maxmemory` with a policy other than `noeviction`) is
//! reported at connect and by `health`, and refused when the handle says so: an evicted lock,
//! fence counter or SUCCESS record breaks the guard silently otherwise.

use redguard::handle::{Eviction, EvictionCheck};
use redguard::{Error, Redguard};
use redguard_tests::RedisCluster;
use redguard_tests::RedisServer;

fn set_eviction(server: &RedisServer, policy: &str, maxmemory: u64) {
    let mut conn = server.connection();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg(policy)
        .arg("maxmemory")
        .arg(maxmemory)
        .query(&mut conn)
        .unwrap();
}

#[tokio::test]
async fn an_evicting_server_is_reported_and_refused_on_request() {
    let server = RedisServer::start();
    // Every guard key has a TTL, so a volatile policy may evict them as well as allkeys.
    for policy in ["volatile-lru", "allkeys-lfu"] {
        set_eviction(&server, policy, 256 << 20);
        let rg = Redguard::redis(server.url()).connect().await.unwrap();
        let eviction = rg.health().await.unwrap().eviction.unwrap();
        assert_eq!(eviction, Eviction::new(policy, 256 << 20));
        assert!(eviction.may_evict_guard_keys());

        let err = Redguard::redis(server.url())
            .eviction_check(EvictionCheck::Refuse)
            .connect()
            .await
            .unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(err, Error::Config(_))
                && message.contains(policy)
                && message.contains("noeviction"),
            "{message}"
        );
    }
    // No limit set: nothing is evicted, whatever the policy.
    set_eviction(&server, "allkeys-lru", 0);
    Redguard::redis(server.url())
        .eviction_check(EvictionCheck::Refuse)
        .connect()
        .await
        .unwrap();
    set_eviction(&server, "noeviction", 256 << 20);
    let rg = Redguard::redis(server.url())
        .eviction_check(EvictionCheck::Refuse)
        .connect()
        .await
        .unwrap();
    // Read at each call: a setting changed under a running service shows.
    let health = rg.health().await.unwrap();
    assert!(!health.eviction.unwrap().may_evict_guard_keys());
    set_eviction(&server, "volatile-ttl", 256 << 20);
    let health = rg.health().await.unwrap();
    assert_eq!(
        health.eviction,
        Some(Eviction::new("volatile-ttl", 256 << 20))
    );
}

/// On a Cluster one evicting master is enough to lose the keys of its slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_evicting_cluster_master_is_found() {
    let mut cluster = RedisCluster::start();
    let urls = cluster.master_urls();
    let rg = Redguard::redis_cluster(urls.clone())
        .connect()
        .await
        .unwrap();
    assert!(
        !rg.health()
            .await
            .unwrap()
            .eviction
            .unwrap()
            .may_evict_guard_keys()
    );
    let master = cluster.master_of("any");
    set_eviction(cluster.node(master), "allkeys-random", 64 << 20);
    let health = rg.health().await.unwrap();
    assert_eq!(
        health.eviction,
        Some(Eviction::new("allkeys-random", 64 << 20))
    );
    let err = Redguard::redis_cluster(urls)
        .eviction_check(EvictionCheck::Refuse)
        .connect()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("allkeys-random"), "{err}");
}

/// The in-process store evicts nothing and says so by `None`.
#[tokio::test]
async fn memory_has_no_eviction_setting() {
    assert_eq!(Redguard::memory().health().await.unwrap().eviction, None);
}
