//! `IdempotencyLayer`: the IETF `Idempotency-Key` draft for any route. The first request
//! with a key runs; its response is recorded and replayed to every retry with the same key
//! and payload, across instances.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use axum::{Router, body::Body, routing::post};
//! use http::Request;
//! use redguard::http::IdempotencyLayer;
//! use tower::ServiceExt as _;
//!
//! let runs = Arc::new(AtomicUsize::new(0));
//! let counter = runs.clone();
//! let app = Router::new()
//!     .route("/orders", post(move || async move {
//!         counter.fetch_add(1, Ordering::SeqCst);
//!         (http::StatusCode::CREATED, "order 1")
//!     }))
//!     .layer(IdempotencyLayer::builder().on(&redguard::Redguard::memory()).build()?);
//!
//! let order = || {
//!     Request::post("/orders")
//!         .header("idempotency-key", "\"a6c1f2\"")
//!         .body(Body::from("{\"sku\":\"tea\"}"))
//!         .unwrap()
//! };
//! let first = app.clone().oneshot(order()).await.unwrap();
//! assert_eq!(first.status(), 201);
//! let retry = app.clone().oneshot(order()).await.unwrap();
//! assert_eq!(retry.status(), 201);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! assert_eq!(runs.load(Ordering::SeqCst), 1);
//! # Ok(()) }
//! ```
//!
//! # Responses
//!
//! | request | response |
//! |---|---|
//! | a method not guarded (default: all but `POST` and `PATCH`) | passed through |
//! | no `Idempotency-Key` | `400` (passed through with [`required(false)`](IdempotencyBuilder::required)) |
//! | a malformed key, or one breaking the key rules | `400` |
//! | a body over [`max_body`](IdempotencyBuilder::max_body) | `413` |
//! | the first with its key | runs; the response is recorded as its class or status says (below) |
//! | a retry while the first runs | `409` `in_progress`, `Retry-After: 1` (with [`wait`](IdempotencyBuilder::wait): once it runs out; the first's response replayed if it ends before) |
//! | a retry after an unknown outcome | `409` `outcome_unknown` (until an operator resolves it, or it expires) |
//! | the same key with another method, path or body | `422` `key_reuse` |
//! | a retry after a recorded success | the recorded response, with `Idempotent-Replayed: true` |
//! | the store cannot answer | `503` (the idempotency [`FailMode`](crate::handle::FailMode) is closed by default) |
//!
//! # Which outcome a response is
//!
//! A response that came from a [`redguard::Error`](crate::Error) (its `IntoResponse`, a
//! layer's [`Rejection`]) carries the error's [`ErrorClass`] in its extensions, and that
//! decides first: a busy lock's `503` ran nothing, so its retry runs. A handler marks its own
//! response the same way:
//!
//! ```
//! use http::StatusCode;
//! use redguard::ErrorClass;
//!
//! // Shed before anything was applied: a retry with this key may run.
//! let mut response = http::Response::new(());
//! *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
//! response.extensions_mut().insert(ErrorClass::Business);
//! ```
//!
//! Otherwise [`classify`](IdempotencyBuilder::classify) decides by the status; by default
//! `1xx`–`3xx` are a success (recorded: status, the
//! [`replay_headers`](IdempotencyBuilder::replay_headers) and the body); `4xx` but `408` are
//! business failures (the record is released: a retry runs again); `5xx`, `408` and a
//! [`timeout`](IdempotencyBuilder::timeout) are unknown outcomes (the record keeps it until it
//! expires or an operator resolves it; retries are refused with `409`): a failed commit may
//! have landed, so it must not run twice blindly. The guide (`redguard::guide::http`)
//! compares this with Stripe's and Powertools' choices.
//!
//! # What is sent and what is recorded
//!
//! The first response is the handler's, every header included. A replay carries the
//! recorded status, body and [`replay_headers`](IdempotencyBuilder::replay_headers) only
//! (default `Content-Type` and `Location`; values as bytes, repeated ones in order), with
//! `Idempotent-Replayed: true`. `Set-Cookie` is not replayed by default: a replay goes to
//! whoever presents the key, so a replayed cookie would hand one caller's session to another
//! (listing it needs [`per`](IdempotencyBuilder::per)).
//!
//! The request body is read whole (to fingerprint it) and handed on as a `Full<Bytes>`. A
//! successful response body is read only when it declares a length within
//! [`max_response`](IdempotencyBuilder::max_response); a longer one, or a stream of unknown
//! length (server-sent events), is passed through as it streams and not recorded: the
//! handler ran but a retry could not be given its response, so the record keeps an unknown
//! outcome and retries are refused rather than run twice. A failure's body is never read.

