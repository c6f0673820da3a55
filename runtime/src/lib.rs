//! Distributed guards for async Rust services, backed by Redis.
//!
//! Three guards, each a one-line attribute on an `async fn` and a plain runtime API:
//!
//! - [`#[idempotent]`](macro@idempotent): the same business intent runs once; retries get the
//!   first result back ([guide](guide::idempotency)).
//! - [`#[dist_lock]`](macro@dist_lock): one holder at a time across every instance, with
//!   fencing tokens; [`lock()`] for sections narrower than a fn ([guide](guide::locks)).
//! - [`#[rate_limit]`](macro@rate_limit): at most N per period, decided atomically with
//!   Redis's own clock; [`limiter()`] without the attribute ([guide](guide::rate_limits)).
//!
//! ```
//! use redguard::{dist_lock, idempotent, rate_limit};
//! # #[derive(serde::Serialize)] struct SubmitOrder { request_id: String, sku: String, qty: u32 }
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Receipt { order_id: u64 }
//! # #[derive(Debug, redguard::Classify)] enum OrderError { #[classify(from)] Guard(redguard::Error) }
//!
//! #[rate_limit(key = "order:submit:user:{user_id}", rate = "5/s", burst = 10)]
//! #[idempotent(key = "{user_id}:{req.request_id}", expire = 600, payload = req)]
//! async fn submit_order(user_id: u64, req: SubmitOrder) -> Result<Receipt, OrderError> {
//!     reserve_stock(&req.sku, req.qty).await?;
//!     // ...
//! #   Ok(Receipt { order_id: 1 })
//! }
//!
//! #[dist_lock(key = "stock:{sku}", wait = "300ms")]
//! async fn reserve_stock(sku: &str, qty: u32) -> Result<(), OrderError> { /* ... */ Ok(()) }
//! ```
//!
//! Every key template is checked at compile time, every value from a request is validated
//! before it reaches Redis ([keys](guide::keys)), and every key written has a TTL.
//!
//! State lives in Redis (one node, a Cluster, or the master Sentinel names), or in an
//! in-process store for a single instance and for tests. Build a [`Redguard`] at startup and
//! install it ([configuration](guide::configuration)):
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
//! # The guide
//!
//! The [`guide`] has a page per topic: [idempotency](guide::idempotency), [keys](guide::keys),
//! [locks](guide::locks), [rate limits](guide::rate_limits),
//! [failure modes](guide::failures), [configuration and features](guide::configuration),
//! [HTTP layers](guide::http), [servers](guide::servers), [operations](guide::operations) and
//! [testing your own code](guide::testing).
//!
//! # Cargo features
//!
//! `tls`, `cluster` and `sentinel` are on by default; `http`, `tower`, `axum` and `anyhow`
//! add the web layers and integrations ([the table](guide::configuration#cargo-features)).
//! Items that need a feature are marked on docs.rs.

#![cfg_attr(not(test), warn(clippy::unwrap_used))]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
mod clock;
mod degrade;
mod env;
mod error;
pub mod guide;
pub mod handle;
#[cfg(feature = "http")]
pub mod http;
pub mod idempotency;
pub mod key;
pub mod lock;
pub mod rate;
mod scope;
mod state;
mod store;
mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokens;
mod trace;
mod values;

#[doc(hidden)]
pub mod __private;

// The root holds what users write; each module above also holds its limits and defaults
// (`redguard::lock::MAX_WAIT`).
pub use crate::clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use crate::error::{BackendError, Error, Result, StoreFailure};
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
