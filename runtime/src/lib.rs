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
//! The three guards share one shape: an entry point on the current handle ([`lock()`],
//! [`limiter()`], [`idempotency()`]) or a method of the same name on a [`Redguard`], taking a
//! key from [`key()`] (`redguard::key("stock:{sku}").part("sku", &sku)`), with `.scope(..)`,
//! `.on(&rg)` and `run(body)`. Every value rendered into a key is validated first (see
//! [`key::KeyPart`]), and every key written has a TTL.
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
pub mod clock;
mod degrade;
mod env;
mod error;
pub mod guide;
pub mod handle;
// Always declared (empty without `http`), so a missing `tower` or `axum` item is reported as
// one "gated behind the feature" error naming the feature, not `http` first and then `tower`.
pub mod http;
pub mod idempotency;
pub mod key;
pub mod lock;
pub mod rate;
mod scope;
mod state;
mod store;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokens;
mod trace;
mod undo;
mod values;

#[doc(hidden)]
pub mod __private;

// The root holds what users write; each guard's types, limits and defaults live in its module
// (`redguard::lock::MAX_WAIT`), one path each.
pub use crate::error::{BackendError, Error, Result, StoreFailure};
pub use crate::handle::{Redguard, spawn};
pub use crate::idempotency::{Classify, ErrorClass};
pub use crate::values::Decision;

#[doc(inline)]
pub use redguard_macros::{Classify, dist_lock, idempotent, rate_limit};

use crate::key::IntoKey;

/// Starts a key from `template`: literal text and `{name}` placeholders, each filled by
/// [`part`](key::KeyBuilder::part) with a value checked as it is rendered. Every guard takes
/// it as is (see [`key::IntoKey`]); a placeholder left unfilled, or a `.part` naming
/// none, is [`Error::Config`] when the guard runs.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// let rg = redguard::Redguard::memory();
/// let sku = "SK-2024.05";
/// let guard = rg.lock(redguard::key("stock:{sku}").part("sku", sku)).acquire().await?;
/// guard.release().await?;
///
/// // Values come from requests, so each is checked: `:` would let two keys collide.
/// let err = redguard::key("user:{id}").part("id", "a:b").finish().unwrap_err();
/// assert!(matches!(err, redguard::Error::InvalidKey { .. }));
/// # Ok(()) }
/// ```
pub fn key(template: &str) -> key::KeyBuilder {
    key::KeyBuilder::template(template)
}

/// Starts a lock on `key` on the current handle (scoped or installed, looked up when it is
/// taken); [`Redguard::lock`] on a given one. See [`lock::LockBuilder`]:
/// [`run`](lock::LockBuilder::run) acquires, runs a body and releases;
/// [`acquire`](lock::LockBuilder::acquire) and [`try_acquire`](lock::LockBuilder::try_acquire)
/// hand out the guard.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use std::time::Duration;
/// # redguard::Redguard::memory().scope(async {
/// let sku = "SK-1";
/// let guard = redguard::lock(redguard::key("stock:{sku}").part("sku", sku))
///     .wait(Duration::from_millis(300))
///     .acquire()
///     .await?;
/// // ... the few lines that need exclusion, passing guard.fence() to storage ...
/// guard.release().await?;
/// # Ok(()) }).await }
/// ```
pub fn lock(key: impl IntoKey) -> lock::LockBuilder {
    lock::LockBuilder::new(None, key.into_key())
}

/// Starts a rate limit on `key` on the current handle; [`Redguard::limiter`] on a given one.
/// See [`rate::Limiter`]: [`run`](rate::Limiter::run) and [`check`](rate::Limiter::check)
/// enforce the limit (a rejection is `Err(`[`Error::RateLimited`]`)`), while
/// [`decide`](rate::Limiter::decide) answers `Ok` either way.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// # redguard::Redguard::memory().scope(async {
/// use redguard::rate::{Algorithm, Rate};
///
/// let ip = "203.0.113.9";
/// let login = redguard::limiter(redguard::key("login:ip:{ip}").part("ip", ip))
///     .rate(Rate::per_minute(10))
///     .burst(3)
///     .algorithm(Algorithm::Gcra);
/// for _ in 0..3 {
///     login.check().await?; // a rejection is `Err(Error::RateLimited)`: `?` limits
/// }
/// assert!(matches!(login.check().await, Err(redguard::Error::RateLimited(_))));
/// // Looking does not count:
/// assert!(!login.peek().await?.allowed);
/// // `decide` answers `Ok` either way: a rejection is `allowed == false`, to be looked at.
/// let d = login.decide().await?;
/// assert!(!d.allowed);
/// # Ok(()) }).await }
/// ```
pub fn limiter(key: impl IntoKey) -> rate::Limiter {
    rate::Limiter::new(key.into_key(), rate::DEFAULT_LIMITER_SCOPE.into())
}

/// Starts an idempotent execution of the intent `key` on the current handle;
/// [`Redguard::idempotency`] on a given one. See [`idempotency::Idempotency`]:
/// [`run`](idempotency::Idempotency::run) begins, runs the body once per intent and records
/// its outcome.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// # redguard::Redguard::memory().scope(async {
/// let charged = redguard::idempotency(redguard::key("charge:{id}").part("id", &7u64))
///     .scope("payments")
///     .run(async { Ok::<_, redguard::Error>(1999) })
///     .await?;
/// assert_eq!(charged, 1999);
/// # Ok(()) }).await }
/// ```
pub fn idempotency(key: impl IntoKey) -> idempotency::Idempotency {
    idempotency::Idempotency::parts(
        idempotency::DEFAULT_IDEMPOTENCY_SCOPE.to_owned(),
        Some(key.into_key()),
    )
}

/// Issues and consumes idempotency tokens on the current handle; see [`tokens::Tokens`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// # use std::time::Duration;
/// # redguard::Redguard::memory().scope(async {
/// let token = redguard::tokens().issue("order-submit", Duration::from_secs(600)).await?;
/// redguard::tokens().consume("order-submit", &token).await?;
/// let again = redguard::tokens().consume("order-submit", &token).await;
/// assert!(matches!(again, Err(redguard::Error::TokenUsed)));
/// # Ok(()) }).await }
/// ```
pub fn tokens() -> tokens::Tokens {
    tokens::Tokens::current()
}
