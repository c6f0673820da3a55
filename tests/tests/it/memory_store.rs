//! The in-memory store's own features: a manual clock and expiry without touching keys.

use std::time::Duration;

use redguard::store::MemoryStore;
use redguard::{Error, Redguard, clock::ManualClock};

#[tokio::test]
async fn manual_clock_drives_expiry() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let rg = Redguard::from_store(store.clone());
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
        rg.store().time().await.unwrap(),
        redguard::clock::Clock::now(&clock)
    );
}
