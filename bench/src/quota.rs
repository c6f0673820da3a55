//! The cost of quota overrides: GCRA checks on keys that each carry an override (read by the
//! deciding script, one more `GET`) against the same checks on keys without one, same run,
//! same limit, every level of concurrency (issue 28: at most 10% at 16 and 64 in flight).

use std::time::Duration;

use redguard::Redguard;
use redguard::admin::{Admin, Quota, QuotaTtl};

use crate::Bench;

/// Keys each case cycles through (enough that coalesced calls carry distinct keys).
const KEYS: u64 = 1024;

const SCOPE: &str = "bench::quota";

fn limiter(rg: &Redguard, set: &str, i: u64) -> redguard::rate::Limiter {
    redguard::limiter(redguard::key(&format!("{set}{{i}}")).part("i", &(i % KEYS)))
        .scope(SCOPE)
        .rate("1000000/s")
        .burst(1000)
        .on(rg)
}

pub(crate) async fn cases(bench: &mut Bench, rg: &Redguard) {
    const CASES: [(&str, &str); 2] = [
        ("rate gcra, keys without an override", "without:"),
        ("rate gcra, keys with an override", "with:"),
    ];
    // The overrides' set-up (a thousand admin calls, each scanning the scope) only for these
    // rows: under `--only` another row's instruction count would include it.
    if !CASES.iter().any(|(case, _)| bench.selected(case, "redis")) {
        return;
    }
    // A slow limit keeps the scope in the store, so the overrides can be set (the admin
    // refuses a scope no limit uses).
    let anchor = redguard::limiter("anchor").scope(SCOPE).rate("1/h").on(rg);
    anchor.decide().await.expect("anchor");
    // The override gives the same limit as the code: only its reading differs.
    let same = Quota::new("1000000/s", Some(1000)).expect("quota");
    let admin = Admin::new(rg.clone());
    for i in 0..KEYS {
        admin
            .quota_set(
                SCOPE,
                &format!("with:{i}"),
                &same,
                QuotaTtl::For(Duration::from_secs(3600)),
            )
            .await
            .expect("quota set");
    }
    for (case, set) in CASES {
        let rg = rg.clone();
        let op = move |i| {
            let limiter = limiter(&rg, set, i);
            async move {
                assert!(limiter.decide().await.expect("rate check").allowed);
            }
        };
        bench.run(case, "redis", None, None, &[], op).await;
    }
    for i in 0..KEYS {
        admin
            .quota_clear(SCOPE, &format!("with:{i}"))
            .await
            .expect("quota clear");
    }
}
