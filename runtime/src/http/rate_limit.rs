//! `RateLimitLayer`: one or several limits on a key taken from each request, decided
//! all-or-nothing in one store call, answered `429` by the layer itself.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
//! use std::net::SocketAddr;
//! use axum::{Router, body::Body, routing::get};
//! use http::Request;
//! use redguard::http::{ClientIp, RateLimitLayer};
//! use tower::ServiceExt as _;
//!
//! let limit = RateLimitLayer::builder(ClientIp::peer())
//!     .limit("burst", "2/s")      // both decided together: a request is admitted
//!     .limit("hourly", "100/h")   // only if every limit admits it
//!     .on(&redguard::Redguard::memory())
//!     .build()?;
//! let app = Router::new().route("/", get(|| async { "hello" })).layer(limit);
//!
//! let request = || {
//!     let mut req = Request::new(Body::empty());
//!     // What `into_make_service_with_connect_info::<SocketAddr>()` provides when serving.
//!     req.extensions_mut().insert(SocketAddr::from(([203, 0, 113, 9], 4000)));
//!     req
//! };
//! let ok = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(ok.status(), 200);
//! assert_eq!(ok.headers()["ratelimit"], "\"burst\";r=1;t=1");
//! app.clone().oneshot(request()).await.unwrap();
//! let limited = app.oneshot(request()).await.unwrap();
//! assert_eq!(limited.status(), 429);
//! assert_eq!(limited.headers()["retry-after"], "1");
//! assert_eq!(limited.headers()["ratelimit-policy"], "\"burst\";q=2;w=1, \"hourly\";q=100;w=3600");
//! # Ok(()) }
//! ```
//!
//! # Responses
//!
//! - Admitted: the inner response, plus `RateLimit-Policy` (every limit) and `RateLimit`
//!   (the tightest), unless the inner response speaks for a limit of its own: a `429`, or
//!   one carrying `RateLimit`, `RateLimit-Policy` or `X-RateLimit-Limit`/`-Remaining`/`-Reset`
//!   (a handler's `#[rate_limit]` refusal, an inner layer) keeps its headers untouched, so a
//!   refusal always describes the limit that refused.
//! - Refused: `429` with `Retry-After` (the longest wait of the refusing limits, whole
//!   seconds rounded up), `RateLimit`, `RateLimit-Policy` and
//!   `{"error": "rate_limited", "message": ..}`; no limit is charged.
//! - No key in the request (see [`KeyExtractor`]), or one that breaks the key rules: `400`
//!   (`500` for [`ClientIp`](super::ClientIp) without a peer address), nothing sent to the
//!   store.
//! - The store cannot answer: the rate-limit [`FailMode`](crate::handle::FailMode) applies (by
//!   default the request is admitted, its headers showing the whole quota;
//!   `FailMode::Closed` answers `503` with `Retry-After`; `FailMode::Local` decides in
//!   process at the instance's share, its headers showing that share).
//!
//! # Order
//!
//! Put it outermost among the guards, so refused requests cost one store call and nothing
//! else: with `tower::ServiceBuilder` (which runs top to bottom) list it before
//! [`IdempotencyLayer`](super::IdempotencyLayer); with `Router::layer` calls (bottom to top),
//! add it last. To limit matched routes only (a `404` never becomes a `429`), use
//! `Router::route_layer`.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body_util::{Either, Full};
use tower_layer::Layer;
use tower_service::Service;

use super::extract::KeyExtractor;
use super::headers::{RATELIMIT, RATELIMIT_POLICY, to_header_map};
use super::response::{OnRejection, Rejection, ResponseBody, ResponseFuture, reject};
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{KeyBuilder, MAX_SCOPE_LEN, check_name};
use crate::rate::{Limiter, RateLimits};
use crate::values::{Algorithm, Decision, IntoRate, Limit, Quota, Rate};

/// Default key scope of a layer's limits (each limit adds `.<name>`).
const DEFAULT_SCOPE: &str = "http";

/// A tower layer applying rate limits to every request. See the [module docs](self).
///
/// Cheap to clone; clones share one configuration.
#[must_use]
pub struct RateLimitLayer<K = super::ClientIp> {
    config: Arc<Config<K>>,
}

struct Config<K> {
    extractor: K,
    limits: Vec<Policy>,
    scope: String,
    handle: Option<Redguard>,
    on_rejection: Option<OnRejection>,
}

