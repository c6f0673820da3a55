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

mod classify;
mod keep_alive;
mod replay;

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use tracing::Instrument;

use self::keep_alive::KeepAlive;
use crate::degrade::Degrade;
use crate::error::{BackendError, Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, Key, KeyBody, KeyBuilder};
use crate::store::{Begin, Finish, IdemBegin, IdemFinish, IdemFinished};
use crate::tokens;
use crate::values::Replicas;

pub use self::classify::{Classify, ErrorClass};
pub use self::replay::track_replay;

pub use redguard_grammar::idempotency::{MAX_EXPIRE, MIN_EXPIRE};

/// One guarded execution, built per call. The attribute `#[idempotent]` builds the same thing;
/// use this directly where the guarded unit is not a fn (a message consumer loop, say).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use std::time::Duration;
/// use redguard::{Idempotency, KeyBuilder, Redguard};
///
/// let rg = Redguard::memory();
/// let mut runs = 0;
/// for _delivery in 0..3 {
///     // The broker redelivers message 42 three times; it is processed once.
///     let key = KeyBuilder::new().text("msg:").part("id", &42u64).finish()?;
///     let total: u64 = rg
///         .scope(
///             Idempotency::new("billing-consumer", key)
///                 .expire(Duration::from_secs(3600))
///                 .run(async {
///                     runs += 1;
///                     Ok::<_, redguard::Error>(1999)
///                 }),
///         )
///         .await?;
///     assert_eq!(total, 1999);
/// }
/// assert_eq!(runs, 1);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "an Idempotency does nothing until `.run(body).await`"]
pub struct Idempotency {
    scope: String,
    key: Option<Result<KeyBody>>,
    expire: Duration,
    fingerprint: Result<String>,
    timeout: Option<Duration>,
    token: Option<(String, Result<KeyBody>)>,
    /// `(count, timeout)` as given, checked when the guard runs.
    replicas: Option<(u32, Duration)>,
}

impl Idempotency {
    /// A guard for the intent `key` within `scope` (which names the operation, so two
    /// operations never share records). The record lives 24 hours unless [`expire`] says
    /// otherwise.
    ///
    /// [`expire`]: Idempotency::expire
    pub fn new(scope: impl Into<String>, key: KeyBody) -> Self {
        Idempotency::parts(scope.into(), Some(Ok(key)))
    }

    pub(crate) fn parts(scope: String, key: Option<Result<KeyBody>>) -> Self {
        Idempotency {
            scope,
            key,
            expire: Duration::from_secs(24 * 3600),
            fingerprint: Ok(String::new()),
            timeout: None,
            token: None,
            replicas: None,
        }
    }

    /// How long the record lives after each transition (1 s to 7 days). It bounds how long a
    /// retry is answered from the record, and how long an execution with an unknown outcome
    /// (or a crashed one) blocks retries unless an operator resolves it.
    pub fn expire(mut self, expire: Duration) -> Self {
        self.expire = expire;
        self
    }

    /// Fingerprints the request: the same key with a different payload is
    /// [`Error::KeyReuse`] and the body does not run. The fingerprint is a SHA-256 of the
    /// payload's JSON serialization, so leave out volatile fields (timestamps, trace ids) and
    /// use ordered maps (`BTreeMap`), or every retry looks like a new payload.
    pub fn payload<P: Serialize + ?Sized>(mut self, payload: &P) -> Self {
        self.fingerprint = fingerprint(payload);
        self
    }

