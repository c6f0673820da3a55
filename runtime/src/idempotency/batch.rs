//! Batches for queue consumers: claim many intents in one store call, run the claimed ones,
//! say per message what happened.
//!
//! The claim is [`IdemOps::idem_begin_batch`](crate::store::IdemOps::idem_begin_batch): on
//! Redis one script per Cluster slot group, the groups sent at once. Each claimed message
//! then runs as one execution of [`Idempotency::run`](super::Idempotency::run) does (keep-alive,
//! timeout, its outcome recorded as soon as its body ends), so a crash loses the outcome of
//! at most the bodies running at that moment. Claims still waiting for their turn are
//! undone when the batch's future is dropped, and renewed before their turn when the batch
//! has run long enough for their first renewal to be due.

use std::borrow::Cow;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;

use super::execution::Execution;
use super::{Classify, DEFAULT_IDEMPOTENCY_SCOPE, fingerprint, record_outcome};
use crate::error::{BackendError, Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, IntoKey, Key, KeyBody};
use crate::store::{Begin, IdemBegin};
use crate::undo::{Compensate, Undo};

/// The most messages one [`Batch`] holds: a batch is one store call, which must stay short
/// (Redis runs one script at a time).
pub const MAX_BATCH: usize = 1000;

/// The most bodies a [`Batch`] runs at once ([`Batch::concurrency`]).
pub const MAX_BATCH_CONCURRENCY: usize = 64;

/// A batch of messages from a queue (Kafka, SQS, NATS, Redis streams), each processed at
/// most once per intent: built by [`Redguard::idempotency_batch`] (or [`Batch::new`] for the
/// current handle), filled with [`message`](Batch::message), run with [`run`](Batch::run).
///
/// `run` claims every message in one store call, runs the body of each claimed one
/// (one after another by default; see [`concurrency`](Batch::concurrency)), records each
/// outcome as its body ends, and returns a [`BatchOutcome`] per message, in the batch's
/// order. Each message's record is the one [`Idempotency`](super::Idempotency) with the same
/// scope and key would use, so single calls and batches can share intents.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use redguard::idempotency::BatchOutcome;
///
/// let rg = redguard::Redguard::memory();
/// let delivered = [10u64, 11, 10]; // the broker redelivers message 10
/// let mut runs = 0;
/// for id in delivered {
///     let outcomes = rg
///         .idempotency_batch()
///         .scope("billing-consumer")
///         .message(redguard::key("msg:{id}").part("id", &id))
///         .run(|_| {
///             runs += 1; // `body` is called only for a message that runs
///             async move { Ok::<_, redguard::Error>(id * 100) }
///         })
///         .await?;
///     assert!(outcomes.iter().all(BatchOutcome::is_done)); // ack
/// }
/// assert_eq!(runs, 2);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a Batch does nothing until `.run(body).await`"]
pub struct Batch {
    handle: Option<Redguard>,
    scope: String,
    expire: Duration,
    timeout: Option<Duration>,
    concurrency: usize,
    messages: Vec<Message>,
}

#[derive(Debug)]
struct Message {
    key: Result<KeyBody>,
    fingerprint: Result<String>,
}

/// What became of one message of a [`Batch`].
#[derive(Debug)]
pub enum BatchOutcome<T, E> {
    /// Claimed and run here. Its outcome is recorded as a single call's is: SUCCESS for `Ok`
    /// (a redelivery replays it), FAIL for a business error (a redelivery runs again),
    /// UNKNOWN for an indeterminate error or a timeout (a redelivery gets
    /// [`BatchOutcome::Unknown`]).
    Ran(Result<T, E>),
    /// Done before (by a batch or a single call): the stored result; the body did not run.
    Replayed(T),
    /// Another execution holds the intent: running elsewhere, or crashed and not expired yet.
    /// The body did not run; redeliver the message later.
    InProgress,
    /// An earlier execution ended with an unknown outcome; retries are refused until an
    /// operator resolves it ([`Admin::resolve`](crate::admin::Admin::resolve)) or it expires.
    Unknown,
    /// The body did not run: the message's key is invalid, its payload differs from the
    /// record's ([`Error::KeyReuse`]), the store could not answer ([`Error::Backend`]; a
    /// batch fails closed whatever the [`FailMode`](crate::handle::FailMode)), or its claim
    /// expired before its turn. Anything the claim may have written is undone, so a
    /// redelivery can run it.
    Failed(Error),
}

