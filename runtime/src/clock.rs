//! Time for the in-memory store.
//!
//! Redis brings its own clock (`TIME` inside scripts); the in-memory store asks a [`Clock`], so
//! tests of guarded code can move time forward instead of sleeping: [`TokioClock`] (the
//! default) with Tokio's paused time, or a [`ManualClock`] they move themselves.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time, as a duration since the Unix epoch.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Duration;
}

/// The system clock, as it reads: it may step back or jump when the machine's time is set.
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

/// Wall-clock time that moves as Tokio's clock does: the system time when it was made, plus
/// the [`tokio::time::Instant`] elapsed since. The in-memory store's default.
///
/// It never steps back (Tokio's clock is monotonic), and under Tokio's paused time
/// (`#[tokio::test(start_paused = true)]`, with tokio's `test-util` feature) it moves only
/// with `tokio::time::advance` or the runtime's auto-advance, the same time the guards'
/// waits, lease renewals and timeouts run on: a test drives a record's expiry, a lock's lease
/// and a rate window exactly, without a real second passing.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::Duration;
/// use redguard::clock::{Clock, TokioClock};
///
/// let clock = TokioClock::new();
/// let start = clock.now();
/// tokio::time::advance(Duration::from_secs(600)).await;
/// assert_eq!(clock.now() - start, Duration::from_secs(600));
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    wall: Duration,
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock reading the system time now, and moving with Tokio's clock from here.
    pub fn new() -> Self {
        TokioClock {
            wall: SystemClock.now(),
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        // Outside a runtime Tokio's clock is the system's monotonic one; a paused runtime's
        // starts where that was, so the clock made outside still only moves forward in it.
        self.wall + tokio::time::Instant::now().saturating_duration_since(self.origin)
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