    /// Bounds the body. Elapsing is an unknown outcome: the call returns [`Error::Timeout`] and
    /// the record becomes UNKNOWN.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Counts the PROCESSING record (the begin) and the SUCCESS or FAIL outcome only once
    /// `count` replicas have them, waiting up to `timeout` (Redis `WAIT`, on the connection
    /// and node that wrote the record; see [`Replicas`]). Without it a master
    /// that fails right after the begin or the outcome can be replaced by a replica without
    /// them: a retry then runs the body a second time.
    ///
    /// A begin that too few confirm is undone, and the idempotency
    /// [`FailMode`](crate::FailMode) applies as for a store that cannot answer: closed (the
    /// default) returns [`Error::Backend`] with
    /// [`BackendError::Unconfirmed`] and the body does not
    /// run; open runs it without a record. An outcome that too few confirm stays recorded on
    /// the master and the body's result is still returned (the body ran; an error would only
    /// invite a retry), logged at warn and counted in `redguard_backend_errors_total` with
    /// outcome `unconfirmed`. `count` is 1 to 16; `timeout` 1 ms to 10 s and at most half the
    /// handle's [`timeout`](crate::Builder::timeout). The memory store has no replicas and
    /// counts every write as confirmed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// use redguard::{Idempotency, KeyBuilder, Redguard};
    ///
    /// let key = KeyBuilder::new().text("refund:").part("id", &9u64).finish()?;
    /// let guard = Idempotency::new("refunds", key).replicas(1, Duration::from_millis(50));
    /// let n = Redguard::memory().scope(guard.run(async { Ok::<_, redguard::Error>(9) })).await?;
    /// assert_eq!(n, 9);
    /// # Ok(()) }
    /// ```
    pub fn replicas(mut self, count: u32, timeout: Duration) -> Self {
        self.replicas = Some((count, timeout));
        self
    }

    /// Token mode: consume `token` (issued for `scene` by [`tokens()`](crate::tokens()))
    /// atomically before the body runs. A body that fails does not give the token back.
    pub fn token(mut self, scene: impl Into<String>, token: &str) -> Self {
        let token = KeyBuilder::new().part("token", token).finish();
        self.token = Some((scene.into(), token));
        self
    }

    /// Token mode with the token rendered from a template by the attribute.
    pub(crate) fn token_body(mut self, scene: &str, token: Result<KeyBody>) -> Self {
        self.token = Some((scene.to_owned(), token));
        self
    }

    /// Runs the body in its own task, so it completes and its outcome is recorded even when
    /// the caller's future is dropped (an HTTP client that disconnected mid-request: its retry
    /// then gets the result instead of [`Error::OutcomeUnknown`]).
    ///
    /// Opt-in, because the body must then be `Send + 'static` (own its data: no borrowed
    /// parameters, `Arc<Self>` rather than `&self`), and because it keeps running after its
    /// caller is gone. Put it outside any lock: a lock the caller holds is released when the
    /// caller is dropped, while the detached body goes on. The body sees the handle the caller
    /// used, but no other task-local state of the caller.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// use redguard::{Idempotency, KeyBuilder, Redguard};
    ///
    /// let rg = Redguard::memory();
    /// let key = KeyBuilder::new().text("order:").part("id", &7u64).finish()?;
    /// let placed = rg
    ///     .scope(Idempotency::new("orders", key).expire(Duration::from_secs(600)).detach().run(async {
    ///         Ok::<_, redguard::Error>(7)
    ///     }))
    ///     .await?;
    /// assert_eq!(placed, 7);
    /// # Ok(()) }
    /// ```
    pub fn detach(self) -> Detached {
        Detached { guard: self }
    }

    /// Runs `body` at most once per intent on the current handle (see
    /// [`Redguard::current`]). A replayed result is marked for [`track_replay`].
    pub async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Classify,
    {
        let handle = Redguard::current()?;
        let span = crate::trace::idempotent(&self.scope, handle.store().kind().as_str());
        async move {
            match self.begin(&handle).await? {
                Begun::Replayed(value) => Ok(value),
                Begun::Run(execution) => execution.run(body).await,
            }
        }
        .instrument(span)
        .await
    }

