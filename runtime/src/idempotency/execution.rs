//! A begun execution: the body run under a keep-alive, bounded by its timeout, and the
//! verdict it owes its record (SUCCESS, FAIL or UNKNOWN), recorded even when it is dropped.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::begin::Abandon;
use super::keep_alive::KeepAlive;
use super::{Classify, ErrorClass, record_outcome};
use crate::error::{BackendError, Error, Result};
use crate::handle::Redguard;
use crate::key::Key;
use crate::store::{Finish, IdemFinish, IdemFinished};
use crate::tokens;
use crate::undo::{Compensate, Undo};
use crate::values::Replicas;

/// A begun execution: the body to run, and the record and token it owns.
pub(super) struct Execution {
    pub(super) handle: Redguard,
    pub(super) scope: String,
    pub(super) owner: String,
    /// The PROCESSING record, or `None` (token-only mode, or a fail-open begin).
    pub(super) record: Option<Key>,
    /// When the begin was sent: the origin of the record's expire and of its renewals.
    pub(super) sent: tokio::time::Instant,
    pub(super) token: Option<tokens::Token>,
    pub(super) expire: Duration,
    pub(super) timeout: Option<Duration>,
    pub(super) replicas: Option<Replicas>,
}

impl Execution {
    /// Runs `body`, keeping the record alive meanwhile, and records how it ended.
    pub(super) async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Classify,
    {
        let mut verdict = None;
        let mut keep_alive = None;
        if let Some(key) = &self.record {
            // Dropped while the keep-alive starts, the body has not run: undo the begin.
            let mut undo = Undo::armed(Abandon {
                handle: self.handle.clone(),
                owner: self.owner.clone(),
                record: Some(key.clone()),
                token: self.token.clone(),
            });
            keep_alive = Some(
                KeepAlive::start(
                    &self.handle,
                    &self.scope,
                    key,
                    &self.owner,
                    self.sent,
                    self.expire,
                )
                .await,
            );
            undo.disarm();
            // From here on a panic or a drop leaves the outcome unknown.
            verdict = Some(Undo::armed(Verdict::unknown(&self, key.clone())));
        }
        let outcome = run_bounded(body, self.timeout).await;
        drop(keep_alive);
        let result = match outcome {
            Bounded::Finished(result) => result,
            Bounded::TimedOut(after) => {
                if let Some(verdict) = verdict {
                    record(verdict, Outcome::Unknown).await;
                }
                return Err(Error::Timeout { after }.into());
            }
        };
        let business = matches!(&result, Err(err) if err.class() == ErrorClass::Business);
        if let (Some(verdict), Some(key)) = (verdict, &self.record) {
            // Decided before the await: the future holds no reference to the result.
            let outcome = self.outcome(key, &result);
            record(verdict, outcome).await;
        }
        // A body that failed cleanly gives its token back: the retry its error invites (a
        // busy lock, out of stock) may use it.
        if business && let Some(token) = &self.token {
            token.restore(&self.handle, &self.owner).await;
        }
        result
    }

    /// The outcome to record: SUCCESS with the serialized value, FAIL for a business error,
    /// UNKNOWN for an indeterminate error or a value that would not replay.
    fn outcome<T, E>(&self, key: &Key, result: &Result<T, E>) -> Outcome
    where
        T: Serialize + DeserializeOwned,
        E: Classify,
    {
        match result {
            Ok(value) => match replayable(value) {
                Ok(bytes) => Outcome::Success(bytes),
                Err(why) => {
                    // The body succeeded, but a retry could not be given its result. FAIL
                    // would let a retry execute the intent twice.
                    record_outcome(&self.scope, "unreplayable");
                    tracing::error!(guard = "idem", %key, error = %why, "the result does not replay; record left UNKNOWN until it is resolved or expires");
                    Outcome::Unknown
                }
            },
            Err(err) if err.class() == ErrorClass::Business => Outcome::Fail,
            Err(_) => Outcome::Unknown,
        }
    }
}

/// How an execution ended, to be recorded.
#[derive(Debug, Clone)]
enum Outcome {
    Success(Vec<u8>),
    Fail,
    Unknown,
}

/// The outcome an execution owes its record. Dropped armed (the body panicked, the caller's
/// future was dropped mid-body or mid-finish), it records what is known: UNKNOWN while the
/// body runs, the body's outcome once it returned. Sent after the finish it may follow on the
/// same connection, so the store applies it after that finish, which then owns the record
/// (the second finish changes nothing).
struct Verdict {
    handle: Redguard,
    scope: String,
    key: Key,
    owner: String,
    expire: Duration,
    replicas: Option<Replicas>,
    outcome: Outcome,
}

