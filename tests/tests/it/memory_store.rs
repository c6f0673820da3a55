//! The in-memory store's own features: a manual clock and expiry without touching keys.

use std::time::{Duration, Instant};

use redguard::__private::store::MemoryStore;
use redguard::{Error, ManualClock};

#[tokio::test]
async fn manual_clock_drives_expiry() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let rg = redguard::__private::store::handle(store.clone());
    let short = rg
        .tokens()
        .issue("a", Duration::from_secs(10))
        .await
        .unwrap();
    let long = rg
        .tokens()
        .issue("a", Duration::from_secs(100))
        .await
        .unwrap();
    assert_eq!(store.len(), 2);

    clock.advance(Duration::from_secs(9));
    assert_eq!(store.len(), 2);
    clock.advance(Duration::from_secs(1));
    // Expired entries are dropped as time passes, not only when touched.
    assert_eq!(store.len(), 1);
    let expired = rg.tokens().consume("a", &short).await;
    assert!(matches!(expired, Err(Error::TokenUnknown)), "{expired:?}");

    rg.tokens().consume("a", &long).await.unwrap();
    clock.advance(Duration::from_secs(90));
    assert!(store.is_empty());
    assert_eq!(
        redguard::__private::store::of(&rg).time().await.unwrap(),
        redguard::Clock::now(&clock)
    );
}

/// Tens of thousands of keys expiring together are dropped a few per call: the first call
/// after they expire is as quick as any other. (The store used to drop them all inside that
/// call, holding the one lock every caller waits on.)
#[tokio::test]
async fn a_mass_expiry_does_not_stall_the_next_call() {
    const GROUPS: u64 = 5;
    const PER_GROUP: usize = 20_000;
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let rg = redguard::__private::store::handle(store.clone());
    let tokens = rg.tokens();
    for group in 1..=GROUPS {
        for _ in 0..PER_GROUP {
            let ttl = Duration::from_secs(group * 10);
            tokens.issue("mass", ttl).await.unwrap();
        }
    }
    let probe = Duration::from_secs(1000);
    // A call's usual time on this machine, now.
    let mut usual = Vec::new();
    for _ in 0..200 {
        let started = Instant::now();
        tokens.issue("probe", probe).await.unwrap();
        usual.push(started.elapsed());
    }
    usual.sort_unstable();
    let median = usual[usual.len() / 2];
    // The first call after each group expired; the quickest of them, so that one
    // preemption of this test's thread on a loaded machine cannot fail it.
    let mut first_after = Vec::new();
    for _ in 0..GROUPS {
        clock.advance(Duration::from_secs(10));
        let started = Instant::now();
        tokens.issue("probe", probe).await.unwrap();
        first_after.push(started.elapsed());
    }
    let quickest = first_after.iter().min().copied().unwrap_or_default();
    assert!(
        quickest < median * 50,
        "the first call after {PER_GROUP} keys expired took {quickest:?}, a usual one {median:?}"
    );
    assert_eq!(store.len(), 200 + GROUPS as usize);
}