impl<T, E> BatchOutcome<T, E> {
    /// True when the message needs no redelivery: its body succeeded here
    /// (`Ran(Ok(_))`) or before (`Replayed`). Ack after `run` returned: its outcome is then
    /// recorded.
    pub fn is_done(&self) -> bool {
        matches!(self, BatchOutcome::Ran(Ok(_)) | BatchOutcome::Replayed(_))
    }
}

impl Redguard {
    /// Starts a batch of idempotent messages on this handle; see [`Batch`].
    pub fn idempotency_batch(&self) -> Batch {
        Batch::new().on(self)
    }
}

impl Default for Batch {
    fn default() -> Self {
        Batch::new()
    }
}

impl Batch {
    /// An empty batch on the current handle, in scope [`DEFAULT_IDEMPOTENCY_SCOPE`], whose
    /// records live 24 hours.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let outcomes = rg
    ///     .scope(
    ///         redguard::idempotency::Batch::new()
    ///             .message("m-1")
    ///             .run(|i| async move { Ok::<_, redguard::Error>(i) }),
    ///     )
    ///     .await?;
    /// assert_eq!(outcomes.len(), 1);
    /// # Ok(()) }
    /// ```
    pub fn new() -> Batch {
        Batch {
            handle: None,
            scope: DEFAULT_IDEMPOTENCY_SCOPE.to_owned(),
            expire: Duration::from_secs(24 * 3600),
            timeout: None,
            concurrency: 1,
            messages: Vec::new(),
        }
    }

    /// The records' scope, as [`Idempotency::scope`](super::Idempotency::scope).
    pub fn scope(mut self, scope: impl Into<Cow<'static, str>>) -> Self {
        self.scope = scope.into().into_owned();
        self
    }

    /// Runs on `handle` instead of the current one.
    pub fn on(mut self, handle: &Redguard) -> Self {
        self.handle = Some(handle.clone());
        self
    }

    /// How long each record lives after each transition (1 s to 7 days), as
    /// [`Idempotency::expire`](super::Idempotency::expire): it is also how long a message
    /// claimed by a consumer that crashed is refused ([`BatchOutcome::InProgress`]).
    pub fn expire(mut self, expire: Duration) -> Self {
        self.expire = expire;
        self
    }

    /// Bounds each body, as [`Idempotency::timeout`](super::Idempotency::timeout).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Runs up to `n` bodies at once (1 to [`MAX_BATCH_CONCURRENCY`]; default 1: one after
    /// another, in the batch's order, as a partition's messages are usually meant to be
    /// processed). Bodies start in the batch's order either way.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Adds a message: the key of its intent (its message id, say), validated as any key.
    pub fn message(mut self, key: impl IntoKey) -> Self {
        self.messages.push(Message {
            key: key.into_key(),
            fingerprint: Ok(String::new()),
        });
        self
    }

    /// Adds a message whose payload is fingerprinted as by
    /// [`Idempotency::payload`](super::Idempotency::payload): the same key with another
    /// payload is [`BatchOutcome::Failed`] with [`Error::KeyReuse`].
    pub fn message_with_payload<P: Serialize + ?Sized>(
        mut self,
        key: impl IntoKey,
        payload: &P,
    ) -> Self {
        self.messages.push(Message {
            key: key.into_key(),
            fingerprint: fingerprint(payload),
        });
        self
    }

    /// Claims every message, runs `body(i)` for each claimed message `i` (its position in
    /// the batch; `body` is called only for a message about to run), and returns what became
    /// of each, in the batch's order.
    ///
    /// A claim is renewed when its turn comes after its first renewal was due, and lives on
    /// while its body runs; a claim whose turn comes after its expire (the bodies before it
    /// took longer than `expire`) has lapsed and may belong to another consumer now, so it is
    /// [`BatchOutcome::Failed`] and its body does not run. Keep a batch's total run time well
    /// inside `expire`.
    ///
    /// [`Error::Config`] for bad settings or a batch of more than [`MAX_BATCH`] messages;
    /// everything else is reported per message.
    pub async fn run<T, E, F, Fut>(self, body: F) -> Result<Vec<BatchOutcome<T, E>>>
    where
        F: FnMut(usize) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Classify,
    {
        redguard_grammar::idempotency::expire(self.expire).map_err(Error::Config)?;
        if let Some(timeout) = self.timeout {
            redguard_grammar::idempotency::timeout(timeout).map_err(Error::Config)?;
        }
        if self.messages.len() > MAX_BATCH {
            return Err(Error::Config(format!(
                "an idempotency batch holds at most {MAX_BATCH} messages, this one {}: split it",
                self.messages.len()
            )));
        }
        if !(1..=MAX_BATCH_CONCURRENCY).contains(&self.concurrency) {
            return Err(Error::Config(format!(
                "batch concurrency must be 1 to {MAX_BATCH_CONCURRENCY}, not {}",
                self.concurrency
            )));
        }
        crate::handle::need_runtime()?;
        let handle = match &self.handle {
            Some(handle) => handle.clone(),
            None => Redguard::current()?,
        };
        let span = crate::trace::idempotent(&self.scope, handle.store().kind().as_str());
        self.claim_and_run(handle, body).instrument(span).await
    }

