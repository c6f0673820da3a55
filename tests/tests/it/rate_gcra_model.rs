//! GCRA cross-checked against an independent model: thousands of calls at irregular
//! intervals, with varying cost, and for each the store's own timestamp (returned with the
//! decision) fed to a plain continuous-state leaky bucket (ITU-T I.371), the other classic
//! formulation of GCRA. Allow/deny must match call for call, `retry_after` within 1 ms.

use std::time::Duration;

use redguard::__private::store::{RateCheck, RateMode};
use redguard::{Algorithm, GuardKind, KeyBuilder, Limit, Rate, Redguard};

/// The reference: level `x` (µs of work queued) as of `last`; each unit adds the
/// increment `t`, the bucket drains 1 µs per µs and holds at most `burst · t`.
struct Model {
    t: u64,
    limit: u64,
    x: u64,
    last: u64,
}

impl Model {
    fn new(rate: Rate, burst: u64) -> Model {
        // The documented quantisation: the emission interval in whole µs, rounded up.
        let t = (rate.period().as_micros() as u64).div_ceil(rate.count());
        Model {
            t,
            limit: burst * t,
            x: 0,
            last: 0,
        }
    }

    /// (allowed, retry_after µs) at store time `now` for `cost` units.
    fn decide(&mut self, now: u64, cost: u64) -> (bool, u64) {
        let drained = self.x.saturating_sub(now.saturating_sub(self.last));
        let inc = cost * self.t;
        if drained + inc > self.limit {
            (false, drained + inc - self.limit)
        } else {
            self.x = drained + inc;
            self.last = now;
            (true, 0)
        }
    }
}

const CALLS: usize = 3000;

async fn gcra_matches_the_reference_model(rg: Redguard) {
    // 7 per 20 ms does not divide evenly: T = 2858 µs exercises the rounding.
    let rate = Rate::new(7, Duration::from_millis(20)).unwrap();
    let burst = 6;
    let mut model = Model::new(rate, burst);
    let body = KeyBuilder::new().text("model").finish().unwrap();
    let key = rg.key(GuardKind::RateLimit, "gcra-model", &body).unwrap();
    let limits: Vec<Limit> = (1..=3)
        .map(|cost| Limit::new(Algorithm::Gcra, rate, Some(burst), cost, Duration::ZERO).unwrap())
        .collect();
    let (mut allowed, mut denied, mut worst_retry_diff) = (0, 0, 0u64);
    for i in 0..CALLS {
        // Irregular arrivals: mostly back to back, sometimes a pause of up to 6 ms.
        if fastrand::u8(..) < 40 {
            tokio::time::sleep(Duration::from_micros(fastrand::u64(..6000))).await;
        }
        let cost = if fastrand::u8(..) < 30 {
            fastrand::u64(2..=3)
        } else {
            1
        };
        let limit = &limits[cost as usize - 1];
        let checks = [RateCheck { key: &key, limit }];
        let outcome = redguard::__private::store::of(&rg)
            .rate_check(&checks, RateMode::Consume)
            .await
            .unwrap();
        let d = outcome.decisions[0];
        let now = outcome.now.as_micros() as u64;
        let (expect, retry) = model.decide(now, cost);
        assert_eq!(
            d.allowed, expect,
            "call {i} (cost {cost}) at {now}: store {d:?}, model allowed={expect} retry={retry}"
        );
        let diff = (d.retry_after.as_micros() as u64).abs_diff(retry);
        assert!(
            diff <= 1000,
            "call {i}: retry_after {d:?} vs model {retry} µs"
        );
        worst_retry_diff = worst_retry_diff.max(diff);
        if expect {
            allowed += 1;
        } else {
            denied += 1;
        }
    }
    println!(
        "gcra vs model: {CALLS} calls, {allowed} allowed, {denied} denied, identical; \
         worst retry_after difference {worst_retry_diff} µs"
    );
    assert!(
        allowed > CALLS / 20 && denied > CALLS / 20,
        "{allowed}/{denied}"
    );
}

redguard_tests::conformance!(gcra_matches_the_reference_model);
