//! Redis Sentinel: the harness itself, and guards on a handle that follows the master
//! through failovers.

use std::time::Duration;

use redguard_tests::RedisSentinel;
use redguard_tests::sentinel::role;

/// The harness does what the other Sentinel tests count on: a SIGKILLed master is replaced
/// by a replica within a few seconds, and a planned failover moves the master while the old
/// one keeps running (and becomes a replica).
#[test]
fn harness_promotes_a_replica_after_a_kill_and_on_request() {
    let mut sentinel = RedisSentinel::start();
    let first = sentinel.master();
    let killed = std::time::Instant::now();
    assert_eq!(sentinel.kill_master(), first);
    let second = sentinel.wait_for_promotion(first);
    assert_ne!(second, first);
    let took = killed.elapsed();
    println!("kill -> promotion seen: {took:?}");
    assert!(took < Duration::from_secs(10), "promotion took {took:?}");

    // The remaining replica follows the new master; then a planned switch.
    sentinel.node(first).restart();
    sentinel.wait_until_ready(Duration::from_secs(30));
    let before = sentinel.master();
    sentinel.failover();
    let after = sentinel.wait_for_promotion(before);
    assert_ne!(after, before);
    assert_eq!(role(sentinel.node(after)), "master");
}
