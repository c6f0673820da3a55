//! Everything macro expansions name. Not a public API: it changes with the macros, which are
//! pinned to this crate's exact version.

pub use crate::handle::Redguard;
pub use crate::key::{KeyBuilder, KeyPart};

/// Identity on a `KeyPart`: expansions call it at each placeholder's span, so a value of the
/// wrong type is reported there.
#[inline(always)]
pub fn key_part<T: KeyPart + ?Sized>(value: &T) -> &T {
    value
}

/// What a guarded fn must return: a `Result` whose error can carry a guard's refusal.
#[diagnostic::on_unimplemented(
    message = "a guarded fn must return `Result<T, E>` where `E: From<redguard::Error>`, \
               not `{Self}`",
    label = "a guard returns its refusals (in progress, rate limited, lock timeout) through \
             this type",
    note = "add `impl From<redguard::Error> for YourError`, or return `redguard::Result<T>`"
)]
pub trait GuardedReturn {}

impl<T, E: From<crate::Error>> GuardedReturn for Result<T, E> {}

/// Expansions call this first, spanned at the return type.
#[inline(always)]
pub fn assert_guarded_return<R: GuardedReturn>() {}

pub use crate::rate::{Algorithm, Rate, RateSpec};

/// A count (`burst`, `cost`) written as an expression: any integer, checked per call.
pub fn rate_count<T: TryInto<u64>>(value: T, what: &'static str) -> crate::Result<u64> {
    value
        .try_into()
        .map_err(|_| crate::Error::InvalidLimit(format!("`{what}` must be a non-negative integer")))
}

/// What `#[rate_limit]`'s prelude evaluates, before the body is moved; the other arguments
/// follow as method calls on the result.
pub fn rate_spec<R: crate::rate::IntoRate>(
    key: crate::Result<crate::KeyBody>,
    scope: &'static str,
    rate: R,
) -> RateSpec {
    RateSpec::new(key, scope, rate.into_rate())
}

/// The wrapper of one or more adjacent `#[rate_limit]`s: decides them all-or-nothing, then
/// runs `inner` if every limit admitted.
pub async fn rate_limit<T, E, F, const N: usize>(specs: [RateSpec; N], inner: F) -> Result<T, E>
where
    E: From<crate::Error>,
    F: std::future::Future<Output = Result<T, E>>,
{
    match crate::rate::enforce_specs(specs.into()).await {
        Ok(()) => inner.await,
        Err(err) => Err(E::from(err)),
    }
}