    /// Checks the settings, renders the keys, and begins: records PROCESSING (or finds the
    /// intent in progress, done, or reused), then consumes the token. Whatever is left half
    /// done when this returns early or is dropped — a begin or a token whose outcome is
    /// unknown, a record begun for a token that was refused — is undone.
    async fn begin<T, E>(self, handle: &Redguard) -> Result<Begun<T>, E>
    where
        T: DeserializeOwned,
        E: From<Error>,
    {
        redguard_grammar::idempotency::expire(self.expire).map_err(Error::Config)?;
        if let Some(timeout) = self.timeout {
            redguard_grammar::idempotency::timeout(timeout).map_err(Error::Config)?;
        }
        let replicas = self
            .replicas
            .map(|(count, timeout)| Replicas::new(count, timeout))
            .transpose()?;
        let twin;
        let handle = if replicas.is_some() {
            twin = handle.for_replicas().await;
            &twin
        } else {
            handle
        };
        let fingerprint = self.fingerprint?;
        let key = match self.key {
            Some(body) => Some(handle.key(GuardKind::Idempotency, &self.scope, &body?)?),
            None => None,
        };
        let token = match self.token {
            Some((scene, Ok(token))) => Some(tokens::Token::new(handle, scene, &token)?),
            // A token that is not even well-formed was never issued.
            Some((_, Err(Error::InvalidKey { .. } | Error::MissingKey { .. }))) => {
                return Err(Error::TokenUnknown.into());
            }
            Some((_, Err(other))) => return Err(other.into()),
            None => None,
        };
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let store = handle.store();
        let mut undo = Undo {
            handle: handle.clone(),
            owner: owner.clone(),
            record: None,
            token: None,
        };
        let mut record = None;
        // The record's expire counts from before the begin was sent, as a lock's lease does:
        // the only origin that is never later than Redis's.
        let sent = tokio::time::Instant::now();
        if let Some(key) = key {
            // Armed before the call: a begin that fails or is dropped may still have run.
            undo.record = Some(key.clone());
            let begin = store
                .idem_begin(Begin {
                    key: &key,
                    owner: &owner,
                    fingerprint: &fingerprint,
                    ttl: self.expire,
                    replicas,
                })
                .await
                .or_degrade(handle, GuardKind::Idempotency, "idem_begin", &key);
            let outcome = match &begin {
                Ok(None) => "fail_open",
                Ok(Some(IdemBegin::Started)) => "started",
                Ok(Some(IdemBegin::Retrying)) => "retried",
                Ok(Some(IdemBegin::InProgress)) => "in_progress",
                Ok(Some(IdemBegin::Unknown)) => "unknown",
                Ok(Some(IdemBegin::Done(_))) => "replayed",
                Ok(Some(IdemBegin::KeyReuse)) => "key_reuse",
                Err(_) => "fail_closed",
            };
            record_outcome(&self.scope, outcome);
            tracing::debug!(guard = "idem", %key, outcome);
            match begin? {
                // The store is down and the policy is fail-open: run without a record (the
                // begin, which may still run, is undone).
                None => {}
                // Answered after its expire: the record may have lapsed and been begun by a
                // twin meanwhile, so the body must not run on it (the begin is undone).
                Some(IdemBegin::Started | IdemBegin::Retrying) if sent.elapsed() >= self.expire => {
                    return Err(Error::Backend(BackendError::Timeout {
                        op: "idem_begin",
                        after: self.expire,
                    })
                    .into());
                }
                Some(IdemBegin::Started | IdemBegin::Retrying) => record = Some(key),
                Some(IdemBegin::InProgress) => {
                    undo.record = None;
                    return Err(Error::InProgress.into());
                }
                Some(IdemBegin::Unknown) => {
                    undo.record = None;
                    return Err(Error::OutcomeUnknown.into());
                }
                Some(IdemBegin::KeyReuse) => {
                    undo.record = None;
                    return Err(Error::KeyReuse.into());
                }
                Some(IdemBegin::Done(result)) => {
                    undo.record = None;
                    replay::mark();
                    return serde_json::from_slice(&result)
                        .map(Begun::Replayed)
                        .map_err(|err| {
                            Error::Corrupt {
                                key: key.to_string(),
                                detail: format!(
                                    "the stored result does not deserialize as {}: {err}",
                                    std::any::type_name::<T>()
                                ),
                            }
                            .into()
                        });
                }
            }
        }
        // The token is consumed only when the body is about to run: a replay, a request in
        // progress or a refusal above leaves it for the retry.
        if let Some(token) = &token {
            undo.token = Some(token.clone());
            let consumed = token.consume(handle, &owner).await;
            if let Err(refused @ (Error::TokenUsed | Error::TokenUnknown | Error::TokenMismatch)) =
                consumed
            {
                // Definite: nothing of the token changed; the record begun for it goes now,
                // so the same key can carry a valid token right after.
                undo.token = None;
                undo.now().await;
                return Err(refused.into());
            }
            consumed?;
        }
        undo.token = None;
        // The execution owns what was begun; a fail-open begin stays armed and is undone.
        if record.is_some() {
            undo.record = None;
        }
        Ok(Begun::Run(Execution {
            handle: handle.clone(),
            scope: self.scope,
            owner,
            record,
            token,
            sent,
            expire: self.expire,
            timeout: self.timeout,
            replicas,
        }))
    }
}