//! The handler runs in a task of its own by default
//! ([`Idempotency::detach`](crate::idempotency::Idempotency::detach)): a client that disconnects
//! mid-request does not cancel it, and its retry gets the recorded result.
//!
//! # Keys are per client
//!
//! Two clients that send the same key share a record. Give the layer a client identity with
//! [`per`](IdempotencyBuilder::per) (an authenticated user or tenant) so one client can
//! never be answered with another's response.
//!
//! # Order
//!
//! Put it inside [`RateLimitLayer`](super::RateLimitLayer) and inside a request body limit:
//! outermost first, `RateLimitLayer` → `RequestBodyLimitLayer` → `IdempotencyLayer` →
//! handler (the order `tower::ServiceBuilder` lists them in; `Router::layer` calls add
//! them in the reverse order).

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, Limited};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tower_layer::Layer;
use tower_service::Service;

use super::extract::KeyExtractor;
use super::headers::IDEMPOTENT_REPLAYED;
use super::idempotency_key::{IdempotencyKey, IdempotencyKeyRejection};
use super::response::{OnRejection, Rejection, ResponseBody, ResponseFuture, reject};
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::idempotency::{Classify, ErrorClass, track_replay};
use crate::key::{KeyBuilder, MAX_SCOPE_LEN, check_name};

/// Default largest request body read (1 MiB).
pub const DEFAULT_MAX_BODY: usize = 1 << 20;
/// Default largest response body recorded (1 MiB).
pub const DEFAULT_MAX_RESPONSE: usize = 1 << 20;
/// Default record lifetime: a day, the draft's suggestion for how long keys are honoured.
pub const DEFAULT_EXPIRE: Duration = Duration::from_secs(24 * 3600);

/// Headers describing the connection or the body's framing rather than the response: a
/// replay computes its own.
const FRAMING: [HeaderName; 5] = [
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::CONNECTION,
    header::TRAILER,
    header::UPGRADE,
];

type Classifier = dyn Fn(StatusCode) -> Option<ErrorClass> + Send + Sync;
type Fingerprinter = dyn Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync;

/// A tower layer applying the `Idempotency-Key` draft. See the [module docs](self).
///
/// Cheap to clone; clones share one configuration.
#[derive(Clone)]
#[must_use]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

struct Config {
    scope: String,
    expire: Duration,
    methods: Vec<Method>,
    required: bool,
    max_body: usize,
    max_response: usize,
    replay_headers: Vec<HeaderName>,
    classify: Box<Classifier>,
    fingerprint: Box<Fingerprinter>,
    per: Option<Box<dyn KeyExtractor>>,
    timeout: Option<Duration>,
    wait: Duration,
    detach: bool,
    handle: Option<Redguard>,
    on_rejection: Option<OnRejection>,
}

impl Config {
    fn reject<B>(&self, rejection: Rejection) -> Response<ResponseBody<B>> {
        reject(self.on_rejection.as_ref(), rejection)
    }

    fn rejected<B, E>(&self, rejection: Rejection) -> ResponseFuture<Response<ResponseBody<B>>, E> {
        ResponseFuture::ready(self.reject(rejection))
    }
}

