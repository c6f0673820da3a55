//! Issue 45 (item 6) and 46: the futures of guarded calls and their poll frames stay small
//! enough for a debug-build test on the default 2 MiB test thread. Each guard adds at most
//! [`GUARD_BUDGET`] bytes to a call's future, measured against the same body unguarded, and
//! the guide's deepest documented patterns (runtime/docs/testing.md, README) run on a 2 MiB
//! thread (and on 1 MiB, for margin; they needed 96 KiB when written). Each guard's state is
//! boxed once at its entry (`__private::Guarded`), so it is also measured in its box. Sizes:
//! `cargo test -p redguard-tests --test it stack:: -- --nocapture`.

use std::collections::HashSet;
use std::future::Future;
use std::mem::size_of_val;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use redguard::idempotency::track_replay;
use redguard::testing::{At, Fault, Faults, History, Point};
use redguard::{Redguard, dist_lock, idempotent, rate_limit};

/// The state one guard may add to a call's future.
const GUARD_BUDGET: usize = 4 * 1024;

// ---- the guide's bodies (runtime/docs/testing.md) ----------------------------------------

static CHARGES: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = "{order_id}", expire = 60)]
async fn charge(order_id: u64) -> redguard::Result<u64> {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(order_id * 100)
}

async fn charge_unguarded(order_id: u64) -> redguard::Result<u64> {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(order_id * 100)
}

#[dist_lock(key = "{order_id}", wait = "300ms")]
async fn charge_locked(order_id: u64) -> redguard::Result<u64> {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(order_id * 100)
}

#[rate_limit(key = "{order_id}", rate = "5/s", burst = 10)]
async fn charge_limited(order_id: u64) -> redguard::Result<u64> {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(order_id * 100)
}

#[idempotent(key = "{payment}", expire = 60)]
async fn capture_then_record(
    provider: &History,
    ledger: &Mutex<HashSet<String>>,
    payment: &str,
) -> redguard::Result<()> {
    provider.effect(payment); // acked to the provider: too early
    ledger.lock().unwrap().insert(payment.to_owned());
    Ok(())
}

#[idempotent(key = "{payment}", expire = 60)]
async fn record_then_capture(
    provider: &History,
    ledger: &Mutex<HashSet<String>>,
    payment: &str,
) -> redguard::Result<()> {
    if ledger.lock().unwrap().insert(payment.to_owned()) {
        provider.effect(payment);
    }
    Ok(())
}

// ---- the README's stacked example ----------------------------------------------------------

#[derive(serde::Serialize)]
struct SubmitOrder {
    request_id: String,
    sku: String,
    qty: u32,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    order_id: u64,
}

#[derive(Debug, redguard::Classify)]
enum OrderError {
    #[classify(from)]
    Guard(redguard::Error),
}

#[rate_limit(key = "order:submit:user:{user_id}", rate = "5/s", burst = 10)]
#[idempotent(key = "{user_id}:{req.request_id}", expire = 600, payload = req)]
async fn submit_order(user_id: u64, req: SubmitOrder) -> Result<Receipt, OrderError> {
    reserve_stock(&req.sku, req.qty).await?;
    Ok(Receipt { order_id: 1 })
}

async fn submit_order_unguarded(_user_id: u64, req: SubmitOrder) -> Result<Receipt, OrderError> {
    reserve_stock_unguarded(&req.sku, req.qty).await?;
    Ok(Receipt { order_id: 1 })
}

#[dist_lock(key = "stock:{sku}", wait = "300ms")]
async fn reserve_stock(sku: &str, qty: u32) -> Result<(), OrderError> {
    let _ = (sku, qty);
    Ok(())
}

async fn reserve_stock_unguarded(sku: &str, qty: u32) -> Result<(), OrderError> {
    let _ = (sku, qty);
    Ok(())
}

fn order(request_id: &str) -> SubmitOrder {
    SubmitOrder {
        request_id: request_id.to_owned(),
        sku: "sku-1".to_owned(),
        qty: 1,
    }
}

// ---- sizes ---------------------------------------------------------------------------------

fn added(what: &str, guarded: usize, unguarded: usize) -> usize {
    let added = guarded.saturating_sub(unguarded);
    println!("{what:<34} {guarded:>7} B future, {unguarded:>5} B unguarded, +{added} B");
    added
}

