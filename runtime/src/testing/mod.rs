//! A test kit for code that uses redguard (feature `testing`, as a dev-dependency): faults on
//! demand, checkers over what the guarded bodies did, a harness that explores fault
//! schedules, and a pass-through handle.
//!
//! - [`faulty`] puts a handle's store (memory or Redis) behind a [`Faults`] schedule: stalls,
//!   errors, lost replies, writes applied twice, acknowledged writes lost, keys expiring early,
//!   at named [`Point`]s, picked by call number, key pattern or a seeded draw.
//! - [`History`] records each guarded body's start, end, outcome and fencing token; its
//!   checkers (`assert_never_twice`, `assert_never_together`, `assert_at_most`,
//!   `assert_fences_increase`) fail with the fewest calls that break the property.
//! - [`Explore`] runs a test body many times, each on a fresh in-memory store with its own
//!   seeded schedule, and prints the seed and schedule of the first run that fails.
//! - [`passthrough`] is a handle whose guards let every call through, for tests and local
//!   runs of code that is not about the guards.
//!
//! ```toml
//! [dev-dependencies]
//! redguard = { version = "0.1", features = ["testing"] }
//! ```
//!
//! A consumer that acks a payment before its outcome is recorded charges twice when the
//! record is lost (a failover after the write was acknowledged):
//!
//! ```
//! use redguard::testing::{At, Fault, Faults, History, Point};
//! use redguard::{Redguard, idempotent};
//!
//! #[idempotent(key = "{payment}", expire = 60)]
//! async fn charge(history: &History, payment: &str) -> redguard::Result<()> {
//!     history.effect(payment); // the charge reaches the payment provider
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
//! let history = History::new();
//! let faults = Faults::new().inject(At::point(Point::IdemFinish).nth(1), Fault::LoseWrite);
//! let rg = redguard::testing::faulty(&Redguard::memory(), faults.clone());
//! rg.scope(async {
//!     charge(&history, "pay-1").await?;
//!     charge(&history, "pay-1").await // the redelivery: its record was lost
//! })
//! .await?;
//! assert_eq!(faults.injected().len(), 1);
//! let twice = history.check_never_twice().unwrap_err();
//! assert_eq!(twice.calls.len(), 2);
//! # Ok(()) }
//! ```
//!
//! Faults never reach a handle unless a test builds it here: nothing in the environment or
//! in [`Redguard::from_env`] turns them on.

mod explore;
mod faults;
mod history;
mod pass;

pub use self::explore::{Explore, Explored, Failure, Trial};
pub use self::faults::{At, Fault, Faults, Injected, Point};
pub use self::history::{Call, CallKind, History, Outcome, Violation};

use crate::handle::Redguard;

/// `handle`'s store (memory or Redis) behind `faults`, with `handle`'s settings; guard state
/// (local queues, the local rate tier) is the new handle's own. Keep a clone of `faults` to
/// read what [struck](Faults::injected).
///
/// ```
/// use redguard::Redguard;
/// use redguard::testing::{At, Fault, Faults};
///
/// let faults = Faults::new().inject(At::any().nth(1), Fault::Fail);
/// let rg = redguard::testing::faulty(&Redguard::memory(), faults);
/// # let _ = rg;
/// ```
pub fn faulty(handle: &Redguard, faults: Faults) -> Redguard {
    faults::FaultyStore::wrap(handle, faults)
}

/// A handle whose guards let every call through: idempotent bodies always run (nothing is
/// replayed), locks are granted at once with increasing fencing tokens, rate limits admit,
/// tokens are accepted. For tests and local runs only (it is behind feature `testing`, and no
/// setting or environment variable selects it).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use redguard::idempotent;
///
/// #[idempotent(key = "{id}", expire = 60)]
/// async fn once(id: u64) -> redguard::Result<u64> { Ok(id) }
///
/// let rg = redguard::testing::passthrough();
/// rg.scope(async {
///     once(1).await?;
///     once(1).await // runs again: nothing was recorded
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub fn passthrough() -> Redguard {
    pass::PassStore::handle()
}