    async fn claim_and_run<T, E, F, Fut>(
        self,
        handle: Redguard,
        body: F,
    ) -> Result<Vec<BatchOutcome<T, E>>>
    where
        F: FnMut(usize) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Classify,
    {
        let Batch {
            scope,
            expire,
            timeout,
            concurrency,
            messages,
            ..
        } = self;
        let mut outcomes: Vec<Option<BatchOutcome<T, E>>> = messages.iter().map(|_| None).collect();
        let mut claims = Vec::with_capacity(messages.len());
        for (index, message) in messages.into_iter().enumerate() {
            let prepared = message.key.and_then(|body| {
                let key = handle.key(GuardKind::Idempotency, &scope, &body)?;
                Ok((key, message.fingerprint?))
            });
            match prepared {
                Ok((key, fingerprint)) => claims.push(Claim {
                    index,
                    key,
                    owner: uuid::Uuid::new_v4().simple().to_string(),
                    fingerprint,
                }),
                Err(err) => outcomes[index] = Some(BatchOutcome::Failed(err)),
            }
        }
        // Armed before the call: a claim that fails or is dropped may still have run. Each
        // message leaves it when its claim turns out not to be this batch's, or its body
        // starts (its execution then owns the record).
        let pending = Pending::new(&handle, outcomes.len());
        for claim in &claims {
            pending.put(claim);
        }
        let undo = Undo::armed(pending.clone());
        let begins: Vec<Begin<'_>> = claims
            .iter()
            .map(|claim| Begin {
                key: &claim.key,
                owner: &claim.owner,
                fingerprint: &claim.fingerprint,
                ttl: expire,
                replicas: None,
            })
            .collect();
        // The records' expire counts from before the claim was sent, as a single begin's.
        let sent = Instant::now();
        let begun = handle.store().idem_begin_batch(&begins).await;
        drop(begins);
        // Answered after its expire, a claim may have lapsed and been taken by a twin.
        let late = sent.elapsed() >= expire;
        let failed = Pending::new(&handle, outcomes.len());
        let mut to_run = Vec::new();
        for (claim, begun) in claims.into_iter().zip(begun) {
            let (label, outcome) = match begun {
                Ok(IdemBegin::Started | IdemBegin::Retrying) if late => (
                    "fail_closed",
                    Some(BatchOutcome::Failed(lapsed("idem_begin_batch", expire))),
                ),
                Ok(IdemBegin::Started) => ("started", None),
                Ok(IdemBegin::Retrying) => ("retried", None),
                Ok(IdemBegin::InProgress) => ("in_progress", Some(BatchOutcome::InProgress)),
                Ok(IdemBegin::Unknown) => ("unknown", Some(BatchOutcome::Unknown)),
                Ok(IdemBegin::KeyReuse) => {
                    ("key_reuse", Some(BatchOutcome::Failed(Error::KeyReuse)))
                }
                Ok(IdemBegin::Done(bytes)) => ("replayed", Some(replayed(&claim.key, &bytes))),
                Err(err) => ("fail_closed", Some(BatchOutcome::Failed(err))),
            };
            record_outcome(&scope, label);
            match outcome {
                None => to_run.push(claim),
                Some(outcome) => {
                    // Not this batch's to undo, unless the claim may have written it.
                    if matches!(outcome, BatchOutcome::Failed(_)) && label == "fail_closed" {
                        failed.put(&claim);
                    }
                    pending.take(claim.index);
                    outcomes[claim.index] = Some(outcome);
                }
            }
        }
        // Undone now, so a redelivery of those messages need not wait for their expire.
        if !failed.is_noop() {
            Undo::armed(failed).now().await;
        }
        // Shared by the bodies in flight; called only for a message about to run.
        let body = Mutex::new(body);
        let runs = futures_util::stream::iter(to_run.into_iter().map(|claim| {
            run_claimed(
                &handle, &scope, &pending, claim, sent, expire, timeout, &body,
            )
        }))
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await;
        for (index, outcome) in runs {
            outcomes[index] = Some(outcome);
        }
        // What is left is claims whose renewal failed: undone for their redelivery.
        undo.now().await;
        Ok(outcomes
            .into_iter()
            .map(|outcome| {
                outcome.unwrap_or_else(|| {
                    BatchOutcome::Failed(Error::Config("message left without an outcome".into()))
                })
            })
            .collect())
    }
}

