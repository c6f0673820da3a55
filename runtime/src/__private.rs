//! Everything macro expansions name. Not a public API: it changes with the macros, which are
//! pinned to this crate's exact version.

pub use crate::handle::Redguard;
pub use crate::key::{KeyBuilder, KeyPart};

pub use std::sync::OnceLock;

/// The default scope of the fn whose body declares the fn item whose type name is `path`:
/// module path, impl type and trait, and name (see `scope.rs`). Computed once per fn.
#[inline]
pub fn default_scope(cell: &'static OnceLock<Box<str>>, path: &'static str) -> &'static str {
    crate::scope::default_scope(cell, path)
}

/// Identity on a `KeyPart`: expansions call it at each placeholder's span, so a value of the
/// wrong type is reported there.
#[inline(always)]
pub fn key_part<T: KeyPart + ?Sized>(value: &T) -> &T {
    value
}

/// What a guarded fn must return: a `Result`, whose error type [`GuardError`] checks.
#[diagnostic::on_unimplemented(
    message = "a guarded fn must return `Result<T, E>` where `E: From<redguard::Error>`, \
               not `{Self}`",
    label = "a guard returns its refusals (in progress, rate limited, lock timeout) through \
             this type",
    note = "add `impl From<redguard::Error> for YourError`, or return `redguard::Result<T>`"
)]
pub trait GuardedReturn {
    /// The Ok type.
    type Ok;
    /// The error type.
    type Err;
}

impl<T, E> GuardedReturn for Result<T, E> {
    type Ok = T;
    type Err = E;
}

/// A guarded fn's error type: it carries a guard's refusals. A trait of our own (not a bare
/// `From` bound) so the missing impl is reported with this message, once: every wrapper's
/// bound is this one at the return type's span, and rustc reports a predicate once per span.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot carry a guard's refusal: a guarded fn's error type needs \
               `impl From<redguard::Error> for {Self}`",
    label = "a guard returns its refusals (in progress, rate limited, lock timeout) through \
             this type's error",
    note = "with `#[derive(redguard::Classify)]`, mark the variant that holds the guard's \
            error: `#[classify(from)] Guard(redguard::Error)`; or write \
            `impl From<redguard::Error> for {Self}`; or return `redguard::Result<T>`"
)]
pub trait GuardError: From<crate::Error> {}

impl<E: From<crate::Error>> GuardError for E {}

/// Expansions call this first, spanned at the return type.
#[inline(always)]
pub fn assert_guarded_return<R: GuardedReturn>()
where
    R::Err: GuardError,
{
}

/// `#[idempotent]`: the guard for one call. `key` is `None` in token-only mode.
pub fn idempotency(
    scope: &str,
    key: Option<crate::Result<crate::key::KeyBody>>,
) -> crate::idempotency::Idempotency {
    crate::idempotency::Idempotency::parts(scope.to_owned(), key)
}

/// `#[idempotent(token = .., scene = ..)]`: the token rendered from its template.
pub fn idempotency_token(
    guard: crate::idempotency::Idempotency,
    scene: &str,
    token: crate::Result<crate::key::KeyBody>,
) -> crate::idempotency::Idempotency {
    guard.token_body(scene, token)
}

/// What `#[idempotent]` needs of the fn's Ok type: a value it can store and replay. One trait
/// (not a bare `Serialize + DeserializeOwned` bound), and its impl not recommended, so a type
/// with neither is reported once, with this message: the check and every wrapper bound this
/// one trait at the return type's span, and rustc reports a predicate once per span.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` stores the Ok value to replay it on retries, so it must be \
               `Serialize + DeserializeOwned`; `{Self}` is not",
    label = "the Ok type of this `Result`, `{Self}`, must implement `serde::Serialize` and \
             `serde::Deserialize`",
    note = "derive `Serialize, Deserialize` on `{Self}`, or return an id and load the \
            rest from your database"
)]
pub trait Replayable: serde::Serialize + serde::de::DeserializeOwned {}

#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned> Replayable for T {}

