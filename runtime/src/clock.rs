//! Time for the in-memory store.
//!
//! Redis brings its own clock (`TIME` inside scripts); the in-memory store asks a [`Clock`], so
//! tests of guarded code can move time forward instead of sleeping.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time, as a duration since the Unix epoch.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Duration;
}

/// The system clock; the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        // A clock before 1970 is a broken machine; treat it as the epoch rather than panic.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    }
}

/// A clock that only moves when told to. Clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use redguard::{clock::Clock, clock::ManualClock};
///
/// let clock = ManualClock::new();
/// let start = clock.now();
/// clock.advance(Duration::from_secs(30));
/// assert_eq!(clock.now() - start, Duration::from_secs(30));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock starting at the current system time.
    pub fn new() -> Self {
        Self::starting_at(SystemClock.now())
    }

    /// A clock starting at `since_epoch`.
    pub fn starting_at(since_epoch: Duration) -> Self {
        let micros = u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX);
        Self {
            micros: Arc::new(AtomicU64::new(micros)),
        }
    }

    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.micros
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by))
            })
            .ok();
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_micros(self.micros.load(Ordering::SeqCst))
    }
}
