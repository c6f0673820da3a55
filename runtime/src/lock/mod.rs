//! Distributed locks: owned, leased, renewed, fenced, released on every exit path.
//!
//! [`lock`](crate::lock()) (or [`Redguard::lock`]) starts a [`LockBuilder`]; [`LockBuilder::acquire`] returns
//! a [`LockGuard`], and [`LockBuilder::run`] runs a future under the lock (what
//! `#[dist_lock]` expands into). While a guard lives, a watchdog task renews its lease every
//! lease/3 (under `run`, started only once the first renewal falls due); the task is aborted
//! with the guard on every path (release, drop, panic, cancellation), and
//! [`Redguard::live_watchdogs`] counts the ones still alive.
//!
//! Waiting is woken by release notifications (Redis pub/sub on the key's own name, or an
//! in-process channel on the memory store) and falls back to polling, bounded by `wait`.
//!
//! Code map: `builder.rs` what a caller asks for (kind, wait, lease, …, with invalid
//! combinations unrepresentable); `acquire.rs` the acquire loop and what undoes an acquisition
//! whose outcome is unknown; `context.rs` the task context (fencing token, levels held, for
//! reentrancy); `ops.rs` the store operations of each kind; `guard.rs` the held lock and its
//! release; `watchdog.rs` the renewal task; `multi.rs` several keys at once.

mod acquire;
mod builder;
mod context;
mod guard;
mod multi;
mod ops;
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
mod storage;
mod watchdog;

pub(crate) use self::watchdog::Live;

use crate::handle::Redguard;
use crate::key::IntoKey;

pub use crate::values::LockKind;

pub use self::builder::{Exclusive, Fair, Kind, LockBuilder, Read, Reentrant, Semaphore, Write};
pub use self::context::fence;
pub use self::guard::LockGuard;
pub use self::multi::{MultiLockBuilder, MultiLockGuard, lock_all};
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub use self::storage::{FencedTransaction, MAX_FENCED_RESOURCE, begin_fenced};

pub use redguard_grammar::lock::{
    DEFAULT_LEASE, MAX_HOLD_AT_LEAST, MAX_LEASE, MAX_WAIT, MIN_LEASE,
};

/// How deep one task may re-enter a lock it holds.
pub const DEFAULT_MAX_DEPTH: u32 = 5;
/// Scope of locks taken through [`lock`](crate::lock()) when none is given: the entry point's name, as
/// for [`limiter`](crate::limiter()) and [`idempotency`](crate::idempotency()).
pub const DEFAULT_LOCK_SCOPE: &str = "lock";

/// What a holder does when its lock is lost while the guarded work runs (see
/// [`LockBuilder::on_lost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnLost {
    /// Cancel the guarded future and return [`Error::LockLost`](crate::Error::LockLost)
    /// (default).
    #[default]
    Cancel,
    /// Let the work finish and return its result; the loss is logged and counted.
    Continue,
}

impl Redguard {
    /// Starts a lock on this handle; see [`LockBuilder`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let guard = rg.lock("stock:SK1").acquire().await?;
    /// let again = rg.lock("stock:SK1").acquire().await;
    /// assert!(matches!(again, Err(redguard::Error::LockTimeout { .. })));
    /// drop(guard); // released in the background; `guard.release().await` waits for it
    /// # Ok(()) }
    /// ```
    pub fn lock(&self, key: impl IntoKey) -> LockBuilder {
        LockBuilder::new(Some(self.clone()), key.into_key())
    }
}