/// Expansions of `#[idempotent]` call this, spanned at the return type.
#[inline(always)]
pub fn assert_replayable<R: GuardedReturn>()
where
    R::Ok: Replayable,
{
}

/// What `#[idempotent]` needs of the fn's error type: a classification of its errors.
/// [`Classify`](crate::Classify)'s own message says what to add.
#[inline(always)]
pub fn assert_classified<R: GuardedReturn>()
where
    R::Err: crate::Classify,
{
}

/// An `#[idempotent]` fn whose return type names `anyhow` (`anyhow::Result<T>`): without
/// redguard's feature `anyhow`, `anyhow::Error` has no `Classify`, and the fix is the feature,
/// not a derive on a foreign type.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` on a fn returning `anyhow::Result` needs redguard's feature \
               `anyhow`",
    label = "`anyhow::Error` implements `redguard::Classify` with the feature `anyhow`",
    note = "enable it in Cargo.toml: `redguard = {{ version = \"..\", features = [\"anyhow\"] }}`; \
            attach `redguard::ErrorClass::Indeterminate` as context to errors whose outcome is \
            unknown"
)]
pub trait AnyhowClassified: crate::Classify {}

impl<E: crate::Classify> AnyhowClassified for E {}

/// [`assert_classified`] for a return type that names `anyhow`.
#[inline(always)]
pub fn assert_anyhow_classified<R: GuardedReturn>()
where
    R::Err: AnyhowClassified,
{
}

/// A guard's future, boxed: a guarded fn's future holds a pointer, not the guard's state and
/// the body, so stacked guards add their states instead of nesting them by value, and the
/// poll frames of a debug build stay small (issue 46: the guide's tests overflowed a 2 MiB
/// test thread). One allocation per call, beside a store round trip.
pub type Guarded<F> = std::pin::Pin<Box<F>>;

/// `#[idempotent]`'s wrapper: runs the body once per intent. A fn (not the method) so its
/// bounds are reported at the return type, as the checks above.
pub fn idempotent<T, E, F>(
    guard: crate::idempotency::Idempotency,
    body: F,
) -> Guarded<impl std::future::Future<Output = Result<T, E>>>
where
    F: std::future::Future<Output = Result<T, E>>,
    T: Replayable,
    E: GuardError + crate::Classify,
{
    Box::pin(guard.run(body))
}

/// `#[idempotent(detach)]`'s wrapper (see [`idempotent`]).
pub fn idempotent_detached<T, E, F>(
    guard: crate::idempotency::Idempotency,
    body: F,
) -> Guarded<impl std::future::Future<Output = Result<T, E>>>
where
    F: std::future::Future<Output = Result<T, E>> + Send + 'static,
    T: Replayable + Send + 'static,
    E: GuardError + crate::Classify + Send + 'static,
{
    Box::pin(guard.detach().run(body))
}

pub use crate::values::{Algorithm, Rate};

/// A count (`burst`, `cost`) written as an expression: any integer, checked per call.
pub fn rate_count<T: TryInto<u64>>(value: T, what: &'static str) -> crate::Result<u64> {
    value
        .try_into()
        .map_err(|_| crate::Error::InvalidLimit(format!("`{what}` must be a non-negative integer")))
}

/// `#[rate_limit]`'s prelude: a [`Limiter`](crate::rate::Limiter) on the fn's key, evaluated before
/// the body is moved; the expansion goes on with one call per argument written.
pub fn rate_limiter<R: crate::values::IntoRate>(
    key: crate::Result<crate::key::KeyBody>,
    scope: &'static str,
    rate: R,
) -> crate::rate::Limiter {
    crate::limiter(key).scope(scope).rate(rate)
}

/// `burst` or `cost` given as an expression (see [`rate_count`]).
pub fn rate_burst(
    limiter: crate::rate::Limiter,
    burst: crate::Result<u64>,
) -> crate::rate::Limiter {
    limiter.try_burst(burst)
}

/// See [`rate_burst`].
pub fn rate_cost(limiter: crate::rate::Limiter, cost: crate::Result<u64>) -> crate::rate::Limiter {
    limiter.try_cost(cost)
}