/// One named limit of a [`RateLimitLayer`]: its name is the policy name in the `RateLimit`
/// headers and part of its key, so limits with different names never share a count.
///
/// ```
/// use redguard::rate::Algorithm;
/// use redguard::http::{Policy, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder(redguard::http::Global)
///     .policy(Policy::new("api", "100/s").burst(200).algorithm(Algorithm::TokenBucket))
///     .build()?;
/// # Ok::<(), redguard::Error>(())
/// ```
#[derive(Clone)]
pub struct Policy {
    name: String,
    rate: PolicyRate,
    burst: Option<u64>,
    algorithm: Algorithm,
    global: bool,
    shadow: bool,
}

/// Where a policy's rate and burst come from.
#[derive(Clone)]
enum PolicyRate {
    /// Written in the code (or the error that text gave, reported by `build`).
    Fixed(std::result::Result<Rate, String>),
    /// Asked of each request and its key: a plan's quota.
    PerRequest(Arc<PlanFn>),
}

/// The function of a [`Policy::per_request`].
type PlanFn = dyn Fn(&Parts, &str) -> Option<Quota> + Send + Sync;

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_struct("Policy");
        s.field("name", &self.name);
        match &self.rate {
            PolicyRate::Fixed(rate) => s.field("rate", rate),
            PolicyRate::PerRequest(_) => s.field("rate", &"per request"),
        };
        s.field("burst", &self.burst)
            .field("algorithm", &self.algorithm)
            .field("global", &self.global)
            .field("shadow", &self.shadow)
            .finish()
    }
}

impl Policy {
    /// A limit named `name` (lowercase letters, digits, `_-.`) at `rate` (a [`Rate`] or text
    /// such as `"100/min"`).
    pub fn new(name: impl Into<String>, rate: impl IntoRate) -> Policy {
        Policy {
            name: name.into(),
            rate: PolicyRate::Fixed(rate.into_rate().map_err(|err| err.to_string())),
            burst: None,
            algorithm: Algorithm::Gcra,
            global: false,
            shadow: false,
        }
    }

    /// A limit named `name` whose rate and burst are asked of each request: `plan` gets the
    /// request's head and the key the layer's extractor took from it (a tenant, an API key)
    /// and returns that plan's [`Quota`] — from a lookup table, a header the gateway set, a
    /// cache of the billing system. A [`Quota`] is checked against the grammar's bounds
    /// when it is made, so a plan cannot be unlimited; `None` (no plan for this request) is
    /// answered `500` and logged, never admitted unchecked. Decided all-or-nothing with the
    /// layer's other limits, as exactly as a literal rate.
    ///
    /// The key stays the extractor's, whatever the plan: a tenant that changes plan keeps its
    /// state, kept in units, so what it already used counts against the new plan (a lowered
    /// plan admits nothing beyond its new limit), as with an override. A per-key override
    /// ([`Admin::quota_set`](crate::admin::Admin::quota_set)) still takes precedence.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::collections::HashMap;
    /// use redguard::admin::Quota;
    /// use redguard::http::{HeaderKey, Policy, RateLimitLayer};
    ///
    /// let plans: HashMap<&str, Quota> = HashMap::from([
    ///     ("free", Quota::new("10/min", None)?),
    ///     ("pro", Quota::new("100/s", Some(200))?),
    /// ]);
    /// let layer = RateLimitLayer::builder(HeaderKey::new("x-api-key")?)
    ///     .policy(Policy::per_request("plan", move |parts, _key| {
    ///         // Set by the gateway after authentication; unknown plans get the free one.
    ///         let plan = parts.headers.get("x-plan").and_then(|v| v.to_str().ok());
    ///         plans.get(plan.unwrap_or("free")).or(plans.get("free")).copied()
    ///     }))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn per_request<F>(name: impl Into<String>, plan: F) -> Policy
    where
        F: Fn(&Parts, &str) -> Option<Quota> + Send + Sync + 'static,
    {
        Policy {
            name: name.into(),
            rate: PolicyRate::PerRequest(Arc::new(plan)),
            burst: None,
            algorithm: Algorithm::Gcra,
            global: false,
            shadow: false,
        }
    }