/// An [`Idempotency`] whose body runs in its own task; see [`Idempotency::detach`].
#[derive(Debug)]
#[must_use = "a Detached does nothing until `.run(body).await`"]
pub struct Detached {
    guard: Idempotency,
}

impl Detached {
    /// Like [`Idempotency::run`], with the body (and the recording of its outcome) in a
    /// task of its own that outlives the caller's future.
    pub async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: From<Error> + Classify + Send + 'static,
    {
        let handle = Redguard::current()?;
        let span = crate::trace::idempotent(&self.guard.scope, handle.store().kind().as_str());
        let execution = match self.guard.begin(&handle).instrument(span.clone()).await? {
            Begun::Replayed(value) => return Ok(value),
            Begun::Run(execution) => execution,
        };
        // Scoped, so guards inside the body find the caller's handle.
        let task = tokio::spawn(handle.scope(execution.run(body)).instrument(span));
        match task.await {
            Ok(result) => result,
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => Err(Error::Cancelled.into()),
        }
    }
}

enum Begun<T> {
    /// A SUCCESS record's result.
    Replayed(T),
    /// The body is to run.
    Run(Execution),
}

/// Undoes what a begin left unknown or half done, when dropped armed (the call failed, or
/// its future was dropped): spawned after it on the same connection, so the store applies it
/// after whatever the begin did.
struct Undo {
    handle: Redguard,
    owner: String,
    /// A record begun (or perhaps begun) by `owner`.
    record: Option<Key>,
    /// A token consumed (or perhaps consumed) by `owner`.
    token: Option<tokens::Token>,
}

impl Undo {
    fn disarm(&mut self) -> Option<(Redguard, String, Option<Key>, Option<tokens::Token>)> {
        if self.record.is_none() && self.token.is_none() {
            return None;
        }
        Some((
            self.handle.clone(),
            std::mem::take(&mut self.owner),
            self.record.take(),
            self.token.take(),
        ))
    }

    /// Undoes now, waiting for it. Armed until it is done: a caller dropped meanwhile leaves
    /// the undo to `Drop`, which sends it again (each step names its owner, so a second
    /// undo changes nothing).
    async fn now(mut self) {
        let (handle, owner) = (self.handle.clone(), self.owner.clone());
        undo(handle, owner, self.record.clone(), self.token.clone()).await;
        self.disarm();
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        let Some((handle, owner, record, token)) = self.disarm() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => clean_up(&runtime, undo(handle, owner, record, token)),
            Err(_) => tracing::debug!(
                guard = "idem",
                "begin abandoned outside a Tokio runtime; its record expires"
            ),
        }
    }
}

async fn undo(handle: Redguard, owner: String, record: Option<Key>, token: Option<tokens::Token>) {
    if let Some(token) = token {
        token.restore(&handle, &owner).await;
    }
    if let Some(key) = record
        && let Err(err) = handle.store().idem_abandon(&key, &owner).await
    {
        tracing::warn!(guard = "idem", %key, error = %err, "could not undo a begin whose outcome is unknown; the record expires");
    }
}

/// A begun execution: the body to run, and the record and token it owns.
struct Execution {
    handle: Redguard,
    scope: String,
    owner: String,
    /// The PROCESSING record, or `None` (token-only mode, or a fail-open begin).
    record: Option<Key>,
    /// When the begin was sent: the origin of the record's expire and of its renewals.
    sent: tokio::time::Instant,
    token: Option<tokens::Token>,
    expire: Duration,
    timeout: Option<Duration>,
    replicas: Option<Replicas>,
}