/// The wrapper of one or more adjacent `#[rate_limit]`s: decides them all-or-nothing, then
/// runs `inner` if every limit admitted.
pub fn rate_limit<T, E, F, const N: usize>(
    limiters: [crate::rate::Limiter; N],
    inner: F,
) -> Guarded<impl std::future::Future<Output = Result<T, E>>>
where
    E: GuardError,
    F: std::future::Future<Output = Result<T, E>>,
{
    Box::pin(rate_limit_run(limiters, inner))
}

async fn rate_limit_run<T, E, F, const N: usize>(
    limiters: [crate::rate::Limiter; N],
    inner: F,
) -> Result<T, E>
where
    E: GuardError,
    F: std::future::Future<Output = Result<T, E>>,
{
    let limits = limiters.into_iter().fold(
        crate::rate::RateLimits::new(),
        crate::rate::RateLimits::with,
    );
    // Not `limits.run(inner)`: a future moved into another is stored twice in a debug
    // build, and stacked guards would double the body's size once more per layer.
    match limits.check().await {
        Ok(_) => inner.await,
        Err(err) => Err(E::from(err)),
    }
}

/// The wrapper of a `#[rate_limit(.., charge = after)]`: admits the call at the limit's
/// `cost`, runs `inner`, and settles the `Ok` value's [`Cost`](crate::rate::Cost) (the
/// difference charged or refunded). An `Err` keeps the admission's cost. The work is done
/// by then and its value is the caller's: a settlement the store cannot take is warned
/// about and counted, not returned in the value's place.
pub async fn rate_limit_charged<T, E, F>(limiter: crate::rate::Limiter, inner: F) -> Result<T, E>
where
    E: GuardError,
    F: std::future::Future<Output = Result<T, E>>,
    T: crate::rate::Cost,
{
    let mut charge = match limiter.reserve().await {
        Ok(charge) => charge,
        Err(err) => return Err(E::from(err)),
    };
    let value = inner.await?;
    if let Err(err) = charge.settle(value.cost()).await {
        metrics::counter!("redguard_rate_settle_errors_total").increment(1);
        tracing::warn!(
            error = %err,
            held = charge.held(),
            cost = value.cost(),
            "redguard: the cost a `#[rate_limit(charge = after)]` call reported could not be \
             settled; the units charged so far stand"
        );
    }
    Ok(value)
}

/// `#[dist_lock]`'s prelude: the lock on the fn's key in its scope; the expansion goes on
/// with one builder call per argument written (`.fair()`, `.wait(..)`, …).
pub fn dist_lock_builder(
    scope: &'static str,
    key: crate::Result<crate::key::KeyBody>,
) -> crate::lock::LockBuilder {
    crate::lock(key).scope(scope)
}

pub use crate::lock::OnLost;

/// `#[dist_lock]`'s wrapper: runs the body under the lock.
pub fn dist_lock<K, T, E, F>(
    lock: crate::lock::LockBuilder<K>,
    body: F,
) -> Guarded<impl std::future::Future<Output = Result<T, E>>>
where
    K: crate::lock::Kind,
    E: GuardError,
    F: std::future::Future<Output = Result<T, E>>,
{
    Box::pin(lock.run(body))
}

/// Warnings about stacks that contradict the recommended order, raised through deprecation
/// (the one warning an expansion can raise on stable Rust).
pub mod stack_order {
    /// `#[dist_lock]` written above `#[idempotent]`.
    #[deprecated(
        note = "`#[dist_lock]` is above `#[idempotent]` on this fn, so every replay of a \
                finished intent takes the lock too: put `#[idempotent]` above `#[dist_lock]` \
                (guards apply outside-in in the order written), or `#[allow(deprecated)]` on \
                the fn if the lock must cover the whole call"
    )]
    pub fn dist_lock_above_idempotent() {}
}

/// The store seam, for redguard's own tests (feature `test-util`); unstable, see its docs.
#[cfg(feature = "test-util")]
pub mod store;
