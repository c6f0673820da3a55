//! Distributed guards for async Rust services, backed by Redis.
//!
//! Three guards, each a one-line attribute on an `async fn` and a plain runtime API:
//!
//! - `#[idempotent]`: the same business intent runs once; retries get the first result back.
//! - `#[dist_lock]`: one holder at a time across every instance, with fencing tokens
//!   ([`lock()`] for sections narrower than a fn).
//! - `#[rate_limit]`: at most N per period, decided atomically with Redis's own clock.
//!
//! State lives behind the [`Store`] seam: [`RedisStore`] for services running several
//! instances, [`MemoryStore`] for a single instance and for tests. Build a [`Redguard`] at
//! startup and install it:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
//! use std::time::Duration;
//!
//! // REDGUARD_REDIS_URL set → Redis; unset → in-memory.
//! redguard::Redguard::from_env().await?.install()?;
//!
//! let token = redguard::tokens().issue("order-submit", Duration::from_secs(600)).await?;
//! redguard::tokens().consume("order-submit", &token).await?;
//! # Ok(()) }
//! ```
//!
//! Keys are built from templates such as `"stock:{sku}"`; every value rendered into a key is
//! validated first (see [`KeyPart`] and [`KeyBuilder`]), and every key written has a TTL.

#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod clock;
mod degrade;
mod error;
mod handle;
mod idempotency;
mod key;
pub mod lock;
mod rate;
mod scope;
pub mod store;
mod tokens;

#[doc(hidden)]
pub mod __private;

pub use crate::clock::{Clock, ManualClock, SystemClock};
pub use crate::error::{BackendError, Error, Result};
pub use crate::handle::{
    Builder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, DEFAULT_TIMEOUT, FailMode, Redguard,
};
pub use crate::idempotency::{
    Classify, Detached, ErrorClass, Idempotency, MAX_EXPIRE, MIN_EXPIRE, idempotency, track_replay,
};
pub use crate::key::{
    GuardKind, Key, KeyBody, KeyBuilder, KeyPart, KeyRule, MAX_KEY_LEN, MAX_PART_LEN, MAX_SCOPE_LEN,
};
pub use crate::lock::{
    LockBuilder, LockGuard, LockKey, MultiLockBuilder, MultiLockGuard, OnLost, fence, lock,
    lock_all,
};
pub use crate::rate::{
    Algorithm, Decision, IntoRate, Limit, Limiter, MAX_RATE_COUNT, MAX_RATE_PERIOD,
    MAX_SLIDING_WINDOW_COUNT, Rate, RateLimits, limiter,
};
pub use crate::store::{
    FAIR_REGISTRATION, FENCE_TTL, LockAcquire, LockOps, LockRelease, LockWatch, MemoryStore,
    RateCheck, RateMode, RateOps, RateOutcome, RedisStore, Store, StoreKind, TokenOps,
    TokenOutcome, WRITER_INTENT, rw_readers,
};
pub use crate::tokens::{MAX_TOKEN_TTL, Tokens, tokens};

#[doc(inline)]
pub use redguard_macros::{Classify, dist_lock, idempotent, rate_limit};
