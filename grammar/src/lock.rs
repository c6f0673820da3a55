//! Bounds of a lock's settings.

use std::time::Duration;

/// Lease when none is given: how long a crashed holder blocks others.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Shortest lease: renewal every lease/3 must fit several store round trips.
pub const MIN_LEASE: Duration = Duration::from_secs(1);
/// Longest lease: a crashed holder must not block a key for longer.
pub const MAX_LEASE: Duration = Duration::from_secs(3600);
/// Longest `wait`: a lock is for short sections; a caller queueing longer is better told no.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// Longest `hold_at_least`.
pub const MAX_HOLD_AT_LEAST: Duration = Duration::from_secs(24 * 3600);

/// Checks `wait`.
pub fn wait(wait: Duration) -> Result<(), String> {
    if wait > MAX_WAIT {
        return Err(format!(
            "a lock's wait must be at most {MAX_WAIT:?}, got {wait:?}: waiting is always \
             bounded; if the section is busy for longer, skip it (`skip_if_held`) or retry later"
        ));
    }
    Ok(())
}

/// Checks `lease`.
pub fn lease(lease: Duration) -> Result<(), String> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(format!(
            "a lock's lease must be between {MIN_LEASE:?} and {MAX_LEASE:?}, got {lease:?}: it \
             is how long a crashed holder blocks the key, and it is renewed every lease/3 while \
             held"
        ));
    }
    Ok(())
}

/// Checks `hold_at_least`.
pub fn hold_at_least(hold: Duration) -> Result<(), String> {
    if hold > MAX_HOLD_AT_LEAST {
        return Err(format!(
            "a lock's hold_at_least must be at most {MAX_HOLD_AT_LEAST:?}, got {hold:?}"
        ));
    }
    Ok(())
}

/// Checks a semaphore's `permits`.
pub fn permits(permits: u64) -> Result<u32, String> {
    match u32::try_from(permits) {
        Ok(0) | Err(_) => Err(format!(
            "a semaphore needs 1 to {} permits, got {permits}",
            u32::MAX
        )),
        Ok(permits) => Ok(permits),
    }
}
