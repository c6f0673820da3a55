//! Which errors end an execution definitively.

use crate::error::Error;

/// How an error ends an idempotent execution.
///
/// It is also an error type of its own, so a dynamic error can carry its class: attach it as
/// context (`anyhow`'s `.context(ErrorClass::Business)`, feature `anyhow`) or as the source
/// of a boxed error, and the [`Classify`] impls for those types find it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The body ran and failed cleanly (out of stock, invalid input): the record becomes FAIL
    /// and a retry with the same key runs again.
    Business,
    /// The outcome is unknown (a downstream call timed out, a connection dropped mid-write):
    /// the record becomes UNKNOWN, and retries get [`Error::OutcomeUnknown`] until an
    /// operator resolves it or it expires.
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

impl std::fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorClass::Business => "business error: safe to retry",
            ErrorClass::Indeterminate => "outcome unknown: not safe to retry",
        })
    }
}

impl std::error::Error for ErrorClass {}

/// The class a dynamic error carries: an [`ErrorClass`] or a [`redguard::Error`](Error)
/// anywhere in its chain (the outermost wins), or `None`.
fn class_in_chain(mut err: Option<&(dyn std::error::Error + 'static)>) -> Option<ErrorClass> {
    while let Some(e) = err {
        if let Some(class) = e.downcast_ref::<ErrorClass>() {
            return Some(*class);
        }
        if let Some(guard) = e.downcast_ref::<Error>() {
            return Some(guard.class());
        }
        err = e.source();
    }
    None
}

/// A boxed error classifies through what it holds: a [`redguard::Error`](Error) or an
/// [`ErrorClass`] anywhere in its source chain. Anything else is **indeterminate**: nothing
/// says the failure happened before any effect, so the record becomes UNKNOWN rather than
/// letting a retry run the intent twice. Make business errors retryable
/// by giving them an [`ErrorClass::Business`] source, or use a typed error with
/// `#[derive(Classify)]`.
///
/// ```
/// use redguard::{Classify, ErrorClass};
///
/// type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// let busy: BoxError = redguard::Error::InProgress.into();
/// assert_eq!(busy.class(), ErrorClass::Business);
/// let io: BoxError = std::io::Error::other("connection reset").into();
/// assert_eq!(io.class(), ErrorClass::Indeterminate);
/// let declared: BoxError = ErrorClass::Business.into();
/// assert_eq!(declared.class(), ErrorClass::Business);
/// ```
impl Classify for Box<dyn std::error::Error + Send + Sync> {
    fn class(&self) -> ErrorClass {
        class_in_chain(Some(&**self)).unwrap_or(ErrorClass::Indeterminate)
    }
}

/// Feature `anyhow`: an [`ErrorClass`] attached as context
/// (`.context(ErrorClass::Business)`) decides; else a [`redguard::Error`](Error) in the
/// chain classifies itself; anything else is **indeterminate** (as for a boxed error: the
/// record becomes UNKNOWN, a retry is refused until it is resolved or expires).
///
/// ```
/// use anyhow::Context;
/// use redguard::{Classify, ErrorClass};
///
/// let busy = anyhow::Error::from(redguard::Error::InProgress);
/// assert_eq!(busy.class(), ErrorClass::Business);
/// let unknown = anyhow::anyhow!("payment gateway timed out");
/// assert_eq!(unknown.class(), ErrorClass::Indeterminate);
/// let declared: anyhow::Result<()> = Err(anyhow::anyhow!("out of stock"));
/// let declared = declared.context(ErrorClass::Business).unwrap_err();
/// assert_eq!(declared.class(), ErrorClass::Business);
/// ```
#[cfg(feature = "anyhow")]
impl Classify for anyhow::Error {
    fn class(&self) -> ErrorClass {
        // Context is not part of `chain()`'s downcasts of the inner error: ask for it first.
        if let Some(class) = self.downcast_ref::<ErrorClass>() {
            return *class;
        }
        class_in_chain(Some(self.as_ref())).unwrap_or(ErrorClass::Indeterminate)
    }
}
