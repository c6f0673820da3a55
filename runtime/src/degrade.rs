//! Applying a guard's [`FailMode`] when the store cannot answer, with the log line and the
//! counter that make a degraded guard visible.

use crate::error::{Error, Result};
use crate::handle::{FailMode, Redguard};
use crate::key::{GuardKind, Key};

/// Turns a store result into "decided by the store" (`Some`) or "store down, fail open"
/// (`None`; for rate limits under `FailMode::Local`, "decide locally"), per the handle's
/// policy for the guard.
pub(crate) trait Degrade<T> {
    fn or_degrade(
        self,
        handle: &Redguard,
        guard: GuardKind,
        op: &'static str,
        key: &Key,
    ) -> Result<Option<T>>;
}

impl<T> Degrade<T> for Result<T> {
    fn or_degrade(
        self,
        handle: &Redguard,
        guard: GuardKind,
        op: &'static str,
        key: &Key,
    ) -> Result<Option<T>> {
        let err = match self {
            Ok(value) => return Ok(Some(value)),
            Err(Error::Backend(err)) => err,
            Err(other) => return Err(other),
        };
        let mode = handle.fail_mode(guard);
        let outcome = match mode {
            FailMode::Open => "fail_open",
            FailMode::Closed => "fail_closed",
            FailMode::Local { .. } => "fail_local",
        };
        metrics::counter!(
            "redguard_backend_errors_total",
            "guard" => guard.as_str(),
            "op" => op,
            "outcome" => outcome,
        )
        .increment(1);
        tracing::warn!(guard = guard.as_str(), op, %key, outcome, error = %err, "store unavailable");
        match mode {
            // `None` for the local fallback too: the rate limits decide in process then.
            FailMode::Open | FailMode::Local { .. } => Ok(None),
            FailMode::Closed => Err(Error::Backend(err)),
        }
    }
}
