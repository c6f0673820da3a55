//! The smallest redguard program.
//!
//! `cargo run -p quickstart` uses the in-memory store; with `REDGUARD_REDIS_URL` set (e.g.
//! `redis://127.0.0.1:6379`) the same code runs against Redis and holds across processes.

use std::time::Duration;

use redguard::{Classify, Error, ErrorClass, Redguard, idempotent, track_replay};
use serde::{Deserialize, Serialize};

#[derive(Debug)]
enum OrderError {
    OutOfStock,
    Guard(Error),
}

impl From<Error> for OrderError {
    fn from(err: Error) -> Self {
        OrderError::Guard(err)
    }
}

impl Classify for OrderError {
    fn class(&self) -> ErrorClass {
        match self {
            OrderError::OutOfStock => ErrorClass::Business,
            OrderError::Guard(err) => err.class(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    order_id: u64,
}

/// The same (user, request) pair places one order, however often the client retries.
#[idempotent(key = "{user_id}:{request_id}", expire = "10m")]
async fn submit_order(user_id: u64, request_id: &str) -> Result<Receipt, OrderError> {
    if request_id.starts_with("sold-out") {
        // A business error: the record becomes FAIL and a retry runs again.
        return Err(OrderError::OutOfStock);
    }
    println!("  placing the order for user {user_id} (this line prints once)");
    Ok(Receipt { order_id: 1001 })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rg = Redguard::from_env().await?.install()?;
    println!("redguard quickstart: store = {}", rg.kind());

    for attempt in 1..=3 {
        let (receipt, replayed) = track_replay(submit_order(42, "req-7f3a")).await;
        let receipt = receipt.map_err(|err| format!("{err:?}"))?;
        println!(
            "attempt {attempt}: order {} (replayed: {replayed})",
            receipt.order_id
        );
    }

    // Values from requests are validated before they reach the store.
    let hostile = submit_order(42, "req:*").await;
    println!("hostile key part: {hostile:?}");
    println!("sold out: {:?}", submit_order(42, "sold-out-1").await);

    // Token mode: a page fetches a token; the submit consumes it exactly once.
    let token = redguard::tokens()
        .issue("order-submit", Duration::from_secs(600))
        .await?;
    redguard::tokens().consume("order-submit", &token).await?;
    let again = redguard::tokens().consume("order-submit", &token).await;
    println!("second use of token {token}: {}", again.unwrap_err());
    Ok(())
}
