//! One process of a multi-process rate-limit run: drives a load against Redis and prints
//! the Redis time (µs) of every admitted call, one per line, then `rejected N` and
//! `errors N`.
//!
//! Usage: `rate_worker <redis-url> <Load::to_args()...>`

use redguard_tests::rate::{Load, drive};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Accuracy, not latency, is under test: on a machine busy with the rest of the suite a
    // call can exceed the default 250 ms and count as an error (seen in CI).
    let rg = redguard::Redguard::redis(&args[0])
        .timeout(std::time::Duration::from_secs(2))
        .connect()
        .await
        .expect("connect to redis");
    let load = Load::from_args(&args[1..]);
    let driven = drive(&rg, &load).await;
    let mut out = String::new();
    for at in &driven.admitted {
        out.push_str(&format!("{at}\n"));
    }
    out.push_str(&format!(
        "rejected {}\nerrors {}\n",
        driven.rejected, driven.errors
    ));
    print!("{out}");
}