/// The default classification of a response status (see the [module docs](self)): `None`
/// for a success, [`ErrorClass::Business`] for `4xx` but `408`,
/// [`ErrorClass::Indeterminate`] for `5xx` and `408`.
///
/// ```
/// use http::StatusCode;
/// use redguard::ErrorClass;
/// use redguard::http::idempotency::default_classify;
///
/// assert_eq!(default_classify(StatusCode::CREATED), None);
/// assert_eq!(default_classify(StatusCode::CONFLICT), Some(ErrorClass::Business));
/// assert_eq!(default_classify(StatusCode::BAD_GATEWAY), Some(ErrorClass::Indeterminate));
/// ```
pub fn default_classify(status: StatusCode) -> Option<ErrorClass> {
    if status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT {
        Some(ErrorClass::Indeterminate)
    } else if status.is_client_error() {
        Some(ErrorClass::Business)
    } else {
        None
    }
}

/// The default fingerprint: method, path and query, body.
fn default_fingerprint(parts: &Parts, body: &[u8]) -> Vec<u8> {
    let target = parts.uri.path_and_query().map_or("", |pq| pq.as_str());
    let mut out = Vec::with_capacity(body.len() + target.len() + 16);
    for field in [parts.method.as_str().as_bytes(), target.as_bytes(), body] {
        // Length-prefixed, so fields cannot run into one another.
        out.extend_from_slice(&(field.len() as u64).to_be_bytes());
        out.extend_from_slice(field);
    }
    out
}

/// Builds an [`IdempotencyLayer`]; start from [`IdempotencyLayer::builder`].
///
/// ```
/// use std::time::Duration;
/// use http::{Method, header};
/// use redguard::http::{HeaderKey, IdempotencyLayer};
///
/// let layer = IdempotencyLayer::builder()
///     .scope("payments")                          // records apart from other layers'
///     .expire(Duration::from_secs(6 * 3600))      // how long a key is honoured
///     .methods([Method::POST, Method::PUT])
///     .per(HeaderKey::new("x-user-id")?)          // keys are per client
///     .max_body(64 * 1024)                        // 413 above
///     .max_response(256 * 1024)                   // larger successes are not recorded
///     .replay_headers([header::CONTENT_TYPE, header::LOCATION, header::ETAG])
///     .fingerprint(|parts, body| [parts.uri.path().as_bytes(), body].concat())
///     .timeout(Duration::from_secs(10))           // then 503, outcome unknown
///     .wait(Duration::from_secs(2))               // a duplicate waits for the first's response
///     .build()?;
/// # Ok::<(), redguard::Error>(())
/// ```
#[must_use = "a builder does nothing until `.build()`"]
pub struct IdempotencyBuilder {
    config: Config,
}

impl IdempotencyLayer {
    /// Starts a layer with the defaults: scope `http`, records kept 24 h, `POST` and
    /// `PATCH` guarded, the key required, 1 MiB bodies, `Content-Type` and `Location`
    /// replayed, [`default_classify`], the handler detached.
    pub fn builder() -> IdempotencyBuilder {
        IdempotencyBuilder {
            config: Config {
                scope: "http".to_owned(),
                expire: DEFAULT_EXPIRE,
                methods: vec![Method::POST, Method::PATCH],
                required: true,
                max_body: DEFAULT_MAX_BODY,
                max_response: DEFAULT_MAX_RESPONSE,
                replay_headers: vec![header::CONTENT_TYPE, header::LOCATION],
                classify: Box::new(default_classify),
                fingerprint: Box::new(default_fingerprint),
                per: None,
                timeout: None,
                wait: Duration::ZERO,
                detach: true,
                handle: None,
                on_rejection: None,
            },
        }
    }
}

