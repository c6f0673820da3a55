//! Distributed guards for async Rust services, backed by Redis.
//!
//! Three guards, each a one-line attribute on an `async fn` and a plain runtime API:
//!
//! - `#[idempotent]`: the same business intent runs once; retries get the first result back.
//! - `#[dist_lock]`: one holder at a time across every instance, with fencing tokens
//!   ([`lock()`] for sections narrower than a fn).
//! - `#[rate_limit]`: at most N per period, decided atomically with Redis's own clock.
//!
//! State lives behind the [`Store`](store::Store) seam: [`RedisStore`](store::RedisStore) for services running several
//! instances, [`MemoryStore`](store::MemoryStore) for a single instance and for tests. Build a [`Redguard`] at
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
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
mod clock;
mod degrade;
mod env;
mod error;
pub mod handle;
#[cfg(feature = "http")]
pub mod http;
pub mod idempotency;
pub mod key;
pub mod lock;
pub mod rate;
mod scope;
mod state;
pub mod store;
mod telemetry;
pub mod tokens;
mod trace;
mod values;

#[doc(hidden)]
pub mod __private;

// The root holds what users write; each module above also holds its limits and defaults
// (`redguard::lock::MAX_WAIT`), and `redguard::store` the seam for those who implement a store.
pub use crate::clock::{Clock, ManualClock, SystemClock};
pub use crate::error::{BackendError, Error, Result};
pub use crate::handle::{Builder, FailMode, Redguard, spawn};
pub use crate::idempotency::{
    Classify, Detached, ErrorClass, Idempotency, idempotency, track_replay,
};
pub use crate::key::{GuardKind, Key, KeyBody, KeyBuilder, KeyPart, KeyRule};
pub use crate::lock::{
    LockBuilder, LockGuard, LockKey, MultiLockBuilder, MultiLockGuard, OnLost, fence, lock,
    lock_all,
};
pub use crate::rate::{Limiter, RateLimits, limiter};
pub use crate::telemetry::{METRICS, Metric, MetricKind, describe_metrics};
pub use crate::tokens::{Tokens, tokens};
pub use crate::values::{Algorithm, Decision, IntoRate, Limit, LockKind, Rate, Replicas};

#[doc(inline)]
pub use redguard_macros::{Classify, dist_lock, idempotent, rate_limit};