impl Verdict {
    fn unknown(execution: &Execution, key: Key) -> Verdict {
        Verdict {
            handle: execution.handle.clone(),
            scope: execution.scope.clone(),
            key,
            owner: execution.owner.clone(),
            expire: execution.expire,
            replicas: execution.replicas,
            outcome: Outcome::Unknown,
        }
    }
}

impl Compensate for Verdict {
    const ABANDONED: &'static str =
        "idempotent execution abandoned outside a Tokio runtime; its record expires";

    async fn undo(self) {
        let v = self;
        finish(
            &v.handle, &v.scope, &v.key, &v.owner, v.outcome, v.expire, v.replicas,
        )
        .await;
    }
}

/// Records `outcome`, the verdict armed with it until the store answered.
async fn record(mut verdict: Undo<Verdict>, outcome: Outcome) {
    if let Some(v) = verdict.get_mut() {
        v.outcome = outcome.clone();
    }
    if let Some(v) = verdict.get() {
        finish(
            &v.handle, &v.scope, &v.key, &v.owner, outcome, v.expire, v.replicas,
        )
        .await;
    }
    verdict.disarm();
}

/// Records the outcome of `owner`'s execution, and reports what became of it.
async fn finish(
    handle: &Redguard,
    scope: &str,
    key: &Key,
    owner: &str,
    outcome: Outcome,
    expire: Duration,
    replicas: Option<Replicas>,
) {
    let recorded = match &outcome {
        Outcome::Success(bytes) => IdemFinish::Success(bytes),
        Outcome::Fail => IdemFinish::Fail,
        Outcome::Unknown => IdemFinish::Unknown,
    };
    let finish = Finish {
        key,
        owner,
        outcome: recorded,
        ttl: expire,
        replicas,
    };
    let result = handle.store().idem_finish(finish).await;
    crate::trace::record(
        "recorded",
        match (&result, &outcome) {
            (Ok(IdemFinished::Recorded), Outcome::Success(_)) => "success",
            (Ok(IdemFinished::Recorded), Outcome::Fail) => "fail",
            (Ok(IdemFinished::Recorded), Outcome::Unknown) => "unknown",
            (Ok(IdemFinished::NotOwner), _) => "not_owner",
            (Err(Error::Backend(BackendError::Unconfirmed { .. })), _) => "unconfirmed",
            (Err(_), _) => "unrecorded",
        },
    );
    match result {
        Ok(IdemFinished::Recorded) => {}
        Ok(IdemFinished::NotOwner) => {
            metrics::counter!("redguard_idempotency_lost_total", "scope" => scope.to_owned())
                .increment(1);
            tracing::warn!(guard = "idem", %key, "record expired or was taken over during the body; outcome not recorded");
        }
        Err(err @ Error::Backend(BackendError::Unconfirmed { .. })) => {
            metrics::counter!("redguard_backend_errors_total", "guard" => "idem", "op" => "idem_finish", "outcome" => "unconfirmed")
                .increment(1);
            tracing::warn!(guard = "idem", %key, error = %err, "the outcome is recorded but too few replicas confirmed it; a failover now could lose it");
        }
        Err(err) => {
            metrics::counter!("redguard_backend_errors_total", "guard" => "idem", "op" => "idem_finish", "outcome" => "unrecorded")
                .increment(1);
            tracing::warn!(guard = "idem", %key, error = %err, "could not record the outcome; the record stays PROCESSING until it expires");
        }
    }
}

/// The serialized value, checked to read back as `T`: what a replay would return.
fn replayable<T: Serialize + DeserializeOwned>(value: &T) -> std::result::Result<Vec<u8>, String> {
    let bytes = serde_json::to_vec(value).map_err(|err| err.to_string())?;
    serde_json::from_slice::<T>(&bytes).map_err(|err| {
        format!(
            "{} serializes to something that does not read back: {err}",
            std::any::type_name::<T>()
        )
    })?;
    Ok(bytes)
}

enum Bounded<T> {
    Finished(T),
    TimedOut(Duration),
}

async fn run_bounded<F: Future>(body: F, timeout: Option<Duration>) -> Bounded<F::Output> {
    match timeout {
        None => Bounded::Finished(body.await),
        Some(after) => match tokio::time::timeout(after, body).await {
            Ok(output) => Bounded::Finished(output),
            Err(_) => Bounded::TimedOut(after),
        },
    }
}
