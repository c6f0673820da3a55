//! The idempotency guard: the same business intent runs once; retries get the first result.
//!
//! One execution is: `begin` (one store op) → run the body → `finish` (one store op).
//! `begin` finds no record (run), a PROCESSING one ([`Error::InProgress`]), a SUCCESS one
//! (replay its result without running), or a FAIL one (take it over and run again). `finish`
//! records SUCCESS with the result or FAIL — but only for a *definitive* outcome. A timeout, a
//! panic, a dropped future or an error the user classifies as indeterminate leaves the record
//! PROCESSING until it expires: the outcome is unknown, so a retry must not run blindly.

mod classify;
mod replay;

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::degrade::Degrade;
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, KeyBody, KeyBuilder};
use crate::store::{IdemBegin, IdemFinish, IdemFinished};

pub use self::classify::{Classify, ErrorClass};
pub use self::replay::track_replay;

/// Longest an idempotency record may live.
pub const MAX_EXPIRE: Duration = Duration::from_secs(7 * 24 * 3600);

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
        }
    }

    /// How long the record lives after each transition (1 s to 7 days). It bounds how long a
    /// retry is answered from the record, and how long an execution with an unknown outcome
    /// blocks retries.
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
    /// the record stays PROCESSING until it expires.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Token mode: consume `token` (issued for `scene` by [`tokens()`](crate::tokens))
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

    /// Runs `body` at most once per intent on the current handle (see
    /// [`Redguard::current`]). A replayed result is marked for [`track_replay`].
    pub async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Classify,
    {
        let handle = Redguard::current()?;
        self.run_on(&handle, body).await
    }

    async fn run_on<T, E, F>(self, handle: &Redguard, body: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Classify,
    {
        if self.expire < Duration::from_secs(1) || self.expire > MAX_EXPIRE {
            return Err(Error::Config(format!(
                "idempotency records must expire within 1 s to 7 days, got {:?}",
                self.expire
            ))
            .into());
        }
        let fingerprint = self.fingerprint?;
        let key = match self.key {
            Some(body) => Some(handle.key(GuardKind::Idempotency, &self.scope, &body?)?),
            None => None,
        };
        if let Some((scene, token)) = self.token {
            let token = match token {
                Ok(token) => token,
                Err(Error::InvalidKey { .. } | Error::MissingKey { .. }) => {
                    return Err(Error::TokenUnknown.into());
                }
                Err(other) => return Err(other.into()),
            };
            handle.tokens().consume(&scene, token.as_str()).await?;
        }
        let Some(key) = key else {
            // Token mode alone: the token was the guard.
            return finished(run_bounded(body, self.timeout).await);
        };

        let owner = uuid::Uuid::new_v4().simple().to_string();
        let store = handle.store();
        let begin = store
            .idem_begin(&key, &owner, &fingerprint, self.expire)
            .await
            .or_degrade(handle, GuardKind::Idempotency, "idem_begin", &key)?;
        let outcome = match begin {
            None => "fail_open",
            Some(IdemBegin::Started) => "started",
            Some(IdemBegin::Retrying) => "retried",
            Some(IdemBegin::InProgress) => "in_progress",
            Some(IdemBegin::Done(_)) => "replayed",
            Some(IdemBegin::KeyReuse) => "key_reuse",
        };
        metrics::counter!("redguard_idempotency_total", "scope" => self.scope.clone(), "outcome" => outcome)
            .increment(1);
        tracing::debug!(guard = "idem", %key, outcome);
        match begin {
            // The store is down and the policy is fail-open: run without a record.
            None => return finished(run_bounded(body, self.timeout).await),
            Some(IdemBegin::Started | IdemBegin::Retrying) => {}
            Some(IdemBegin::InProgress) => return Err(Error::InProgress.into()),
            Some(IdemBegin::KeyReuse) => return Err(Error::KeyReuse.into()),
            Some(IdemBegin::Done(result)) => {
                replay::mark();
                return serde_json::from_slice(&result).map_err(|err| {
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

        let result = match run_bounded(body, self.timeout).await {
            Bounded::Finished(result) => result,
            // Unknown outcome: keep PROCESSING so a retry cannot run blindly.
            Bounded::TimedOut(after) => return Err(Error::Timeout { after }.into()),
        };
        let bytes;
        let finish = match &result {
            Ok(value) => match serde_json::to_vec(value) {
                Ok(serialized) => {
                    bytes = serialized;
                    Some(IdemFinish::Success(&bytes))
                }
                Err(err) => {
                    // The body succeeded but its result cannot be replayed. Marking the record
                    // FAIL would let a retry execute the intent twice; leave it PROCESSING.
                    tracing::error!(guard = "idem", %key, error = %err, "result not serializable; record left PROCESSING");
                    None
                }
            },
            Err(err) if err.class() == ErrorClass::Business => Some(IdemFinish::Fail),
            Err(_) => None,
        };
        if let Some(finish) = finish {
            match store.idem_finish(&key, &owner, finish, self.expire).await {
                Ok(IdemFinished::Recorded) => {}
                Ok(IdemFinished::NotOwner) => {
                    metrics::counter!("redguard_idempotency_lost_total", "scope" => self.scope.clone())
                        .increment(1);
                    tracing::warn!(guard = "idem", %key, "record expired or was taken over during the body; outcome not recorded");
                }
                Err(err) => {
                    metrics::counter!("redguard_backend_errors_total", "guard" => "idem", "op" => "idem_finish", "outcome" => "unrecorded")
                        .increment(1);
                    tracing::warn!(guard = "idem", %key, error = %err, "could not record the outcome; the record stays PROCESSING until it expires");
                }
            }
        }
        result
    }
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

fn finished<T, E: From<Error>>(outcome: Bounded<Result<T, E>>) -> Result<T, E> {
    match outcome {
        Bounded::Finished(result) => result,
        Bounded::TimedOut(after) => Err(Error::Timeout { after }.into()),
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
