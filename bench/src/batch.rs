//! Idempotency batches for queue consumers: claims per second for batches of 1, 10 and 100,
//! against the single-call rows (`idempotency replay` / `idempotency first`) of the same run.
//! One op of a row is one batch; the notes give claims per second (ops/s × batch size).

use std::time::Duration;

use redguard::Redguard;
use redguard::idempotency::BatchOutcome;
use redguard::key::KeyBuilder;

use crate::Bench;

const SIZES: [u64; 3] = [1, 10, 100];

fn key(i: u64) -> redguard::key::KeyBody {
    KeyBuilder::new()
        .text("bench:")
        .part("id", &i)
        .finish()
        .expect("numeric key parts are valid")
}

/// One batch of `n` messages from key `from` on, each body returning its index.
async fn batch(rg: &Redguard, scope: &'static str, from: u64, n: u64) {
    let mut batch = rg
        .idempotency_batch()
        .scope(scope)
        .expire(Duration::from_secs(600));
    for i in from..from + n {
        batch = batch.message(key(i));
    }
    let outcomes = batch
        .run(|i| async move { Ok::<_, redguard::Error>(i as u64) })
        .await
        .expect("batch");
    assert!(
        outcomes.iter().all(BatchOutcome::is_done),
        "every message done"
    );
}

pub(crate) async fn cases(bench: &mut Bench, rg: &Redguard) {
    for n in SIZES {
        // A redelivered batch: every message done, so the claim is all the batch does.
        let scope: &'static str = match n {
            1 => "bench-batch-1",
            10 => "bench-batch-10",
            _ => "bench-batch-100",
        };
        batch(rg, scope, 0, n).await;
        let case = format!("idempotency batch x{n} replay (1 op = 1 batch)");
        let handle = rg.clone();
        bench
            .run(&case, "redis", None, None, &[], move |_| {
                let handle = handle.clone();
                async move {
                    batch(&handle, scope, 0, n).await;
                }
            })
            .await;
        note(bench, &case, n);
        // Fresh messages: the claim, then each body and its finish, one after another.
        let case = format!("idempotency batch x{n} first (1 op = 1 batch)");
        let handle = rg.clone();
        let first: &'static str = match n {
            1 => "bench-batch-first-1",
            10 => "bench-batch-first-10",
            _ => "bench-batch-first-100",
        };
        bench
            .run(&case, "redis", None, None, &[], move |i| {
                let handle = handle.clone();
                async move {
                    batch(&handle, first, i * n, n).await;
                }
            })
            .await;
        note(bench, &case, n);
    }
}

/// Claims per second of the rows of `case` just run: ops/s × batch size.
fn note(bench: &mut Bench, case: &str, n: u64) {
    let claims: Vec<String> = bench
        .rows
        .iter()
        .filter(|row| row.case == case)
        .map(|row| {
            format!(
                "N={}: {:.0}",
                row.in_flight,
                row.sample.ops_per_sec * n as f64
            )
        })
        .collect();
    if !claims.is_empty() {
        bench
            .notes
            .push(format!("{case}: claims/s {}", claims.join(", ")));
    }
}
