//! [`Store`] in process memory: the embedded default for a single instance and for users'
//! own tests.
//!
//! Each guard keeps its entries in its own [`Table`] behind its own mutex (key spaces of the
//! guards never overlap), and implements its operations in its own file here.
//!
//! There are no replicas: a write asked to be confirmed by [`Replicas`](crate::store::Replicas)
//! counts as confirmed, as it is as durable as it will ever be (and code configured for a
//! replicated Redis runs unchanged in its tests).

mod admin;
mod idem;
mod lock;
mod rate;
mod table;
mod token;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use self::table::Table;
use super::lock::Waiters;
use super::{Store, StoreKind};
use crate::clock::{Clock, SystemClock};
use crate::error::Result;

/// The in-process [`Store`]. Safe for one instance only: nothing is shared between processes.
///
/// Runs on the system clock, or on a [`ManualClock`](crate::clock::ManualClock) that tests advance:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use std::time::Duration;
/// use redguard::{clock::ManualClock, Redguard};
///
/// let clock = ManualClock::new();
/// let rg = Redguard::memory_builder().clock(clock.clone()).connect().await?;
/// let token = rg.tokens().issue("checkout", Duration::from_secs(60)).await?;
/// clock.advance(Duration::from_secs(61));
/// let expired = rg.tokens().consume("checkout", &token).await;
/// assert!(matches!(expired, Err(redguard::Error::TokenUnknown)));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    tables: Arc<Tables>,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Default)]
struct Tables {
    tokens: Mutex<Table<token::TokenState>>,
    idem: Mutex<Table<idem::Record>>,
    rates: Mutex<Table<rate::RateState>>,
    /// Penalty ends (µs since the epoch) of rate-limit keys under `block`.
    rate_blocks: Mutex<Table<f64>>,
    locks: Mutex<Table<lock::LockState>>,
    semaphores: Mutex<Table<lock::Holders>>,
    fair_queues: Mutex<Table<lock::FairQueue>>,
    /// Fencing counters of locks, kept apart so they outlive the locks.
    fences: Mutex<Table<u64>>,
    lock_waiters: Waiters,
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// An empty store on `clock`.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self {
            tables: Arc::default(),
            clock: Arc::new(clock),
        }
    }

    /// Locks `table` after dropping what has expired; returns the time used.
    fn lock<'a, V>(&self, table: &'a Mutex<Table<V>>) -> (MutexGuard<'a, Table<V>>, Duration) {
        let now = self.clock.now();
        // Every mutation is a single map operation, so a panic elsewhere while the lock was
        // held cannot have left an entry half-written: a poisoned table is still consistent.
        let mut table = table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        table.sweep(now);
        (table, now)
    }

    /// Number of live entries across all guards; for tests and diagnostics.
    pub fn len(&self) -> usize {
        self.lock(&self.tables.tokens).0.len()
            + self.lock(&self.tables.idem).0.len()
            + self.lock(&self.tables.rates).0.len()
            + self.lock(&self.tables.rate_blocks).0.len()
            + self.lock(&self.tables.locks).0.len()
            + self.lock(&self.tables.semaphores).0.len()
            + self.lock(&self.tables.fair_queues).0.len()
            + self.lock(&self.tables.fences).0.len()
    }

    /// True when no entry is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Memory
    }

    async fn time(&self) -> Result<Duration> {
        Ok(self.clock.now())
    }
}