impl IdempotencyBuilder {
    /// The key scope (default `http`): layers with different scopes never share records.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.config.scope = scope.into();
        self
    }

    /// How long a record lives after each transition (1 s to 7 days; default 24 h).
    pub fn expire(mut self, expire: Duration) -> Self {
        self.config.expire = expire;
        self
    }

    /// The methods guarded (default `POST`, `PATCH`); others pass through.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Whether a guarded request without the header is refused with `400` (default) or
    /// passed through unguarded.
    pub fn required(mut self, required: bool) -> Self {
        self.config.required = required;
        self
    }

    /// The largest request body read (default 1 MiB); over it is `413`.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.config.max_body = bytes;
        self
    }

    /// The largest response body read and recorded (default 1 MiB); a success with a longer
    /// or undeclared length streams through unrecorded (see the [module docs](self)).
    pub fn max_response(mut self, bytes: usize) -> Self {
        self.config.max_response = bytes;
        self
    }

    /// The response headers recorded and replayed with status and body (default
    /// `Content-Type`, `Location`); the first response keeps all of the handler's. Framing
    /// headers (`Content-Length`, `Transfer-Encoding`, ...) are refused by `build`, and so is
    /// `Set-Cookie` without [`per`](Self::per): a replay would give one caller's cookie to
    /// whoever presents the same key.
    pub fn replay_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.replay_headers = names.into_iter().collect();
        self
    }

    /// How a response status ends the execution, for a response without an [`ErrorClass`]
    /// in its extensions: `None` a success (recorded and replayed),
    /// [`ErrorClass::Business`] a failure that releases the record (a retry runs again),
    /// [`ErrorClass::Indeterminate`] an unknown outcome (retries are refused until the
    /// record expires or is resolved). Default [`default_classify`].
    ///
    /// ```
    /// use http::StatusCode;
    /// use redguard::ErrorClass;
    /// use redguard::http::{IdempotencyLayer, idempotency::default_classify};
    ///
    /// // A 503 from our own overload shedding ran nothing: let the retry run.
    /// let layer = IdempotencyLayer::builder()
    ///     .classify(|status| match status {
    ///         StatusCode::SERVICE_UNAVAILABLE => Some(ErrorClass::Business),
    ///         other => default_classify(other),
    ///     })
    ///     .build()?;
    /// # Ok::<(), redguard::Error>(())
    /// ```
    pub fn classify<F>(mut self, classify: F) -> Self
    where
        F: Fn(StatusCode) -> Option<ErrorClass> + Send + Sync + 'static,
    {
        self.config.classify = Box::new(classify);
        self
    }

    /// What identifies the payload: bytes from the request head and body, hashed (SHA-256)
    /// and compared on every retry. Default: method, path and query, body. Leave out what
    /// legitimately changes between retries.
    pub fn fingerprint<F>(mut self, fingerprint: F) -> Self
    where
        F: Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync + 'static,
    {
        self.config.fingerprint = Box::new(fingerprint);
        self
    }

    /// Scopes keys per client: the extractor's value (a user or tenant id) is part of each
    /// record's key, so two clients sending the same `Idempotency-Key` never meet. A request
    /// without it is `400`.
    pub fn per(mut self, client: impl KeyExtractor) -> Self {
        self.config.per = Some(Box::new(client));
        self
    }

    /// Bounds the handler: past it the request is answered `503` and the outcome is unknown
    /// (the record is UNKNOWN until an operator resolves it, or it expires).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = Some(timeout);
        self
    }

    /// A duplicate request arriving while the first runs waits up to `wait` (at most 60 s)
    /// for its outcome instead of `409 in_progress`: it gets the replayed response (with
    /// `Idempotent-Replayed: true`), or runs the retry a business failure allows, or `409`
    /// once `wait` runs out (default zero: answer `409` at once). See
    /// [`Idempotency::wait`](crate::idempotency::Idempotency::wait).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.config.wait = wait;
        self
    }

    /// Whether the handler runs in its own task, finishing and recording its outcome when
    /// the client disconnects (default `true`; see
    /// [`Idempotency::detach`](crate::idempotency::Idempotency::detach)).
    pub fn detach(mut self, detach: bool) -> Self {
        self.config.detach = detach;
        self
    }

    /// Runs on `handle` rather than the current one.
    pub fn on(mut self, handle: &Redguard) -> Self {
        self.config.handle = Some(handle.clone());
        self
    }

    /// Renders the responses the layer answers itself (`400`, `409`, `413`, `422`, `503`)
    /// instead of the default JSON ([`Rejection::to_json_response`]); the rejection's
    /// headers are added to whatever it returns. A handler's own responses are never
    /// passed through it.
    pub fn on_rejection<F>(mut self, render: F) -> Self
    where
        F: Fn(&Rejection) -> Response<Full<Bytes>> + Send + Sync + 'static,
    {
        self.config.on_rejection = Some(Arc::new(render));
        self
    }

    /// Checks the configuration (scope, expire, timeout, wait, at least one method, the replayed
    /// headers).
    pub fn build(self) -> Result<IdempotencyLayer> {
        let config = self.config;
        check_name("scope", &config.scope, MAX_SCOPE_LEN)?;
        redguard_grammar::idempotency::expire(config.expire).map_err(Error::Config)?;
        if let Some(timeout) = config.timeout {
            redguard_grammar::idempotency::timeout(timeout).map_err(Error::Config)?;
        }
        redguard_grammar::idempotency::wait(config.wait).map_err(Error::Config)?;
        if config.methods.is_empty() {
            return Err(Error::Config(
                "an IdempotencyLayer needs at least one method to guard".to_owned(),
            ));
        }
        for name in &config.replay_headers {
            if FRAMING.contains(name) {
                return Err(Error::Config(format!(
                    "`{name}` frames the message and cannot be replayed; the replay sets its own"
                )));
            }
            if *name == header::SET_COOKIE && config.per.is_none() {
                return Err(Error::Config(
                    "replaying `set-cookie` needs `.per(..)`: without it a caller presenting \
                     another's key would receive that caller's cookie"
                        .to_owned(),
                ));
            }
        }
        Ok(IdempotencyLayer {
            config: Arc::new(config),
        })
    }
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("scope", &self.config.scope)
            .field("methods", &self.config.methods)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for IdempotencyBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyBuilder")
            .field("scope", &self.config.scope)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service of an [`IdempotencyLayer`]. See the [module docs](self).
