//! The store's circuit breaker: a connection known to be down fails at once instead of
//! waiting out every call's timeout.
//!
//! After [`TRIP_AFTER`] consecutive connection-level failures (refused, reset, dropped, timed
//! out; never an error reply such as `NOSCRIPT` or `CORRUPT`: the server answered) the
//! breaker opens: calls fail at once with [`BackendError::Failed`], which the guards degrade
//! on as on any store failure, while one call at a time, every [`PROBE_EVERY`], goes through
//! as the probe. The first call that reaches the server (a reply, error replies included)
//! closes it. An undo (`crate::undo`) always goes through: it must follow its operation on
//! the connection. A few atomics, no lock, no task.
//!
//! One breaker per store: on a Cluster, one node down opens it for every slot (the Cluster
//! client's own retries pace the rest). Through Sentinel, the follower finds the new master
//! over its own connections, which the breaker never sees; while no master is known calls go
//! through (they fail at once, or wait for a promotion in progress, as the connection
//! decides), and a master that moved (a new generation) closes the breaker at the next call,
//! so a failover is not slowed by it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::RedisError;

use crate::error::{BackendError, Error, StoreFailure};

/// Consecutive connection-level failures that open the breaker.
pub(crate) const TRIP_AFTER: u32 = 3;
/// How often, while open, one call goes through to find out whether the server is back.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(150);

/// `next_probe` while closed.
const CLOSED: u64 = 0;
/// `next_probe` while a probe is in flight.
const PROBING: u64 = u64::MAX;

#[derive(Debug)]
pub(crate) struct Breaker {
    base: Instant,
    /// Consecutive connection-level failures.
    failures: AtomicU32,
    /// [`CLOSED`], [`PROBING`], or when the next probe may go (ns since `base`, ≥ 1).
    next_probe: AtomicU64,
    /// The Sentinel master's generation when the breaker opened (0 elsewhere).
    generation: AtomicU64,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            base: Instant::now(),
            failures: AtomicU32::new(0),
            next_probe: AtomicU64::new(CLOSED),
            generation: AtomicU64::new(0),
        }
    }
}

/// A call the breaker let through; its outcome must be [`record`](Pass::record)ed. A probe
/// dropped unrecorded (its call cancelled) lets the next probe go after [`PROBE_EVERY`].
#[derive(Debug)]
pub(crate) struct Pass<'a> {
    breaker: &'a Breaker,
    probe: bool,
    /// An undo let through whatever the state: its failure is its operation's, not counted.
    forced: bool,
}

impl Breaker {
    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos())
            .unwrap_or(u64::MAX - 1)
            .max(1)
    }

    /// Whether the breaker is open (tests and health).
    #[cfg(test)]
    pub(crate) fn is_open(&self) -> bool {
        self.next_probe.load(Ordering::Acquire) != CLOSED
    }

    /// Lets a call `op` through, or fails it at once while the server is known down.
    /// `generation` is the Sentinel master's (`None` elsewhere): a new master closes the
    /// breaker, and while none is known calls go through (see [`Conn`](super::Conn)).
    pub(crate) fn pass(
        &self,
        op: &'static str,
        generation: Option<u64>,
    ) -> Result<Pass<'_>, Error> {
        let next = self.next_probe.load(Ordering::Acquire);
        if next == CLOSED {
            return Ok(Pass {
                breaker: self,
                probe: false,
                forced: false,
            });
        }
        match generation {
            // Through Sentinel with no master known: the connection fails at once by itself
            // while the sentinels are asked, or waits (within the timeout) for a promotion in
            // progress, which must not be refused.
            Some(0) => return Ok(self.force_counted()),
            // A new master: what was known of the old one says nothing of it.
            Some(generation) if generation != self.generation.load(Ordering::Relaxed) => {
                self.close();
                return Ok(self.force_counted());
            }
            _ => {}
        }
        if next != PROBING
            && self.now() >= next
            && self
                .next_probe
                .compare_exchange(next, PROBING, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            return Ok(Pass {
                breaker: self,
                probe: true,
                forced: false,
            });
        }
        metrics::counter!("redguard_store_breaker_total", "event" => "refused").increment(1);
        Err(BackendError::Failed {
            op,
            source: StoreFailure::new(
                "Redis is unreachable (the last calls failed to connect or timed out); \
                 failing at once while one call at a time checks whether it is back",
            ),
        }
        .into())
    }

    fn force_counted(&self) -> Pass<'_> {
        Pass {
            breaker: self,
            probe: false,
            forced: false,
        }
    }

    /// Lets a call through whatever the state (an undo, which must follow its operation on
    /// the connection: a paused Redis runs both when it resumes); only its success counts.
    pub(crate) fn force(&self) -> Pass<'_> {
        Pass {
            breaker: self,
            probe: false,
            forced: true,
        }
    }

    fn close(&self) {
        // Every answered call comes here: read before writing, so the closed breaker's cache
        // line stays shared between the threads instead of moving at every call.
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.next_probe.load(Ordering::Acquire) != CLOSED
            && self.next_probe.swap(CLOSED, Ordering::AcqRel) != CLOSED
        {
            metrics::counter!("redguard_store_breaker_total", "event" => "closed").increment(1);
            tracing::info!("redguard: Redis answers again; store calls go through");
        }
    }

    fn open(&self, generation: Option<u64>) {
        self.generation
            .store(generation.unwrap_or(0), Ordering::Relaxed);
        let next = self.now().saturating_add(nanos(PROBE_EVERY));
        if self
            .next_probe
            .compare_exchange(CLOSED, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            metrics::counter!("redguard_store_breaker_total", "event" => "opened").increment(1);
            tracing::warn!(
                failures = TRIP_AFTER,
                "redguard: Redis is unreachable; store calls fail at once until it answers"
            );
        }
    }

    /// After a failed probe, the next one goes after [`PROBE_EVERY`].
    fn reschedule(&self) {
        let next = self.now().saturating_add(nanos(PROBE_EVERY));
        let _ = self.next_probe.compare_exchange(
            PROBING,
            next.min(PROBING - 1),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }
}

