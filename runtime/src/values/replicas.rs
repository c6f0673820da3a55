//! How many replicas must confirm a guard's write before the guard proceeds.

// Public for the store seam, which only redguard's own tests reach (feature `test-util`).
#![cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]

use std::time::Duration;

use crate::error::{Error, Result};

/// A write confirmed by `count` replicas within `timeout`: Redis's `WAIT count timeout`, sent
/// right after the write on the same connection, to the node that took it.
///
/// Redis replicates asynchronously: a master that fails right after acknowledging a write can
/// be replaced by a replica that never received it. With `Replicas`, a lock acquisition, an
/// idempotency record's PROCESSING and SUCCESS, and a token issue count only once `count`
/// replicas have them. See [`LockBuilder::replicas`](crate::lock::LockBuilder::replicas),
/// [`Idempotency::replicas`](crate::idempotency::Idempotency::replicas) and
/// [`Tokens::replicas`](crate::tokens::Tokens::replicas) for what each guard does when too few confirm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replicas {
    count: u32,
    timeout: Duration,
}

impl Replicas {
    /// `count` replicas (1 to 16) within `timeout` (1 ms to 10 s, and at most half the
    /// store's call timeout, checked at the call); [`Error::Config`] otherwise.
    pub fn new(count: u32, timeout: Duration) -> Result<Self> {
        let count = redguard_grammar::replicas::count(count.into()).map_err(Error::Config)?;
        redguard_grammar::replicas::timeout(timeout).map_err(Error::Config)?;
        Ok(Replicas { count, timeout })
    }

    /// How many replicas must confirm.
    pub fn count(self) -> u32 {
        self.count
    }

    /// How long `WAIT` waits for them.
    pub fn timeout(self) -> Duration {
        self.timeout
    }
}