#[must_use]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> IdempotencyService<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone> Clone for IdempotencyService<S> {
    fn clone(&self) -> Self {
        IdempotencyService {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("scope", &self.config.scope)
            .finish_non_exhaustive()
    }
}

/// A recorded response: what a replay sends. Header values and the body are base64: both
/// are bytes (a header value may hold obs-text, a body need not be UTF-8). Records of the
/// first format (`headers`, values as text) do not deserialize and are answered as corrupt.
#[derive(Serialize, Deserialize)]
struct Recorded {
    status: u16,
    /// The replayed fields, in the response's order (repeated names kept).
    fields: Vec<(String, String)>,
    body: String,
    /// The handler's own response head, for the live answer: never recorded.
    #[serde(skip)]
    live: Option<(http::response::Parts, Bytes)>,
}

/// How a guarded request ended, other than with a recorded success.
enum Failure<RB, E> {
    /// A guard refused or failed (`409`, `422`, `503`, ...).
    Guard(Error),
    /// The handler's response, passed through as it is: a failure, or a success that is not
    /// recorded (a stream, a body over `max_response`).
    Response(Response<ResponseBody<RB>>, ErrorClass),
    /// The inner service failed.
    Inner(E),
}

impl<RB, E> From<Error> for Failure<RB, E> {
    fn from(err: Error) -> Self {
        Failure::Guard(err)
    }
}

impl<RB, E> Classify for Failure<RB, E> {
    fn class(&self) -> ErrorClass {
        match self {
            Failure::Guard(err) => err.class(),
            Failure::Response(_, class) => *class,
            // The service failed rather than answering: nothing says when.
            Failure::Inner(_) => ErrorClass::Indeterminate,
        }
    }
}

