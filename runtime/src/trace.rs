//! The `tracing` spans of guard calls and store calls, so a trace view shows each guarded
//! call with its decision and, under it, the Redis round trips it made.
//!
//! Guard spans are at info level — `redguard.idempotent`, `redguard.lock`,
//! `redguard.rate_limit` — with `scope`, `store` and what was decided (`outcome`; a lock's
//! `fence` and `wait_ms`; a rate limit's `decision`, `remaining`, `retry_after_ms`, and
//! `mode` when the local fallback decided: `local`, or `recovering` for its gate). Store
//! calls are debug-level children named `redguard.store` with the OpenTelemetry database
//! fields `db.system = "redis"` and `db.operation` (the script or command). No field carries
//! a request's values beyond the validated key parts in `scope`'s key (not even those: keys
//! are left to debug events).

use std::time::Duration;

use tracing::field::Empty;
use tracing::level_filters::LevelFilter;
use tracing::{Level, Span};

use crate::error::Error;
use crate::values::LockKind;

/// `span`, or [`Span::none`] when no subscriber takes it. With `tracing`'s `log` feature on
/// (sqlx turns it on) a disabled span keeps its metadata, and its every enter, exit and
/// record asks `log` whether to print a line (6% of an in-process check's instructions).
fn wanted(span: Span) -> Span {
    if span.is_disabled() {
        Span::none()
    } else {
        span
    }
}

/// Whether no subscriber takes anything at `level`: one atomic load, where building a span
/// to find it disabled takes ~200 instructions under `log`.
fn off(level: Level) -> bool {
    LevelFilter::current() < level
}

pub(crate) fn idempotent(scope: &str, store: &'static str) -> Span {
    if off(Level::INFO) {
        return Span::none();
    }
    wanted(tracing::info_span!(
        "redguard.idempotent",
        scope,
        store,
        outcome = Empty,
        recorded = Empty,
    ))
}

pub(crate) fn lock(scope: &str, kind: LockKind, store: &'static str) -> Span {
    if off(Level::INFO) {
        return Span::none();
    }
    let kind = match kind {
        LockKind::Exclusive => "exclusive",
        LockKind::Fair => "fair",
        LockKind::Semaphore { .. } => "semaphore",
        LockKind::Read => "read",
        LockKind::Write => "write",
    };
    wanted(tracing::info_span!(
        "redguard.lock",
        scope,
        kind,
        store,
        outcome = Empty,
        wait_ms = Empty,
        fence = Empty,
    ))
}

pub(crate) fn rate_limit(scope: &str, limits: usize, store: &'static str) -> Span {
    if off(Level::INFO) {
        return Span::none();
    }
    wanted(tracing::info_span!(
        "redguard.rate_limit",
        scope,
        limits,
        store,
        decision = Empty,
        remaining = Empty,
        retry_after_ms = Empty,
        shadow_rejected = Empty,
        near_limit = Empty,
        mode = Empty,
    ))
}

/// The span of one Redis call, `op` being the script or command.
pub(crate) fn store_call(op: &'static str) -> Span {
    if off(Level::DEBUG) {
        return Span::none();
    }
    wanted(tracing::debug_span!(
        "redguard.store",
        db.system = "redis",
        db.operation = op
    ))
}

/// Records `value` in `field` of the current span (the guard's, where guards call it).
pub(crate) fn record(field: &'static str, value: &str) {
    Span::current().record(field, value);
}

/// A lock acquisition's result on its span.
pub(crate) fn lock_done(span: &Span, waited: Duration, result: Result<Option<u64>, &Error>) {
    span.record("wait_ms", waited.as_secs_f64() * 1000.0);
    match result {
        Ok(Some(fence)) => {
            span.record("outcome", "acquired");
            span.record("fence", fence);
        }
        Ok(None) => {
            span.record("outcome", "degraded");
        }
        Err(err) => {
            span.record("outcome", error_name(err));
        }
    }
}

/// A short name of a guard's refusal, for span fields.
pub(crate) fn error_name(err: &Error) -> &'static str {
    match err {
        Error::LockTimeout { .. } => "timeout",
        Error::LockHeld { .. } => "held",
        Error::LockLost { .. } => "lost",
        Error::LockTooDeep { .. } => "too_deep",
        Error::RateLimited(_) => "rejected",
        Error::Denied { .. } => "denied",
        Error::Backend(_) => "backend_error",
        Error::InvalidKey { .. } | Error::MissingKey { .. } => "invalid_key",
        _ => "error",
    }
}
