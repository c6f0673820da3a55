//! Store operations of idempotency records.

use std::time::Duration;

use async_trait::async_trait;

use super::LockWatch;
use crate::error::Result;
use crate::key::Key;
use crate::values::Replicas;

/// Idempotency operations of a [`Store`](super::Store).
///
/// A record is `{status, owner, fp, result}`; `status` is PROCESSING, SUCCESS, FAIL or
/// UNKNOWN (the execution ended, but whether its effects happened is not known). Each
/// transition is one atomic operation; `owner` (a random id per execution) guards `finish`, so
/// an execution that lost its record cannot overwrite a newer one.
#[async_trait]
pub trait IdemOps {
    /// Starts an execution: no record (or a FAIL one, whatever its fingerprint: a failure
    /// releases the key) → PROCESSING owned by `owner` with `fingerprint`, living `ttl`.
    /// Otherwise `fingerprint` (empty = none) must match the record's when both have one. With
    /// [`replicas`](Begin::replicas), a record begun but not confirmed in time is
    /// [`BackendError::Unconfirmed`](crate::BackendError::Unconfirmed) (and stays: the caller
    /// undoes it with [`idem_abandon`](IdemOps::idem_abandon)).
    async fn idem_begin(&self, begin: Begin<'_>) -> Result<IdemBegin>;

    /// Begins each of `begins` as [`idem_begin`](IdemOps::idem_begin) does, in as few round
    /// trips as the store can (Redis: one script per Cluster slot group, the groups sent at
    /// once); one result per begin, in order. A begin whose result is an error may still have
    /// been applied: the caller undoes it with [`idem_abandon`](IdemOps::idem_abandon). The
    /// default begins them one after another.
    async fn idem_begin_batch(&self, begins: &[Begin<'_>]) -> Vec<Result<IdemBegin>> {
        let mut begun = Vec::with_capacity(begins.len());
        for begin in begins {
            begun.push(self.idem_begin(*begin).await);
        }
        begun
    }

    /// Extends the PROCESSING record `owner` began to live `ttl` from now, while its
    /// execution runs; false when it is no longer `owner`'s PROCESSING record (nothing is
    /// changed then).
    async fn idem_renew(&self, key: &Key, owner: &str, ttl: Duration) -> Result<bool>;

    /// Undoes a begin by `owner` whose outcome is unknown to it (the call failed, or its
    /// caller gave up before running the body): removes the record if it is `owner`'s
    /// PROCESSING one, so a retry can run. Anything else is left alone.
    async fn idem_abandon(&self, key: &Key, owner: &str) -> Result<()>;

    /// Ends the execution `owner` began: SUCCESS with `result`, FAIL (a retry may run) or
    /// UNKNOWN (retries are refused). The record then lives `ttl` more. With [`replicas`](Finish::replicas), an outcome
    /// recorded but not confirmed in time is
    /// [`BackendError::Unconfirmed`](crate::BackendError::Unconfirmed) (it stays recorded).
    async fn idem_finish(&self, finish: Finish<'_>) -> Result<IdemFinished>;

    /// An operator's verdict on the record at `key` (`redguard resolve`): SUCCESS with a
    /// result, or FAIL. Applies to an UNKNOWN or FAIL record; a PROCESSING or SUCCESS one only
    /// when `force`. The record keeps its TTL and fingerprint.
    async fn idem_resolve(&self, resolve: Resolve<'_>) -> Result<Resolved>;

    /// A subscription to the end of the execution at `key`: it fires when a PROCESSING
    /// record there is finished, abandoned or resolved, once a begin found it in progress (a
    /// store may skip announcing ends nobody waited for). Take it *before* the begin, so an
    /// end between a begin that found the record in progress and the wait is not missed.
    /// The same notifications as [`lock_watch`](super::LockOps::lock_watch) (one
    /// subscription per handle on Redis); never fails: when they are unavailable the watch
    /// says so and the waiter polls.
    async fn idem_watch(&self, key: &Key) -> LockWatch;
}

/// An execution that begins: what [`IdemOps::idem_begin`] takes.
#[derive(Debug, Clone, Copy)]
pub struct Begin<'a> {
    /// The record's key.
    pub key: &'a Key,
    /// The execution's owner id, random per execution.
    pub owner: &'a str,
    /// The payload's fingerprint; empty for none.
    pub fingerprint: &'a str,
    /// How long the record lives.
    pub ttl: Duration,
    /// Replicas that must have the PROCESSING record before it counts (see
    /// [`Replicas`]); a store without replicas treats it as confirmed.
    pub replicas: Option<Replicas>,
}

/// How an execution ended: what [`IdemOps::idem_finish`] takes.
#[derive(Debug, Clone, Copy)]
pub struct Finish<'a> {
    /// The record's key.
    pub key: &'a Key,
    /// The owner id the execution began with.
    pub owner: &'a str,
    /// SUCCESS with the result, FAIL or UNKNOWN.
    pub outcome: IdemFinish<'a>,
    /// How long the record lives from now.
    pub ttl: Duration,
    /// Replicas that must have the outcome before it counts (see [`Replicas`]); a store
    /// without replicas treats it as confirmed.
    pub replicas: Option<Replicas>,
}

/// What [`IdemOps::idem_begin`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdemBegin {
    /// No record: this caller now owns a PROCESSING one and runs the body.
    Started,
    /// A FAIL record: this caller took it over and runs the body again.
    Retrying,
    /// Another execution is PROCESSING: running, or crashed and not expired yet.
    InProgress,
    /// An UNKNOWN record: an earlier execution ended and its outcome is unknown.
    Unknown,
    /// A SUCCESS record: its stored result.
    Done(Vec<u8>),
    /// The record's fingerprint differs from this request's.
    KeyReuse,
}

/// How an execution ended, for [`IdemOps::idem_finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdemFinish<'a> {
    /// The body returned `Ok`; its serialized value.
    Success(&'a [u8]),
    /// The body returned a business error: a retry may run.
    Fail,
    /// The body ended with an unknown outcome (an indeterminate error, a timeout, a panic,
    /// its future dropped): retries are refused until an operator resolves it or it expires.
    Unknown,
}

/// An operator's verdict: what [`IdemOps::idem_resolve`] takes.
#[derive(Debug, Clone, Copy)]
pub struct Resolve<'a> {
    /// The record's key.
    pub key: &'a Key,
    /// SUCCESS with this result (a retry replays it), or `None`: FAIL (a retry runs).
    pub result: Option<&'a [u8]>,
    /// Also overwrite a PROCESSING or SUCCESS record.
    pub force: bool,
}

/// A record's status, as [`IdemOps::idem_resolve`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdemStatus {
    /// An execution began and has not ended (or crashed).
    Processing,
    /// Ended with a result.
    Success,
    /// Ended with a business error.
    Fail,
    /// Ended with an unknown outcome.
    Unknown,
}

impl IdemStatus {
    /// `processing`, `success`, `fail` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            IdemStatus::Processing => "processing",
            IdemStatus::Success => "success",
            IdemStatus::Fail => "fail",
            IdemStatus::Unknown => "unknown",
        }
    }
}

/// What [`IdemOps::idem_resolve`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// The verdict is recorded; the record was in this status.
    Done(IdemStatus),
    /// Nothing changed: the record is in this status and `force` was not given.
    Refused(IdemStatus),
    /// Nothing changed: there is no record.
    Missing,
}

/// What [`IdemOps::idem_finish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdemFinished {
    /// The record now holds the outcome.
    Recorded,
    /// The record was no longer this execution's (expired, or taken over): left untouched.
    NotOwner,
}