type Answer<B, E> = Result<Response<ResponseBody<B>>, E>;

/// The request body the inner service sees: the original (`Left`) on a request passed
/// through, the body read for the fingerprint (`Right`) on a guarded one.
pub type RequestBody<B> = Either<B, Full<Bytes>>;

impl<S, B, RB> Service<Request<B>> for IdempotencyService<S>
where
    S: Service<Request<RequestBody<B>>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: std::fmt::Display,
{
    type Response = Response<ResponseBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let config = Arc::clone(&self.config);
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        if !config.methods.contains(request.method()) {
            return pass_through(inner, request);
        }
        let key = match IdempotencyKey::from_headers(request.headers()) {
            Ok(Some(key)) => key,
            Ok(None) if !config.required => return pass_through(inner, request),
            Ok(None) => return config.rejected(key_rejection(IdempotencyKeyRejection::Missing)),
            Err(rejection) => return config.rejected(key_rejection(rejection)),
        };
        let (parts, body) = request.into_parts();
        let mut builder = KeyBuilder::new();
        if let Some(per) = &config.per {
            let Some(client) = per.extract(&parts) else {
                let status = per.missing_status();
                let rejection = if status.is_server_error() {
                    Rejection::new(status, "internal", "internal error")
                } else {
                    Rejection::new(
                        status,
                        "bad_request",
                        "this request does not carry the client identity its idempotency key is scoped by",
                    )
                };
                return config.rejected(rejection);
            };
            builder = builder.part("client", client.as_str()).text(":");
        }
        let body_key = match builder.part("key", key.as_str()).finish() {
            Ok(body) => body,
            Err(err) => return config.rejected(Rejection::from_error(&err)),
        };
        if declared_length(&parts).is_some_and(|len| len > config.max_body as u64) {
            return config.rejected(too_large());
        }
        ResponseFuture::boxed(Box::pin(async move {
            let bytes = match Limited::new(body, config.max_body).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(err) => {
                    let rejection = if err.is::<http_body_util::LengthLimitError>() {
                        too_large()
                    } else {
                        Rejection::new(
                            StatusCode::BAD_REQUEST,
                            "bad_request",
                            "the request body could not be read",
                        )
                    };
                    return Ok(config.reject(rejection));
                }
            };
            let digest = Sha256::digest((config.fingerprint)(&parts, &bytes));
            let fingerprint: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            let guard = crate::idempotency(body_key)
                .scope(config.scope.clone())
                .expire(config.expire)
                .wait(config.wait)
                .payload(&fingerprint);
            let guard = match config.timeout {
                Some(timeout) => guard.timeout(timeout),
                None => guard,
            };
            let request = Request::from_parts(parts, Either::Right(Full::new(bytes)));
            let body = handle(Arc::clone(&config), inner, request);
            let run = async {
                if config.detach {
                    guard.detach().run(body).await
                } else {
                    guard.run(body).await
                }
            };
            let tracked = track_replay(run);
            let (outcome, replayed) = match &config.handle {
                Some(handle) => handle.scope(tracked).await,
                None => tracked.await,
            };
            match outcome {
                Ok(Recorded {
                    live: Some((parts, body)),
                    ..
                }) => Ok(Response::from_parts(parts, Either::Right(Full::new(body)))),
                Ok(recorded) => match replay(recorded, replayed) {
                    Ok(response) => Ok(response.map(Either::Right)),
                    Err(err) => Ok(config.reject(Rejection::from_error(&err))),
                },
                Err(Failure::Guard(err)) => Ok(config.reject(Rejection::from_error(&err))),
                Err(Failure::Response(response, _)) => Ok(response),
                Err(Failure::Inner(err)) => Err(err),
            }
        }))
    }
}

