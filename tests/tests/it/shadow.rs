//! Shadow (dry-run) limits (issue 28): decided and counted as if enforced, admitted anyway;
//! stacked with enforced limits, those are still enforced and charged. The near-limit
//! signal's metric is emitted by `metrics.rs`'s workload.

use redguard::{Error, Redguard};

redguard_tests::conformance!(
    a_shadow_limit_admits_what_it_would_refuse,
    enforced_limits_stacked_with_a_shadow_one_are_still_charged,
    the_attribute_takes_shadow_from_configuration,
);

/// Shadow mode from configuration, read per call: `shadow = <bool expression>`.
#[redguard::rate_limit(key = "report:{user}", rate = "1/h", scope = "api::shadow", shadow = *dry_run)]
async fn report(user: u64, dry_run: &bool) -> redguard::Result<u64> {
    Ok(user)
}

async fn a_shadow_limit_admits_what_it_would_refuse(rg: Redguard) {
    let limiter = |shadow: bool| {
        redguard::limiter("export")
            .scope("api::shadow")
            .rate("2/h")
            .shadow(shadow)
            .on(&rg)
    };
    for call in 0..6 {
        let d = limiter(true).check().await.unwrap();
        assert!(d.allowed, "call {call}: {d:?}");
        assert_eq!(d.remaining, 1u64.saturating_sub(call), "call {call}");
    }
    // Counted as if enforced: the two admissions, not the four refusals.
    let d = limiter(false).peek().await.unwrap();
    assert!(!d.allowed && d.remaining == 0, "{d:?}");
    assert!(
        d.retry_after > std::time::Duration::from_secs(1700),
        "{d:?}"
    );
    // Enforcing is `.shadow(false)`: the same key now refuses.
    assert!(matches!(
        limiter(false).check().await,
        Err(Error::RateLimited(_))
    ));
    assert!(!limiter(false).decide().await.unwrap().allowed);
}

async fn enforced_limits_stacked_with_a_shadow_one_are_still_charged(rg: Redguard) {
    let user = || {
        redguard::limiter("orders:user:7")
            .scope("api::shadow")
            .rate("3/h")
            .on(&rg)
    };
    let global = || {
        redguard::limiter("orders")
            .scope("api::shadow")
            .rate("1/h")
            .shadow(true)
            .on(&rg)
    };
    for call in 0..3u64 {
        let ds = user().and(global()).check().await.unwrap();
        assert!(ds.iter().all(|d| d.allowed), "call {call}: {ds:?}");
        assert_eq!(
            ds[0].remaining,
            2 - call,
            "call {call}: the user limit is charged"
        );
    }
    assert_eq!(user().peek().await.unwrap().remaining, 0);
    // The enforced limit refuses the fourth call, shadow or not.
    match user().and(global()).check().await {
        Err(Error::RateLimited(d)) => assert_eq!(d.limit, 3),
        other => panic!("expected the user limit to refuse: {other:?}"),
    }
}

async fn the_attribute_takes_shadow_from_configuration(rg: Redguard) {
    rg.scope(async {
        assert_eq!(report(1, &true).await.unwrap(), 1);
        // Over the limit, in shadow mode: admitted anyway.
        assert_eq!(report(1, &true).await.unwrap(), 1);
        // The same limit enforced (a configuration change): refused.
        assert!(matches!(
            report(1, &false).await,
            Err(Error::RateLimited(_))
        ));
    })
    .await;
}
