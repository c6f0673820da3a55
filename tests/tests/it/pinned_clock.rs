//! The scripts on a pinned clock (the `test-util` feature): the store's decisions follow the
//! test's clock exactly, on Redis as on the in-memory store, so models can be compared with
//! the scripts without tolerances.

use std::time::Duration;

use redguard::{Clock, ManualClock, Redguard};
use redguard_tests::RedisServer;

/// Far enough ahead of the real clock that keys written with absolute expiries (PXAT) on
/// the virtual clock do not expire on Redis's real one.
fn virtual_clock() -> ManualClock {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(24 * 3600));
    clock
}

/// Fencing tokens are the larger of the counter plus one and the store's clock in µs: on a
/// pinned clock, exactly predictable.
async fn fences_follow_the_pinned_clock(rg: Redguard, clock: ManualClock) {
    let now = || u64::try_from(clock.now().as_micros()).unwrap();
    let first = rg.lock("pinned").acquire().await.unwrap();
    assert_eq!(first.fence(), now());
    first.release().await.unwrap();
    // The clock did not move: the counter decides.
    let second = rg.lock("pinned").acquire().await.unwrap();
    assert_eq!(second.fence(), now() + 1);
    second.release().await.unwrap();
    clock.advance(Duration::from_micros(250));
    let third = rg.lock("pinned").acquire().await.unwrap();
    assert_eq!(third.fence(), now());
    third.release().await.unwrap();
    assert_eq!(
        redguard::__private::store::of(&rg).time().await.unwrap(),
        clock.now()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory() {
    let clock = virtual_clock();
    let rg = Redguard::memory_builder()
        .clock(clock.clone())
        .connect()
        .await
        .unwrap();
    fences_follow_the_pinned_clock(rg, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis() {
    let server = RedisServer::start();
    let clock = virtual_clock();
    let rg = Redguard::redis(server.url())
        .clock(clock.clone())
        .connect()
        .await
        .unwrap();
    fences_follow_the_pinned_clock(rg, clock).await;
    server.assert_every_key_has_ttl();
}
