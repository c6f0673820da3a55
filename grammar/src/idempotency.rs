//! Bounds of an idempotency record.

use std::time::Duration;

/// Shortest an idempotency record may live: it must outlive a retry's round trip.
pub const MIN_EXPIRE: Duration = Duration::from_secs(1);
/// Longest an idempotency record may live: a record without a bound is a memory leak waiting
/// for a bad client.
pub const MAX_EXPIRE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Longest a duplicate may wait for the first execution's outcome: waiting is always bounded,
/// and a caller that must wait longer should retry later instead of holding a connection.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// Checks `expire`.
pub fn expire(expire: Duration) -> Result<(), String> {
    if expire < MIN_EXPIRE || expire > MAX_EXPIRE {
        return Err(format!(
            "an idempotency record must expire within 1 s to 7 days, got {expire:?}"
        ));
    }
    Ok(())
}

/// Checks a body's `timeout`.
pub fn timeout(timeout: Duration) -> Result<(), String> {
    if timeout.is_zero() {
        return Err("an idempotent body's timeout must be greater than zero".to_owned());
    }
    Ok(())
}

/// Checks a duplicate's `wait` (zero: do not wait).
pub fn wait(wait: Duration) -> Result<(), String> {
    if wait > MAX_WAIT {
        return Err(format!(
            "a duplicate waits at most {MAX_WAIT:?} for the first execution, got {wait:?}: \
             waiting is always bounded; a client that must wait longer retries later"
        ));
    }
    Ok(())
}