impl Execution {
    /// Runs `body`, keeping the record alive meanwhile, and records how it ended.
    async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Classify,
    {
        let mut verdict = None;
        let mut keep_alive = None;
        if let Some(key) = &self.record {
            // Dropped while the keep-alive starts, the body has not run: undo the begin.
            let mut undo = Undo {
                handle: self.handle.clone(),
                owner: self.owner.clone(),
                record: Some(key.clone()),
                token: self.token.clone(),
            };
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
            verdict = Some(Verdict::armed(&self, key.clone()));
        }
        let outcome = run_bounded(body, self.timeout).await;
        drop(keep_alive);
        let result = match outcome {
            Bounded::Finished(result) => result,
            Bounded::TimedOut(after) => {
                if let Some(verdict) = verdict {
                    verdict.record(Outcome::Unknown).await;
                }
                return Err(Error::Timeout { after }.into());
            }
        };
        let business = matches!(&result, Err(err) if err.class() == ErrorClass::Business);
        if let (Some(verdict), Some(key)) = (verdict, &self.record) {
            // Decided before the await: the future holds no reference to the result.
            let outcome = self.outcome(key, &result);
            verdict.record(outcome).await;
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
/// future was dropped mid-body or mid-finish), it records what is known (see [`clean_up`]):
/// UNKNOWN while the body runs, the body's outcome once it returned. Sent after
/// the finish it may follow on the same connection, so the store applies it after that
/// finish, which then owns the record (the second finish changes nothing).
struct Verdict {
    handle: Redguard,
    scope: String,
    key: Key,
    owner: String,
    expire: Duration,
    replicas: Option<Replicas>,
    armed: Option<Outcome>,
}

impl Verdict {
    fn armed(execution: &Execution, key: Key) -> Verdict {
        Verdict {
            handle: execution.handle.clone(),
            scope: execution.scope.clone(),
            key,
            owner: execution.owner.clone(),
            expire: execution.expire,
            replicas: execution.replicas,
            armed: Some(Outcome::Unknown),
        }
    }

    /// Records `outcome`, armed with it until the store answered.
    async fn record(mut self, outcome: Outcome) {
        self.armed = Some(outcome.clone());
        finish(
            &self.handle,
            &self.scope,
            &self.key,
            &self.owner,
            outcome,
            self.expire,
            self.replicas,
        )
        .await;
        self.armed = None;
    }
}

impl Drop for Verdict {
    fn drop(&mut self) {
        let Some(outcome) = self.armed.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(guard = "idem", key = %self.key, "execution abandoned outside a Tokio runtime; its record expires");
            return;
        };
        let (handle, scope, key, owner) = (
            self.handle.clone(),
            std::mem::take(&mut self.scope),
            self.key.clone(),
            std::mem::take(&mut self.owner),
        );
        let (expire, replicas) = (self.expire, self.replicas);
        clean_up(&runtime, async move {
            finish(&handle, &scope, &key, &owner, outcome, expire, replicas).await;
        });
    }
}

/// Runs what a drop left to do as far as it goes at once, the rest in a task of its own.
/// Polled in place, a store that answers at once (memory) has applied it before the drop
/// returns, and Redis has it queued on the connection right behind the call it follows: a
/// retry made next sees it done, however long a loaded machine takes to run the task.
fn clean_up(runtime: &tokio::runtime::Handle, cleanup: impl Future<Output = ()> + Send + 'static) {
    let mut cleanup = Box::pin(cleanup);
    // Not while unwinding (a body that panicked): a panic of the cleanup would abort.
    if !std::thread::panicking() {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if cleanup.as_mut().poll(&mut cx).is_ready() {
            return;
        }
    }
    drop(runtime.spawn(cleanup));
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

fn record_outcome(scope: &str, outcome: &'static str) {
    crate::trace::record("outcome", outcome);
    metrics::counter!("redguard_idempotency_total", "scope" => scope.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// Starts an [`Idempotency`] for `key` in `scope` (see there).
pub fn idempotency(scope: impl Into<String>, key: KeyBody) -> Idempotency {
    Idempotency::new(scope, key)
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

/// SHA-256 of the JSON serialization, first 128 bits as hex.
pub(crate) fn fingerprint<P: Serialize + ?Sized>(payload: &P) -> Result<String> {
    let json = serde_json::to_vec(payload).map_err(|err| {
        Error::Config(format!("the idempotency payload does not serialize: {err}"))
    })?;
    let digest = Sha256::digest(&json);
    Ok(digest[..16].iter().map(|b| format!("{b:02x}")).collect())
}
