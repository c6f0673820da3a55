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
/// Explicit on purpose: whether an error is safe to retry is a business decision. The default
/// method says [`ErrorClass::Business`]; override it for errors whose outcome is unknown, and
/// delegate to [`redguard::Error`](crate::Error)'s own classification where you wrap it.
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
    note = "add `impl redguard::Classify for {Self} {{}}` (every error is a business error, a \
            retry runs again), or override `class()` for errors whose outcome is unknown"
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
            Error::Backend(_) | Error::Timeout { .. } | Error::LockLost { .. } => {
                ErrorClass::Indeterminate
            }
            _ => ErrorClass::Business,
        }
    }
}