    /// Shadow (dry-run) mode: the limit is decided and counted as if enforced, but a request
    /// it would refuse is admitted anyway (as [`Limiter::shadow`](crate::rate::Limiter::shadow)):
    /// counted as `outcome="shadow_rejected"` in `redguard_rate_decisions_total` and recorded
    /// on the span (`shadow_rejected`). The layer's other limits are still enforced and
    /// charged. Switching it off is configuration (`.shadow(flag)`), not code.
    ///
    /// ```
    /// use redguard::http::{Policy, RateLimitLayer};
    ///
    /// let enforce = std::env::var("ENFORCE_API_LIMIT").is_ok_and(|v| v == "1");
    /// let layer = RateLimitLayer::builder(redguard::http::Global)
    ///     .policy(Policy::new("api", "100/s").shadow(!enforce))
    ///     .build()?;
    /// # Ok::<(), redguard::Error>(())
    /// ```
    pub fn shadow(mut self, shadow: bool) -> Policy {
        self.shadow = shadow;
        self
    }

    /// Counts every request against one key shared by all clients, whatever the layer's
    /// extractor returns: an API-wide limit decided all-or-nothing with the per-client limits
    /// of the same layer, so a request refused by either is charged to neither (two stacked
    /// layers would charge the outer one for a request the inner one refuses).
    ///
    /// ```
    /// use redguard::http::{Policy, RateLimitLayer};
    ///
    /// let per_user_and_api = RateLimitLayer::builder(|parts: &http::request::Parts| {
    ///     parts.headers.get("x-tenant")?.to_str().ok().map(str::to_owned)
    /// })
    /// .limit("tenant", "10/s")
    /// .policy(Policy::new("api", "1000/s").global())
    /// .build()?;
    /// # Ok::<(), redguard::Error>(())
    /// ```
    pub fn global(mut self) -> Policy {
        self.global = true;
        self
    }

    /// The burst of the bucket algorithms (default: the rate's count). A
    /// [`per_request`](Policy::per_request) policy takes its burst from the plan's [`Quota`].
    pub fn burst(mut self, burst: u64) -> Policy {
        self.burst = Some(burst);
        self
    }

    /// The algorithm (default [`Algorithm::Gcra`]).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Policy {
        self.algorithm = algorithm;
        self
    }

    fn check(&self) -> Result<()> {
        let valid_name = !self.name.is_empty()
            && self.name.len() <= 32
            && self.name.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'.')
            });
        if !valid_name {
            return Err(Error::Config(format!(
                "rate-limit policy name `{}`: use 1 to 32 of lowercase letters, digits, `_-.`",
                self.name
            )));
        }
        match &self.rate {
            PolicyRate::Fixed(rate) => {
                let rate = rate.clone().map_err(Error::InvalidLimit)?;
                Limit::new(
                    self.algorithm,
                    rate,
                    self.burst,
                    1,
                    std::time::Duration::ZERO,
                )?;
            }
            PolicyRate::PerRequest(_) if self.burst.is_some() => {
                return Err(Error::Config(format!(
                    "rate-limit policy `{}` takes its rate and burst from each request's \
                     plan: put the burst in the plan's `Quota`, not in `.burst(..)`",
                    self.name
                )));
            }
            PolicyRate::PerRequest(_) => {}
        }
        Ok(())
    }

    /// The limiter deciding this policy for a request: `parts` and its `key` resolve a
    /// per-request plan.
    fn limiter(&self, parts: &Parts, key: &str, scope: &str) -> Result<Limiter> {
        // The key `Global` gives: a global policy and a `Global` layer of the same scope
        // and name count together.
        let key_text = if self.global { "global" } else { key };
        let mut limiter = crate::limiter(KeyBuilder::new().part("key", key_text))
            .scope(format!("{scope}.{}", self.name))
            .algorithm(self.algorithm)
            .shadow(self.shadow);
        match &self.rate {
            PolicyRate::Fixed(Ok(rate)) => limiter = limiter.rate(*rate),
            // Refused by `build`.
            PolicyRate::Fixed(Err(why)) => return Err(Error::InvalidLimit(why.clone())),
            PolicyRate::PerRequest(plan) => {
                let Some(quota) = plan(parts, key) else {
                    return Err(Error::InvalidLimit(format!(
                        "rate-limit policy `{}` found no plan for this request (key `{key}`): \
                         its function returned no quota",
                        self.name
                    )));
                };
                limiter = limiter.rate(quota.rate());
                // A window algorithm admits the rate's count and takes no burst.
                if !self.algorithm.is_window() {
                    limiter = limiter.burst(quota.burst());
                }
            }
        }
        if let Some(burst) = self.burst {
            limiter = limiter.burst(burst);
        }
        Ok(limiter)
    }
}

