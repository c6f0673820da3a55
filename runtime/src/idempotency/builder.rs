//! What a caller asks for: the intent's key and scope, how long its record lives, what
//! fingerprints its payload, the token it consumes; and `run`, built on the begin
//! (`begin.rs`) and the execution (`execution.rs`).

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::begin::Begun;
use super::{Classify, DEFAULT_IDEMPOTENCY_SCOPE, fingerprint};
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{IntoKey, KeyBody, KeyBuilder};

/// One guarded execution, built per call by [`idempotency`](crate::idempotency()) or
/// [`Redguard::idempotency`]. The attribute `#[idempotent]` builds the same thing; use this
/// directly where the guarded unit is not a fn (a message consumer loop, say).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use std::time::Duration;
///
/// let rg = redguard::Redguard::memory();
/// let mut runs = 0;
/// for _delivery in 0..3 {
///     // The broker redelivers message 42 three times; it is processed once.
///     let total: u64 = rg
///         .idempotency(redguard::key("msg:{id}").part("id", &42u64))
///         .scope("billing-consumer")
///         .expire(Duration::from_secs(3600))
///         .run(async {
///             runs += 1;
///             Ok::<_, redguard::Error>(1999)
///         })
///         .await?;
///     assert_eq!(total, 1999);
/// }
/// assert_eq!(runs, 1);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "an Idempotency does nothing until `.run(body).await`"]
pub struct Idempotency {
    pub(super) handle: Option<Redguard>,
    pub(super) scope: String,
    pub(super) key: Option<Result<KeyBody>>,
    pub(super) expire: Duration,
    pub(super) fingerprint: Result<String>,
    pub(super) timeout: Option<Duration>,
    pub(super) token: Option<(String, Result<KeyBody>)>,
    /// `(count, timeout)` as given, checked when the guard runs.
    pub(super) replicas: Option<(u32, Duration)>,
    /// How long a duplicate waits for the first execution (see `wait.rs`); zero: not at all.
    pub(super) wait: Duration,
}

impl Redguard {
    /// Starts an idempotent execution of the intent `key` on this handle; see
    /// [`Idempotency`].
    pub fn idempotency(&self, key: impl IntoKey) -> Idempotency {
        Idempotency::parts(DEFAULT_IDEMPOTENCY_SCOPE.to_owned(), Some(key.into_key())).on(self)
    }
}

impl Idempotency {
    pub(crate) fn parts(scope: String, key: Option<Result<KeyBody>>) -> Self {
        Idempotency {
            handle: None,
            scope,
            key,
            expire: Duration::from_secs(24 * 3600),
            fingerprint: Ok(String::new()),
            timeout: None,
            token: None,
            replicas: None,
            wait: Duration::ZERO,
        }
    }

    /// The key's scope: the operation it guards, so two operations never share records. A
    /// `&'static str` or a `String`; default [`DEFAULT_IDEMPOTENCY_SCOPE`] (`#[idempotent]`
    /// uses the fn's path).
    pub fn scope(mut self, scope: impl Into<Cow<'static, str>>) -> Self {
        self.scope = scope.into().into_owned();
        self
    }

