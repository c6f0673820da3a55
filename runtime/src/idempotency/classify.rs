//! Which errors end an execution definitively.

use crate::error::Error;

/// How an error ends an idempotent execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The body ran and failed cleanly (out of stock, invalid input): the record becomes FAIL
    /// and a retry with the same key runs again.
    Business,
    /// The outcome is unknown (a downstream call timed out, a connection dropped mid-write):
    /// the record stays PROCESSING until it expires, and retries get [`Error::InProgress`].
    Indeterminate,
}

/// Classifies a guarded fn's error type for `#[idempotent]`.
///
/// Explicit on purpose: whether an error is safe to retry is a business decision. Derive it:
/// a variant wrapping [`redguard::Error`](crate::Error) classifies itself (a lock lost
/// mid-body leaves the outcome unknown; a lock timeout before the body is a business error),
/// `#[classify(indeterminate)]` marks errors whose outcome is unknown, and the rest are
/// business errors:
///
/// ```
/// use redguard::{Classify, ErrorClass};
///
/// #[derive(Debug, Classify)]
/// enum OrderError {
///     OutOfStock,
///     #[classify(indeterminate)]
///     PaymentGatewayTimeout,
///     Guard(redguard::Error),
/// }
///
/// assert_eq!(OrderError::OutOfStock.class(), ErrorClass::Business);
/// assert_eq!(OrderError::PaymentGatewayTimeout.class(), ErrorClass::Indeterminate);
/// let lost = OrderError::Guard(redguard::Error::LockLost { key: "stock".into() });
/// assert_eq!(lost.class(), ErrorClass::Indeterminate);
/// ```
///
/// By hand, the default method says [`ErrorClass::Business`]; override it, and delegate to
/// the wrapped [`redguard::Error`](crate::Error)'s own classification:
///
/// ```
/// use redguard::{Classify, ErrorClass};
///
/// enum OrderError {
///     OutOfStock,
///     PaymentGatewayTimeout,
///     Guard(redguard::Error),
/// }
///
/// impl From<redguard::Error> for OrderError {
///     fn from(err: redguard::Error) -> Self {
///         OrderError::Guard(err)
///     }
/// }
///
/// impl Classify for OrderError {
///     fn class(&self) -> ErrorClass {
///         match self {
///             OrderError::OutOfStock => ErrorClass::Business,
///             // The charge may have gone through: never re-run blindly.
///             OrderError::PaymentGatewayTimeout => ErrorClass::Indeterminate,
///             OrderError::Guard(err) => err.class(),
///         }
///     }
/// }
/// assert_eq!(OrderError::PaymentGatewayTimeout.class(), ErrorClass::Indeterminate);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say which of its errors are safe to retry",
    label = "`#[idempotent]` needs `{Self}: redguard::Classify`",
    note = "add `#[derive(redguard::Classify)]` to `{Self}`: a wrapped `redguard::Error` \
            classifies itself, and `#[classify(indeterminate)]` marks variants whose outcome is \
            unknown (the rest are business errors: a retry runs again)"
)]
pub trait Classify {
    /// How this error ends the execution. Default: [`ErrorClass::Business`].
    fn class(&self) -> ErrorClass {
        ErrorClass::Business
    }
}

/// A guard's own refusal (in progress, rate limited, lock not obtained) happened before the
/// body ran, so it is definitive. A store or body timeout, or a lock lost mid-body (the body
/// was cancelled part-way), leaves the outcome unknown.
impl Classify for Error {
    fn class(&self) -> ErrorClass {
        match self {
            Error::Backend(_)
            | Error::Timeout { .. }
            | Error::Cancelled
            | Error::LockLost { .. } => ErrorClass::Indeterminate,
            _ => ErrorClass::Business,
        }
    }
}