impl Pass<'_> {
    /// Counts the call's outcome: `reached` when the server answered (an error reply
    /// included). `generation` as for [`Breaker::pass`].
    pub(crate) fn record(mut self, reached: bool, generation: Option<u64>) {
        let breaker = self.breaker;
        if reached {
            breaker.close();
        } else if self.probe {
            breaker.reschedule();
        } else if !self.forced && breaker.failures.fetch_add(1, Ordering::Relaxed) + 1 >= TRIP_AFTER
        {
            breaker.open(generation);
        }
        self.probe = false;
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.breaker.reschedule();
        }
    }
}

/// Whether `err` says the server was not reached (or did not answer in time), as opposed to
/// an error reply.
pub(crate) fn unreached(err: &RedisError) -> bool {
    err.is_timeout()
        || err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_probes_one_at_a_time_and_closes_on_an_answer() {
        let b = Breaker::default();
        for _ in 0..TRIP_AFTER - 1 {
            b.pass("t", None).unwrap().record(false, None);
        }
        // An answer in between resets the count.
        b.pass("t", None).unwrap().record(true, None);
        for _ in 0..TRIP_AFTER {
            b.pass("t", None).unwrap().record(false, None);
        }
        assert!(b.is_open());
        assert!(b.pass("t", None).is_err(), "fails at once");
        // Once the probe interval passed: one probe, the others still fail at once.
        b.next_probe.store(1, Ordering::Release);
        let probe = b.pass("t", None).unwrap();
        assert!(b.pass("t", None).is_err());
        probe.record(false, None);
        assert!(
            b.pass("t", None).is_err(),
            "the next probe waits its interval"
        );
        // A probe dropped unrecorded gives the slot back after the interval.
        b.next_probe.store(1, Ordering::Release);
        drop(b.pass("t", None).unwrap());
        assert!(b.is_open());
        b.next_probe.store(1, Ordering::Release);
        b.pass("t", None).unwrap().record(true, None);
        assert!(!b.is_open());
        assert!(b.pass("t", None).is_ok());
    }

    #[test]
    fn a_new_sentinel_master_closes_it_and_a_switch_is_not_refused() {
        let b = Breaker::default();
        for _ in 0..TRIP_AFTER {
            b.pass("t", Some(4)).unwrap().record(false, Some(4));
        }
        assert!(b.pass("t", Some(4)).is_err());
        // No master known (a promotion in progress): through, the breaker still open.
        b.pass("t", Some(0)).unwrap().record(false, Some(0));
        assert!(b.is_open());
        assert!(b.pass("t", Some(5)).is_ok());
        assert!(!b.is_open());
    }
}