/// Builds a [`RateLimitLayer`]; start from [`RateLimitLayer::builder`].
#[must_use = "a builder does nothing until `.build()`"]
pub struct RateLimitBuilder<K> {
    extractor: K,
    limits: Vec<Policy>,
    scope: String,
    handle: Option<Redguard>,
    on_rejection: Option<OnRejection>,
}

impl<K: KeyExtractor> RateLimitLayer<K> {
    /// Starts a layer keyed by `extractor`: [`ClientIp`](super::ClientIp),
    /// [`HeaderKey`](super::HeaderKey), [`PathSegment`](super::PathSegment),
    /// [`Global`](super::Global) or any `Fn(&http::request::Parts) -> Option<String>`.
    pub fn builder(extractor: K) -> RateLimitBuilder<K> {
        RateLimitBuilder {
            extractor,
            limits: Vec::new(),
            scope: DEFAULT_SCOPE.to_owned(),
            handle: None,
            on_rejection: None,
        }
    }
}

impl<K: KeyExtractor> RateLimitBuilder<K> {
    /// Adds a limit `name` at `rate` (see [`Policy::new`]).
    pub fn limit(self, name: impl Into<String>, rate: impl IntoRate) -> Self {
        self.policy(Policy::new(name, rate))
    }

    /// Adds a limit.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.limits.push(policy);
        self
    }

    /// The key scope (default `http`): two layers with the same scope, key and limit name
    /// share a count (across instances too), so give unrelated layers their own.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = scope.into();
        self
    }

    /// Decides on `handle` rather than the current one ([`Redguard::current`] at each
    /// request: the installed handle).
    pub fn on(mut self, handle: &Redguard) -> Self {
        self.handle = Some(handle.clone());
        self
    }

    /// Renders the responses the layer answers itself (`429`, `400`, `503`) instead of the
    /// default JSON ([`Rejection::to_json_response`]). The rejection's headers
    /// (`Retry-After`, `RateLimit`, ...) are added to whatever it returns.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use redguard::http::{Global, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder(Global)
    ///     .limit("api", "100/s")
    ///     .on_rejection(|rejection| {
    ///         let mut response = http::Response::new(Full::new(Bytes::from(rejection.message().to_owned())));
    ///         *response.status_mut() = rejection.status();
    ///         response
    ///     })
    ///     .build()?;
    /// # Ok::<(), redguard::Error>(())
    /// ```
    pub fn on_rejection<F>(mut self, render: F) -> Self
    where
        F: Fn(&Rejection) -> Response<Full<Bytes>> + Send + Sync + 'static,
    {
        self.on_rejection = Some(Arc::new(render));
        self
    }

    /// Checks the configuration: at least one limit, valid distinct names, valid rates and
    /// scope. Every request then runs on checked settings.
    pub fn build(self) -> Result<RateLimitLayer<K>> {
        if self.limits.is_empty() {
            return Err(Error::Config(
                "a RateLimitLayer needs at least one `.limit(..)`".to_owned(),
            ));
        }
        for (i, policy) in self.limits.iter().enumerate() {
            policy.check()?;
            if self.limits[..i].iter().any(|p| p.name == policy.name) {
                return Err(Error::Config(format!(
                    "two rate-limit policies are named `{}`",
                    policy.name
                )));
            }
            check_name(
                "scope",
                &format!("{}.{}", self.scope, policy.name),
                MAX_SCOPE_LEN,
            )?;
        }
        Ok(RateLimitLayer {
            config: Arc::new(Config {
                extractor: self.extractor,
                limits: self.limits,
                scope: self.scope,
                handle: self.handle,
                on_rejection: self.on_rejection,
            }),
        })
    }
}

impl<K: KeyExtractor> Config<K> {
    /// The limits of a request with `key`, ready to be decided together.
    fn limits(&self, parts: &Parts, key: &str) -> Result<RateLimits> {
        let mut limits = RateLimits::new();
        for policy in &self.limits {
            let mut limiter = policy.limiter(parts, key, &self.scope)?;
            if let Some(handle) = &self.handle {
                limiter = limiter.on(handle);
            }
            limits = limits.with(limiter);
        }
        Ok(limits)
    }

