//! Bounds of an idempotency token.

use std::time::Duration;

/// Longest a token may live.
pub const MAX_TOKEN_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Checks a token's time to live.
pub fn ttl(ttl: Duration) -> Result<(), String> {
    if ttl < Duration::from_secs(1) || ttl > MAX_TOKEN_TTL {
        return Err(format!("a token must live 1 s to 7 days, got {ttl:?}"));
    }
    Ok(())
}