#[test]
fn each_guard_adds_at_most_4_kib_to_a_call_future() {
    let rg = Redguard::memory();
    let unguarded = size_of_val(&charge_unguarded(7));
    let stacked_unguarded = size_of_val(&submit_order_unguarded(7, order("r")));
    let sizes = [
        ("#[idempotent]", size_of_val(&charge(7)), unguarded),
        ("#[dist_lock]", size_of_val(&charge_locked(7)), unguarded),
        ("#[rate_limit]", size_of_val(&charge_limited(7)), unguarded),
        (
            "README stack (3 guards, /3)",
            stacked_unguarded
                + size_of_val(&submit_order(7, order("r"))).saturating_sub(stacked_unguarded) / 3,
            stacked_unguarded,
        ),
        (
            "Redguard::scope(#[idempotent])",
            size_of_val(&rg.scope(charge(7))),
            size_of_val(&charge(7)),
        ),
        (
            "track_replay(#[idempotent])",
            size_of_val(&track_replay(charge(7))),
            size_of_val(&charge(7)),
        ),
        (
            "scope(track_replay(README stack))",
            size_of_val(&rg.scope(track_replay(submit_order(7, order("r"))))),
            size_of_val(&submit_order(7, order("r"))),
        ),
    ];
    // What the boxes hold (on the heap, not in the caller's future or its frames).
    let body = || async { Ok::<u64, redguard::Error>(7) };
    let boxed = [
        (
            "#[idempotent] box",
            size_of_val(&*redguard::__private::idempotent(
                redguard::idempotency("k"),
                body(),
            )),
        ),
        (
            "#[dist_lock] box",
            size_of_val(&*redguard::__private::dist_lock(
                redguard::lock("k"),
                body(),
            )),
        ),
        (
            "#[rate_limit] box",
            size_of_val(&*redguard::__private::rate_limit(
                [redguard::limiter("k")],
                body(),
            )),
        ),
    ];
    let mut over: Vec<_> = sizes
        .iter()
        .filter(|(what, guarded, unguarded)| added(what, *guarded, *unguarded) > GUARD_BUDGET)
        .map(|(what, ..)| *what)
        .collect();
    for (what, size) in boxed {
        println!("{what:<34} {size:>7} B on the heap");
        if size > GUARD_BUDGET {
            over.push(what);
        }
    }
    assert!(
        over.is_empty(),
        "over the {GUARD_BUDGET} B budget: {over:?}"
    );
}

// ---- the documented patterns on a small stack ----------------------------------------------

/// Runs `test` on a thread of `stack` bytes, on a current-thread runtime, as `#[tokio::test]`
/// does on the default test thread. A stack overflow aborts the whole binary.
fn on_stack<F, Fut>(stack: usize, test: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    std::thread::Builder::new()
        .name(format!("stack-{stack}"))
        .stack_size(stack)
        .spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(test());
        })
        .expect("thread")
        .join()
        .expect("the test panicked");
}

/// testing.md's kit example (two deliveries in one scope of a faulty handle whose first
/// recorded outcome is lost), each call under `track_replay`, and the README's stacked
/// submit replayed, likewise.
async fn documented_patterns() {
    for broken in [true, false] {
        let (provider, ledger) = (History::new(), Mutex::new(HashSet::new()));
        let faults = Faults::new().inject(At::point(Point::IdemFinish).nth(1), Fault::LoseWrite);
        let rg = redguard::testing::faulty(&Redguard::memory(), faults);
        rg.scope(async {
            for _delivery in 0..2 {
                let (done, replayed) = if broken {
                    track_replay(capture_then_record(&provider, &ledger, "pay-1")).await
                } else {
                    track_replay(record_then_capture(&provider, &ledger, "pay-1")).await
                };
                done?;
                assert!(!replayed, "the lost record is not replayed");
            }
            Ok::<_, redguard::Error>(())
        })
        .await
        .expect("deliveries");
        assert_eq!(provider.check_never_twice().is_err(), broken);
    }

    let faults = Faults::new().inject(At::point(Point::IdemFinish).nth(1), Fault::LoseWrite);
    let rg = redguard::testing::faulty(&Redguard::memory(), faults);
    rg.scope(async {
        for (call, replay) in [(1, false), (2, false), (3, true)] {
            let (receipt, replayed) = track_replay(submit_order(7, order("req-1"))).await;
            assert_eq!(receipt.expect("submitted").order_id, 1, "call {call}");
            assert_eq!(replayed, replay, "call {call}");
        }
    })
    .await;
}

#[test]
fn documented_patterns_pass_on_a_2_mib_thread() {
    on_stack(2 << 20, documented_patterns);
}

#[test]
fn documented_patterns_pass_on_a_1_mib_thread() {
    on_stack(1 << 20, documented_patterns);
}
