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
//! The three guards share one shape: an entry point on the current handle ([`lock()`],
//! [`limiter()`], [`idempotency()`]) or a method of the same name on a [`Redguard`], taking a
//! key from [`key()`] (`redguard::key("stock:{sku}").part("sku", &sku)`), with `.scope(..)`,
//! `.on(&rg)` and `run(body)`. Every value rendered into a key is validated first (see
//! [`key::KeyPart`]), and every key written has a TTL.

#![cfg_attr(not(test), warn(clippy::unwrap_used))]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
pub mod clock;
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
pub mod telemetry;
pub mod tokens;
mod trace;
mod undo;
mod values;

#[doc(hidden)]
pub mod __private;

// The root holds what users write; each guard's types, limits and defaults live in its module
// (`redguard::lock::MAX_WAIT`), one path each.
pub use crate::error::{BackendError, Error, Result};
pub use crate::handle::{Redguard, spawn};
pub use crate::idempotency::{Classify, ErrorClass};
pub use crate::values::Decision;

#[doc(inline)]
pub use redguard_macros::{Classify, dist_lock, idempotent, rate_limit};

use crate::key::IntoKey;

/// Starts a key from `template`: literal text and `{name}` placeholders, each filled by
/// [`part`](key::KeyBuilder::part) with a value checked as it is rendered. Every guard takes
/// it as is (see [`IntoKey`](key::IntoKey)); a placeholder left unfilled, or a `.part` naming
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
