//! The seam between guards and where their state lives.
//!
//! [`Store`] is a small set of *guard operations* — each one atomic, each one a single round
//! trip — not a list of Redis commands. Each guard declares its operations as a sub-trait in
//! its own file here ([`TokenOps`], [`IdemOps`], [`LockOps`], [`RateOps`], and [`AdminOps`] for the operator's
//! tools); [`Store`] is all of them
//! together.
//! [`RedisStore`] implements them as Lua scripts that read Redis's own clock;
//! [`MemoryStore`] implements the same semantics in-process. Both run the same conformance
//! suite (`tests/tests/conformance*.rs`), so a guard behaves the same on either, and the guards
//! never know which one is behind.

pub mod admin;
mod idem;
pub(crate) mod lock;
mod memory;
mod rate;
mod redis;
mod token;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;

pub use self::admin::AdminOps;
pub use self::idem::{
    Begin, Finish, IdemBegin, IdemFinish, IdemFinished, IdemOps, IdemStatus, Resolve, Resolved,
};
pub use self::lock::{
    Acquire, FAIR_REGISTRATION, FENCE_TTL, LockAcquire, LockOps, LockRelease, LockWatch, Release,
    WRITER_INTENT, rw_readers,
};
pub use self::memory::MemoryStore;
pub use self::rate::{RateCheck, RateMode, RateOps, RateOutcome};
pub use self::redis::RedisStore;
#[cfg(feature = "sentinel")]
pub(crate) use self::redis::{Auth as SentinelAuth, SentinelTarget};
pub(crate) use self::redis::{Conn, Existing, RedisTarget};
pub use self::token::{TokenOps, TokenOutcome};
pub use crate::error::StoreFailure;
pub use crate::values::Replicas;

/// Where guard state lives. Implemented by [`RedisStore`] and [`MemoryStore`].
///
/// Every operation is atomic with respect to every other operation on the same key, writes
/// only keys with a TTL, and is bounded in time (the Redis store by its per-call timeout).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use redguard::Redguard;
/// use redguard::store::StoreKind;
///
/// let rg = Redguard::memory();
/// assert_eq!(rg.store().kind(), StoreKind::Memory);
/// let now = rg.store().time().await?;
/// assert!(now.as_secs() > 1_700_000_000);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Store:
    TokenOps + IdemOps + LockOps + RateOps + AdminOps + Send + Sync + fmt::Debug + 'static
{
    /// Which implementation this is.
    fn kind(&self) -> StoreKind;

    /// The store's clock, as a duration since the Unix epoch. Guards that need time read it
    /// inside their own operation; this is for diagnostics and tests.
    async fn time(&self) -> Result<Duration>;

    /// The same store on connections of its own, for the guards whose writes wait for
    /// replicas ([`Replicas`]): Redis's `WAIT` blocks the connection that
    /// sent it, so on a shared one every other call would queue behind it. `None` (the
    /// default) when there is no connection to keep apart: use this store as it is.
    async fn twin(&self) -> Result<Option<std::sync::Arc<dyn Store>>> {
        Ok(None)
    }

    /// Whether an operator's reset of the rate limit at `key` reached this store after
    /// `since` (announced by [`AdminOps::admin_announce_reset`]); the local tier then forgets
    /// the key. `false` (the default) when the store has no such notifications.
    fn rate_reset_after(&self, _key: &crate::key::Key, _since: std::time::Instant) -> bool {
        false
    }

    /// Starts listening for [`rate_reset_after`](Store::rate_reset_after)'s notifications
    /// (the default: there are none).
    fn listen_rate_resets(&self) {}
}

/// Which [`Store`] implementation is behind a handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// Redis (single node).
    Redis,
    /// The in-process store.
    Memory,
}

impl StoreKind {
    /// `"redis"` or `"memory"`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Redis => "redis",
            StoreKind::Memory => "memory",
        }
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