    fn reject<B>(&self, rejection: Rejection) -> Response<ResponseBody<B>> {
        reject(self.on_rejection.as_ref(), rejection)
    }

    fn headers(&self, decisions: &[Decision]) -> http::HeaderMap {
        let named: Vec<(&str, Decision)> = self
            .limits
            .iter()
            .map(|p| p.name.as_str())
            .zip(decisions.iter().copied())
            .collect();
        to_header_map(&named)
    }
}

impl<K> Clone for RateLimitLayer<K> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            config: Arc::clone(&self.config),
        }
    }
}

impl<K> std::fmt::Debug for RateLimitLayer<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limits", &self.config.limits)
            .field("scope", &self.config.scope)
            .finish_non_exhaustive()
    }
}

impl<K> std::fmt::Debug for RateLimitBuilder<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitBuilder")
            .field("limits", &self.limits)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl<S, K> Layer<S> for RateLimitLayer<K> {
    type Service = RateLimit<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service of a [`RateLimitLayer`]. See the [module docs](self).
#[must_use]
pub struct RateLimit<S, K = super::ClientIp> {
    inner: S,
    config: Arc<Config<K>>,
}

impl<S, K> RateLimit<S, K> {
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

impl<S: Clone, K> Clone for RateLimit<S, K> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: std::fmt::Debug, K> std::fmt::Debug for RateLimit<S, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limits", &self.config.limits)
            .finish_non_exhaustive()
    }
}

impl<S, K, B, RB> Service<Request<B>> for RateLimit<S, K>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    K: KeyExtractor,
    B: Send + 'static,
    RB: Send + 'static,
{
    type Response = Response<ResponseBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let config = Arc::clone(&self.config);
        let (parts, body) = request.into_parts();
        let key = match config.extractor.extract(&parts) {
            Some(key) => key,
            None => {
                let status = config.extractor.missing_status();
                let rejection = if status.is_server_error() {
                    Rejection::new(status, "internal", "internal error")
                } else {
                    Rejection::new(
                        status,
                        "bad_request",
                        "this request does not carry what its rate limit is keyed on",
                    )
                };
                return ResponseFuture::ready(config.reject(rejection));
            }
        };
        // Checked here, so a malformed key is answered without building any limit.
        if let Err(err) = KeyBuilder::new().part("key", key.as_str()).finish() {
            return ResponseFuture::ready(config.reject(Rejection::from_error(&err)));
        }
        // Resolved from the request's head before it moves into the future; a plan that
        // cannot be resolved is a server error, never an unchecked admission.
        let limits = match config.limits(&parts, &key) {
            Ok(limits) => limits,
            Err(err) => return ResponseFuture::ready(config.reject(Rejection::from_error(&err))),
        };
        let request = Request::from_parts(parts, body);
        // The ready service goes into the future; this one keeps a fresh clone.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::boxed(Box::pin(async move {
            let decisions = match limits.decide().await {
                Ok(decisions) => decisions,
                Err(err) => return Ok(config.reject(Rejection::from_error(&err))),
            };
            let headers = config.headers(&decisions);
            let refused = decisions
                .iter()
                .filter(|d| !d.allowed)
                .max_by_key(|d| d.retry_after);
            let Some(refused) = refused else {
                let mut response = inner.call(request).await?;
                if !describes_its_own_limit(&response) {
                    response.headers_mut().extend(headers);
                }
                return Ok(response.map(Either::Left));
            };
            let mut rejection = Rejection::from_error(&Error::RateLimited(*refused));
            // Every policy, not only the refusing one's.
            rejection.headers_mut().extend(headers);
            Ok(config.reject(rejection))
        }))
    }
}

/// Whether the inner service's response already tells a rate limit of its own (a `429`, or
/// any rate-limit header): then its headers stay as they are, since a refusal must describe
/// the limit that refused, and mixing the layer's quota into them would contradict it.
fn describes_its_own_limit<B>(response: &Response<B>) -> bool {
    const X_RATELIMIT: [&str; 3] = [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ];
    let headers = response.headers();
    response.status() == http::StatusCode::TOO_MANY_REQUESTS
        || headers.contains_key(RATELIMIT)
        || headers.contains_key(RATELIMIT_POLICY)
        || X_RATELIMIT.iter().any(|name| headers.contains_key(*name))
}
