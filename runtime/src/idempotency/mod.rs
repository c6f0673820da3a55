//! The idempotency guard: the same business intent runs once; retries get the first result.
//!
//! One execution is: `begin` (one store op) → run the body → `finish` (one store op).
//! `begin` finds no record (run), a PROCESSING one ([`Error::InProgress`]: a twin runs), a
//! SUCCESS one (replay its result without running), a FAIL one (take it over and run again,
//! whatever its payload) or an UNKNOWN one ([`Error::OutcomeUnknown`]). `finish` records
//! SUCCESS with the result, FAIL for a business error, or UNKNOWN: a timeout, a panic, a
//! dropped future or an error the user classifies as indeterminate leaves the outcome
//! unknown, so a retry must not run blindly; an operator resolves it
//! ([`Admin::resolve`](crate::admin::Admin::resolve)) or it expires. A crashed process
//! records nothing: its PROCESSING record, no longer renewed, expires `expire` after its
//! last renewal, and retries get [`Error::InProgress`] until then.
//!
//! Code map, as `lock/`: `builder.rs` what a caller asks for ([`Idempotency`], [`Detached`])
//! and `run`; `begin.rs` the begin and what undoes one whose outcome is unknown;
//! `execution.rs` the body, its timeout and the verdict it owes its record; `keep_alive.rs`
//! the renewal of a PROCESSING record; `replay.rs` [`track_replay`]; `classify.rs` how an
//! error's outcome is classified; `wait.rs` a duplicate waiting for the first execution's
//! outcome ([`Idempotency::wait`]); `transaction.rs` (feature `sqlx`) the outcome committed in
//! the caller's database transaction; `batch.rs` [`Batch`], many messages claimed in one store
//! call.

mod batch;
mod begin;
mod builder;
mod classify;
mod execution;
mod keep_alive;
mod replay;
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub(crate) mod transaction;
mod wait;
#[cfg(not(any(feature = "sqlx-postgres", feature = "sqlx-sqlite")))]
mod without_sqlx;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::telemetry::Value;

pub use self::batch::{Batch, BatchOutcome, MAX_BATCH, MAX_BATCH_CONCURRENCY};
pub use self::builder::{Detached, Idempotency};
pub use self::classify::{Classify, ErrorClass};
pub(crate) use self::keep_alive::KeepAlives;
pub use self::replay::track_replay;
#[cfg(feature = "sqlx-postgres")]
pub use self::transaction::POSTGRES_MIGRATION;
#[cfg(feature = "sqlx-sqlite")]
pub use self::transaction::SQLITE_MIGRATION;
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub use self::transaction::{
    MAX_SQL_RESULT_BYTES, OutcomeDatabase, Transactional, purge_expired, sql_failure,
};

#[doc(hidden)]
#[cfg(not(any(feature = "sqlx-postgres", feature = "sqlx-sqlite")))]
pub use self::without_sqlx::{SqlxTransaction, WithoutSqlx};

pub use redguard_grammar::idempotency::{MAX_EXPIRE, MIN_EXPIRE};

/// Scope of executions started by [`idempotency`](crate::idempotency()) when none is given:
/// the entry point's name, as for [`lock`](crate::lock()) and [`limiter`](crate::limiter()).
/// Give each operation its own ([`Idempotency::scope`]) when their keys could meet.
pub const DEFAULT_IDEMPOTENCY_SCOPE: &str = "idempotency";

fn record_outcome(scope: &str, outcome: &'static str) {
    crate::trace::record("outcome", outcome);
    crate::telemetry::counter(
        "redguard_idempotency_total",
        [
            ("scope", Value::Text(scope)),
            ("outcome", Value::Static(outcome)),
        ],
    )
    .increment(1);
}

/// SHA-256 of the JSON serialization, first 128 bits as hex.
pub(crate) fn fingerprint<P: Serialize + ?Sized>(payload: &P) -> Result<String> {
    let json = serde_json::to_vec(payload).map_err(|err| {
        Error::Config(format!("the idempotency payload does not serialize: {err}"))
    })?;
    let digest = Sha256::digest(&json);
    Ok(digest[..16].iter().map(|b| format!("{b:02x}")).collect())
}
