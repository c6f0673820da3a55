//! Bounds of a guard's replica confirmation (`replicas = n`, `replicas_timeout = ".."`).

use std::time::Duration;

/// Most replicas a write may wait for: more is a configuration mistake, not a topology.
pub const MAX_REPLICAS: u64 = 16;
/// How long `WAIT` waits when no `replicas_timeout` is given: a replica on the same network
/// acknowledges within a millisecond or two; the rest is room for a busy one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// Longest `replicas_timeout`: it has to fit in the store's per-call timeout, which is short.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks how many replicas must confirm a write.
pub fn count(count: u64) -> Result<u32, String> {
    if count == 0 || count > MAX_REPLICAS {
        return Err(format!(
            "replicas must be 1 to {MAX_REPLICAS}, got {count}: it is how many replicas must \
             confirm each write (leave it out to not wait for any)"
        ));
    }
    Ok(u32::try_from(count).unwrap_or(u32::MAX))
}

/// Checks how long to wait for the replicas (`WAIT`'s timeout; 0 would wait forever).
pub fn timeout(timeout: Duration) -> Result<(), String> {
    if timeout < Duration::from_millis(1) || timeout > MAX_TIMEOUT {
        return Err(format!(
            "replicas_timeout must be 1ms to {MAX_TIMEOUT:?}, got {timeout:?}; it must also be \
             at most half the store's call timeout (250ms by default)"
        ));
    }
    Ok(())
}
