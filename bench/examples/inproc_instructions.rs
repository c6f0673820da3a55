//! One in-process check at a time, for counting its instructions: `keys` keys filled, then
//! `checks` checks of random ones among them inside [`measured`], the one function to count.
//!
//! ```text
//! cargo build --release -p redguard-bench --example inproc_instructions
//! valgrind --tool=callgrind --toggle-collect='*measured*' \
//!     target/release/examples/inproc_instructions ours 30000 60000
//! ```
//!
//! The total callgrind prints, divided by `checks`, is one check's instructions: `ours` is
//! the bench's in-process row (`bench/src/inproc.rs`), `governor` its peer.

use std::num::NonZeroU32;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use redguard::{Redguard, rate::Algorithm};

async fn ours(memory: &Redguard, i: u64) {
    let decision = redguard::limiter(redguard::key("r:{i}").part("i", &i))
        .scope("bench")
        .rate("1/min")
        .burst(1000)
        .algorithm(Algorithm::Gcra)
        .on(memory)
        .decide()
        .await
        .expect("memory check");
    assert!(decision.allowed);
}

fn theirs(limiter: &DefaultKeyedRateLimiter<String>, i: u64) {
    assert!(limiter.check_key(&format!("r:i={i}")).is_ok());
}

/// splitmix64, as the bench picks its random keys.
fn pick(n: u64, keys: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % keys
}

/// The bench's loop: one runtime, the checks awaited back to back.
#[inline(never)]
fn measured_ours(runtime: &tokio::runtime::Runtime, memory: &Redguard, keys: u64, checks: u64) {
    runtime.block_on(async {
        for n in 0..checks {
            ours(memory, pick(n, keys)).await;
        }
    });
}

#[inline(never)]
fn measured_governor(limiter: &DefaultKeyedRateLimiter<String>, keys: u64, checks: u64) {
    for n in 0..checks {
        theirs(limiter, pick(n, keys));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map_or("ours", String::as_str);
    let number = |i: usize, default: u64| {
        args.get(i)
            .map_or(default, |a| a.parse().expect("a number"))
    };
    let (keys, checks) = (number(2, 30_000), number(3, 60_000));
    if which == "governor" {
        let burst = NonZeroU32::new(1000).expect("not zero");
        let limiter = RateLimiter::keyed(Quota::per_minute(NonZeroU32::MIN).allow_burst(burst));
        (0..keys).for_each(|i| theirs(&limiter, i));
        measured_governor(&limiter, keys, checks);
    } else {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let memory = Redguard::memory();
        runtime.block_on(async {
            for i in 0..keys {
                ours(&memory, i).await;
            }
        });
        measured_ours(&runtime, &memory, keys, checks);
    }
    println!("{which}: {keys} keys, {checks} checks");
}
