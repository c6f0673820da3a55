//! The smallest redguard program.
//!
//! `cargo run -p quickstart` uses the in-memory store; with `REDGUARD_REDIS_URL` set (e.g.
//! `redis://127.0.0.1:6379`) the same code runs against Redis.

use std::time::Duration;

use redguard::{Error, Redguard};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let rg = Redguard::from_env().await?.install()?;
    println!("redguard quickstart: store = {}", rg.store().kind());

    // A page fetches a token before showing the order form...
    let token = redguard::tokens()
        .issue("order-submit", Duration::from_secs(600))
        .await?;
    println!("issued token {token}");

    // ...and the submit consumes it exactly once, however often the user clicks.
    for click in 1..=3 {
        match redguard::tokens().consume("order-submit", &token).await {
            Ok(()) => println!("click {click}: token consumed, the order runs"),
            Err(Error::TokenUsed) => println!("click {click}: duplicate submit refused"),
            Err(other) => return Err(other),
        }
    }

    // Values from requests are validated before they reach the store.
    let hostile = redguard::tokens().consume("order-submit", "x:*").await;
    println!(
        "malformed token: {}",
        hostile.map_or_else(|e| e.to_string(), |()| "ok".into())
    );
    Ok(())
}