    /// Runs on `handle` instead of the current one.
    pub fn on(mut self, handle: &Redguard) -> Self {
        self.handle = Some(handle.clone());
        self
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

    /// A duplicate that finds the intent in progress waits up to `wait` (at most 60 s) for
    /// the first execution to end, instead of returning [`Error::InProgress`] at once: it is
    /// woken when that execution records its outcome, then gets the replay of a SUCCESS, runs
    /// the retry a business failure allows (one waiter wins it; the others wait on for its
    /// outcome), or [`Error::OutcomeUnknown`] for an unknown outcome. When `wait` runs out
    /// first, [`Error::InProgress`] as without it. Default zero: do not wait. See the guide,
    /// [Waiting duplicates](crate::guide::idempotency#waiting-duplicates).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// let rg = redguard::Redguard::memory();
    /// let charge = || {
    ///     rg.idempotency(redguard::key("charge:{id}").part("id", &5u64))
    ///         .scope("charges")
    ///         .wait(Duration::from_secs(2))
    /// };
    /// let first = charge().run(async {
    ///     tokio::time::sleep(Duration::from_millis(50)).await;
    ///     Ok::<_, redguard::Error>(500)
    /// });
    /// // Arrives while the first runs: waits for it, and gets its result without running.
    /// let duplicate = charge().run(async { Ok::<_, redguard::Error>(0) });
    /// let (first, duplicate) = tokio::join!(first, duplicate);
    /// assert_eq!((first?, duplicate?), (500, 500));
    /// # Ok(()) }
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Counts the PROCESSING record (the begin) and the SUCCESS or FAIL outcome only once
    /// `count` replicas have them, waiting up to `timeout` (Redis `WAIT`, on the connection
    /// and node that wrote the record; see [`Replicas`](crate::store::Replicas)). Without it a master
    /// that fails right after the begin or the outcome can be replaced by a replica without
    /// them: a retry then runs the body a second time.
    ///
    /// A begin that too few confirm is undone, and the idempotency
    /// [`FailMode`](crate::handle::FailMode) applies as for a store that cannot answer: closed (the
    /// default) returns [`Error::Backend`] with
    /// [`BackendError::Unconfirmed`](crate::BackendError::Unconfirmed) and the body does not
    /// run; open runs it without a record. An outcome that too few confirm stays recorded on
    /// the master and the body's result is still returned (the body ran; an error would only
    /// invite a retry), logged at warn and counted in `redguard_backend_errors_total` with
    /// outcome `unconfirmed`. `count` is 1 to 16; `timeout` 1 ms to 10 s and at most half the
    /// handle's [`timeout`](crate::handle::Builder::timeout). The memory store has no replicas and
    /// counts every write as confirmed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// let rg = redguard::Redguard::memory();
    /// let n = rg
    ///     .idempotency(redguard::key("refund:{id}").part("id", &9u64))
    ///     .scope("refunds")
    ///     .replicas(1, Duration::from_millis(50))
    ///     .run(async { Ok::<_, redguard::Error>(9) })
    ///     .await?;
    /// assert_eq!(n, 9);
    /// # Ok(()) }
    /// ```
    pub fn replicas(mut self, count: u32, timeout: Duration) -> Self {
        self.replicas = Some((count, timeout));
        self
    }

    /// Token mode: consume `token` (issued for `scene` by [`tokens()`](crate::tokens())) once
    /// the record is begun, when the body is about to run: a replay, a request in progress or
    /// a refusal leaves it unused. Already used is [`Error::TokenUsed`], unknown or forged
    /// [`Error::TokenUnknown`], issued for another scene [`Error::TokenMismatch`].
    ///
    /// A body that fails with a business error ([`ErrorClass::Business`](crate::idempotency::ErrorClass::Business):
    /// out of stock, a busy lock) gives the token back, for the retry its error invites; an
    /// indeterminate error, a timeout or an unknown outcome keeps it used.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// use redguard::idempotency::ErrorClass;
    /// type BoxError = Box<dyn std::error::Error + Send + Sync>;
    ///
    /// let rg = redguard::Redguard::memory();
    /// let token = rg.tokens().issue("order-submit", Duration::from_secs(600)).await?;
    /// let out_of_stock = rg
    ///     .idempotency(redguard::key("order:{id}").part("id", &7u64))
    ///     .token("order-submit", &token)
    ///     .run(async { Err::<u32, BoxError>(ErrorClass::Business.into()) })
    ///     .await;
    /// assert!(out_of_stock.is_err());
    /// // Given back: still usable once.
    /// rg.tokens().consume("order-submit", &token).await?;
    /// # Ok(()) }
    /// ```
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
    /// let rg = redguard::Redguard::memory();
    /// let placed = rg
    ///     .idempotency(redguard::key("order:{id}").part("id", &7u64))
    ///     .scope("orders")
    ///     .expire(Duration::from_secs(600))
    ///     .detach()
    ///     .run(async { Ok::<_, redguard::Error>(7) })
    ///     .await?;
    /// assert_eq!(placed, 7);
    /// # Ok(()) }
    /// ```
    pub fn detach(self) -> Detached {
        Detached { guard: self }
    }

    /// Runs `body` at most once per intent, on its handle (see [`on`](Idempotency::on)) or
    /// the current one: begins, runs the body, records its outcome. A replayed result is
    /// marked for [`track_replay`](super::track_replay).
    pub async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Classify,
    {
        let handle = self.handle()?;
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

    pub(super) fn handle(&self) -> Result<Redguard> {
        crate::handle::need_runtime()?;
        match &self.handle {
            Some(handle) => Ok(handle.clone()),
            None => Redguard::current(),
        }
    }
}

/// An [`Idempotency`] whose body runs in its own task; see [`Idempotency::detach`].
#[derive(Debug)]
#[must_use = "a Detached does nothing until `.run(body).await`"]
pub struct Detached {
    pub(super) guard: Idempotency,
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
        let handle = self.guard.handle()?;
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