/// A message this batch claims: its record and the owner id of its execution.
struct Claim {
    index: usize,
    key: Key,
    owner: String,
    fingerprint: String,
}

/// Runs one claimed message's body as a single execution, renewing its claim first when
/// the batch has run long enough for its first renewal to be due.
#[allow(clippy::too_many_arguments)]
async fn run_claimed<T, E, F, Fut>(
    handle: &Redguard,
    scope: &str,
    pending: &Pending,
    claim: Claim,
    mut sent: Instant,
    expire: Duration,
    timeout: Option<Duration>,
    body: &Mutex<F>,
) -> (usize, BatchOutcome<T, E>)
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    T: Serialize + DeserializeOwned,
    E: From<Error> + Classify,
{
    if sent.elapsed() >= expire / 3 {
        let renewing = Instant::now();
        match handle
            .store()
            .idem_renew(&claim.key, &claim.owner, expire)
            .await
        {
            Ok(true) => sent = renewing,
            Ok(false) => {
                // Expired (and perhaps claimed by a twin) before its turn: not ours any more.
                pending.take(claim.index);
                return (
                    claim.index,
                    BatchOutcome::Failed(lapsed("idem_renew", expire)),
                );
            }
            // Left pending: undone when the batch ends.
            Err(err) => return (claim.index, BatchOutcome::Failed(err)),
        }
    }
    // No await between this and the execution's own undo, which it arms on its first poll.
    pending.take(claim.index);
    let run = (body.lock().unwrap_or_else(PoisonError::into_inner))(claim.index);
    let execution = Execution {
        handle: handle.clone(),
        scope: scope.to_owned(),
        owner: claim.owner,
        record: Some(claim.key),
        token: None,
        sent,
        expire,
        timeout,
        replicas: None,
    };
    (claim.index, BatchOutcome::Ran(execution.run(run).await))
}

fn lapsed(op: &'static str, expire: Duration) -> Error {
    Error::Backend(BackendError::Timeout { op, after: expire })
}

fn replayed<T: DeserializeOwned, E>(key: &Key, bytes: &[u8]) -> BatchOutcome<T, E> {
    match serde_json::from_slice(bytes) {
        Ok(value) => BatchOutcome::Replayed(value),
        Err(err) => BatchOutcome::Failed(Error::Corrupt {
            key: key.to_string(),
            detail: format!(
                "the stored result does not deserialize as {}: {err}",
                std::any::type_name::<T>()
            ),
        }),
    }
}

/// A record's key and the owner id a claim gave it.
type Owned = (Key, String);

/// The claims a batch has made (or may have made) and no execution owns yet, by message
/// position; undone (removed if still the claimer's PROCESSING record) when dropped armed.
#[derive(Debug, Clone)]
struct Pending {
    claims: Arc<Mutex<Vec<Option<Owned>>>>,
    handle: Redguard,
}

impl Pending {
    fn new(handle: &Redguard, len: usize) -> Pending {
        Pending {
            claims: Arc::new(Mutex::new(vec![None; len])),
            handle: handle.clone(),
        }
    }

    fn put(&self, claim: &Claim) {
        self.lock()[claim.index] = Some((claim.key.clone(), claim.owner.clone()));
    }

    fn take(&self, index: usize) {
        self.lock()[index] = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<Owned>>> {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Compensate for Pending {
    const ABANDONED: &'static str =
        "idempotency batch abandoned outside a Tokio runtime; its claims expire";

    fn is_noop(&self) -> bool {
        self.lock().iter().all(Option::is_none)
    }

    async fn undo(self) {
        let claims: Vec<Owned> = self.lock().iter_mut().filter_map(Option::take).collect();
        let store = self.handle.store();
        let undone = futures_util::future::join_all(
            claims
                .iter()
                .map(|(key, owner)| store.idem_abandon(key, owner)),
        )
        .await;
        for ((key, _), result) in claims.iter().zip(undone) {
            if let Err(err) = result {
                tracing::warn!(guard = "idem", %key, error = %err, "could not undo a batch claim whose outcome is unknown; the record expires");
            }
        }
    }
}
