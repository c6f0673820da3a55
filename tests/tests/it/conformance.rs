//! The store conformance suite, shared cases: each runs against the in-memory store and a
//! real Redis (see `redguard_tests::conformance!`).

use std::time::Duration;

use redguard::{Error, Redguard};

redguard_tests::conformance!(
    time_round_trip,
    token_consumed_once,
    token_outcomes_are_distinct,
    token_concurrent_consume_has_one_winner,
    token_rejects_bad_input_before_store,
);

async fn time_round_trip(rg: Redguard) {
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let store_time = redguard::__private::store::of(&rg).time().await.unwrap();
    // Same machine: the store's clock is within a second of ours.
    let skew = store_time.abs_diff(before);
    assert!(skew < Duration::from_secs(1), "store time off by {skew:?}");
}

async fn token_consumed_once(rg: Redguard) {
    let tokens = rg.tokens();
    let token = tokens
        .issue("checkout", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(token.len(), 32);
    tokens.consume("checkout", &token).await.unwrap();
    let second = tokens.consume("checkout", &token).await;
    assert!(matches!(second, Err(Error::TokenUsed)), "{second:?}");
}

async fn token_outcomes_are_distinct(rg: Redguard) {
    let tokens = rg.tokens();
    let token = tokens
        .issue("checkout", Duration::from_secs(60))
        .await
        .unwrap();
    let wrong_scene = tokens.consume("signup", &token).await;
    assert!(
        matches!(wrong_scene, Err(Error::TokenMismatch)),
        "{wrong_scene:?}"
    );
    // A mismatch does not burn the token for its own scene.
    tokens.consume("checkout", &token).await.unwrap();
    let forged = tokens
        .consume("checkout", "0123456789abcdef0123456789abcdef")
        .await;
    assert!(matches!(forged, Err(Error::TokenUnknown)), "{forged:?}");
    let other = tokens
        .issue("checkout", Duration::from_secs(60))
        .await
        .unwrap();
    assert_ne!(token, other);
}

async fn token_concurrent_consume_has_one_winner(rg: Redguard) {
    let token = rg
        .tokens()
        .issue("pay", Duration::from_secs(60))
        .await
        .unwrap();
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let tokens = rg.tokens();
            let token = token.clone();
            tokio::spawn(async move { tokens.consume("pay", &token).await })
        })
        .collect();
    let mut winners = 0;
    let mut used = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(()) => winners += 1,
            Err(Error::TokenUsed) => used += 1,
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((winners, used), (1, 49));
}

async fn token_rejects_bad_input_before_store(rg: Redguard) {
    let tokens = rg.tokens();
    for forged in ["a:b", "{x}", "a b", "é", "", &"a".repeat(65)] {
        let outcome = tokens.consume("checkout", forged).await;
        assert!(
            matches!(outcome, Err(Error::TokenUnknown)),
            "{forged:?}: {outcome:?}"
        );
    }
    for scene in ["", "a b", "a{b}"] {
        let issued = tokens.issue(scene, Duration::from_secs(60)).await;
        assert!(
            matches!(issued, Err(Error::InvalidKey { .. })),
            "{scene:?}: {issued:?}"
        );
    }
    let forever = tokens
        .issue("checkout", Duration::from_secs(8 * 24 * 3600))
        .await;
    assert!(matches!(forever, Err(Error::Config(_))), "{forever:?}");
}