/// Runs the inner service and classifies its response: by the [`ErrorClass`] in its
/// extensions (a `redguard::Error`'s, or the handler's own mark), else by `classify`. A
/// success whose body declares at most `max_response` bytes is read and recorded; any other
/// response is passed through as it streams.
async fn handle<S, B, RB>(
    config: Arc<Config>,
    mut inner: S,
    request: Request<RequestBody<B>>,
) -> Result<Recorded, Failure<RB, S::Error>>
where
    S: Service<Request<RequestBody<B>>, Response = Response<RB>>,
    RB: Body<Data = Bytes>,
    RB::Error: std::fmt::Display,
{
    let response = inner.call(request).await.map_err(Failure::Inner)?;
    let class = match response.extensions().get::<ErrorClass>() {
        Some(class) => Some(*class),
        None => (config.classify)(response.status()),
    };
    if let Some(class) = class {
        return Err(Failure::Response(response.map(Either::Left), class));
    }
    let declared = response.body().size_hint().upper();
    if declared.is_none_or(|len| len > config.max_response as u64) {
        // The handler answered, but a retry could not be given its response: an unknown
        // outcome rather than a second run.
        tracing::warn!(
            guard = "idem",
            len = declared,
            max = config.max_response,
            "a success streamed or over max_response is passed through, not recorded; its outcome is unknown to retries"
        );
        return Err(Failure::Response(
            response.map(Either::Left),
            ErrorClass::Indeterminate,
        ));
    }
    let (parts, body) = response.into_parts();
    // Bounded by the declared upper bound just checked (a body may not exceed its own).
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => {
            tracing::warn!(guard = "idem", error = %err, "the response body failed mid-way; outcome unknown");
            let response = Rejection::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error",
            )
            .to_json_response();
            return Err(Failure::Response(
                response.map(Either::Right),
                ErrorClass::Indeterminate,
            ));
        }
    };
    let engine = base64::engine::general_purpose::STANDARD;
    let fields = config
        .replay_headers
        .iter()
        .flat_map(|name| {
            parts
                .headers
                .get_all(name)
                .iter()
                .map(|value| (name.as_str().to_owned(), engine.encode(value.as_bytes())))
        })
        .collect();
    Ok(Recorded {
        status: parts.status.as_u16(),
        fields,
        body: engine.encode(&bytes),
        live: Some((parts, bytes)),
    })
}

/// The response of a replayed success.
fn replay(recorded: Recorded, replayed: bool) -> Result<Response<Full<Bytes>>> {
    let engine = base64::engine::general_purpose::STANDARD;
    let corrupt = |detail: &str| Error::Corrupt {
        key: String::new(),
        detail: detail.to_owned(),
    };
    let body = engine
        .decode(&recorded.body)
        .map_err(|_| corrupt("a recorded response body is not base64"))?;
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = StatusCode::from_u16(recorded.status)
        .map_err(|_| corrupt("a recorded response status is not a status"))?;
    for (name, value) in recorded.fields {
        let value = engine
            .decode(value)
            .ok()
            .and_then(|value| HeaderValue::from_bytes(&value).ok());
        match (HeaderName::try_from(name), value) {
            (Ok(name), Some(value)) => {
                response.headers_mut().append(name, value);
            }
            _ => return Err(corrupt("a recorded response header is not a header")),
        }
    }
    if replayed {
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(response)
}

fn declared_length(parts: &Parts) -> Option<u64> {
    parts
        .headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

fn too_large() -> Rejection {
    Rejection::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "the request body is too large",
    )
}

fn key_rejection(rejection: IdempotencyKeyRejection) -> Rejection {
    Rejection::new(rejection.status(), rejection.code(), rejection.to_string())
}

/// An unguarded request: straight to the inner service.
fn pass_through<S, B, RB>(
    mut inner: S,
    request: Request<B>,
) -> ResponseFuture<Response<ResponseBody<RB>>, S::Error>
where
    S: Service<Request<RequestBody<B>>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    let future = inner.call(request.map(Either::Left));
    ResponseFuture::boxed(Box::pin(async move {
        let response: Answer<RB, S::Error> = future.await.map(|r| r.map(Either::Left));
        response
    }))
}
