//! The [`limiter`](crate::limiter()) API: one limit on one key ([`Limiter`]), or several decided together
//! ([`RateLimits`]).

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use super::decide::{Resolved, decide, enforce_resolved};
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, IntoKey, KeyBody, KeyRule};
use crate::store::RateMode;
use crate::values::{Algorithm, Decision, IntoRate, Limit, Rate};
use metrics::SharedString;

impl Redguard {
    /// Starts a limit on `key` on this handle; see [`Limiter`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let exports = rg.limiter("exports").rate("1/min");
    /// exports.check().await?;
    /// assert!(exports.check().await.is_err());
    /// # Ok(()) }
    /// ```
    pub fn limiter(&self, key: impl IntoKey) -> Limiter {
        crate::limiter(key).on(self)
    }
}

/// One limit on one key, built by [`limiter`](crate::limiter()) or [`Redguard::limiter`]. Cheap to keep and
/// reuse: [`key`](Limiter::key) gives the same limit on another key, its rate parsed once.
///
/// Three ways to ask, which differ in what a rejection is:
///
/// - [`check`](Limiter::check) (and [`run`](Limiter::run)): a rejection is
///   `Err(`[`Error::RateLimited`]`)`, so `limiter.check().await?` enforces the limit.
/// - [`decide`](Limiter::decide): a rejection is **`Ok`** with `allowed == false`; nothing is
///   enforced unless the caller looks (it is `#[must_use]`).
/// - [`peek`](Limiter::peek): what `decide` would answer, counting nothing.
#[derive(Debug, Clone)]
#[must_use = "a limiter does nothing until `.check().await`"]
pub struct Limiter {
    handle: Option<Redguard>,
    key: std::result::Result<KeyBody, KeyError>,
    /// Borrowed for `#[rate_limit]` (its scope is a `&'static str`), shared otherwise: no
    /// allocation per call for its metrics' label.
    scope: SharedString,
    rate: Option<std::result::Result<Rate, String>>,
    burst: Option<u64>,
    algorithm: Algorithm,
    cost: u64,
    block: Duration,
    wait: Duration,
    local: bool,
    shadow: bool,
    near_limit: u64,
    /// A configured value that is not one (a negative `cost` expression), reported on use.
    invalid: Option<String>,
}

/// A key-rendering failure, kept so a reused limiter reports it on every check.
#[derive(Debug, Clone)]
enum KeyError {
    Invalid {
        part: String,
        rule: KeyRule,
    },
    Missing {
        part: String,
    },
    /// Anything else (a template whose parts do not match), by its message.
    Other(String),
}

impl KeyError {
    fn from_error(err: Error) -> KeyError {
        match err {
            Error::InvalidKey { part, rule } => KeyError::Invalid { part, rule },
            Error::MissingKey { part } => KeyError::Missing { part },
            Error::Config(message) => KeyError::Other(message),
            other => KeyError::Other(other.to_string()),
        }
    }

    fn to_error(&self) -> Error {
        match self {
            KeyError::Invalid { part, rule } => Error::InvalidKey {
                part: part.clone(),
                rule: rule.clone(),
            },
            KeyError::Missing { part } => Error::MissingKey { part: part.clone() },
            KeyError::Other(message) => Error::Config(message.clone()),
        }
    }
}

impl Limiter {
    /// A limiter on `key` in `scope`.
    pub(crate) fn new(key: Result<KeyBody>, scope: Cow<'static, str>) -> Limiter {
        Limiter {
            handle: None,
            key: key.map_err(KeyError::from_error),
            scope: crate::telemetry::shared(scope),
            rate: None,
            burst: None,
            algorithm: Algorithm::Gcra,
            cost: 1,
            block: Duration::ZERO,
            wait: Duration::ZERO,
            local: false,
            shadow: false,
            near_limit: 0,
            invalid: None,
        }
    }

    /// This limit on another key: everything else (the rate parsed once, the scope, the
    /// handle) as configured here. For a limiter built once and used per request.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let per_user = rg.limiter("login").scope("login").rate("1/min");
    /// for user in [1u64, 2] {
    ///     per_user.key(redguard::key("user:{id}").part("id", &user)).check().await?;
    /// }
    /// assert!(per_user.key(redguard::key("user:{id}").part("id", &1u64)).check().await.is_err());
    /// # Ok(()) }
    /// ```
    pub fn key(&self, key: impl IntoKey) -> Limiter {
        Limiter {
            key: key.into_key().map_err(KeyError::from_error),
            ..self.clone()
        }
    }

    /// `burst` from a configured value that may not be one (what `#[rate_limit]` passes for an
    /// expression): an error is kept and reported when the limiter runs.
    pub(crate) fn try_burst(mut self, burst: Result<u64>) -> Self {
        match burst {
            Ok(burst) => self.burst = Some(burst),
            Err(err) => self.invalid = Some(err.to_string()),
        }
        self
    }

    /// `cost` as [`try_burst`](Limiter::try_burst) takes a burst.
    pub(crate) fn try_cost(mut self, cost: Result<u64>) -> Self {
        match cost {
            Ok(cost) => self.cost = cost,
            Err(err) => self.invalid = Some(err.to_string()),
        }
        self
    }

    /// The key's scope: the operation it limits, so equal keys of unrelated limits do not
    /// meet. A `&'static str` or a `String`; default `limiter` (`#[rate_limit]` uses the fn's
    /// path).
    #[inline]
    pub fn scope(mut self, scope: impl Into<Cow<'static, str>>) -> Self {
        self.scope = crate::telemetry::shared(scope.into());
        self
    }

    /// The rate (required): a [`Rate`] or text such as `"100/s"`.
    #[inline]
    pub fn rate(mut self, rate: impl IntoRate) -> Self {
        self.rate = Some(rate.into_rate().map_err(|err| err.to_string()));
        self
    }

    /// The burst of the bucket algorithms (default: the rate's count).
    ///
    /// The default lets a full bucket out at once and then the rate: `rate("10/s")` admits
    /// up to **19** in its first second (10 at once, then one each 100 ms). For an outgoing
    /// quota (a provider's "10 requests per second"), set `burst(1)`, or what the provider
    /// allows:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// let rg = redguard::Redguard::memory();
    /// // Calls every 10 ms for one second: how many does each limit admit?
    /// async fn first_second(limiter: redguard::rate::Limiter) -> u32 {
    ///     let mut admitted = 0;
    ///     for _ in 0..100 {
    ///         admitted += u32::from(limiter.check().await.is_ok());
    ///         tokio::time::advance(Duration::from_millis(10)).await;
    ///     }
    ///     admitted
    /// }
    /// assert_eq!(first_second(rg.limiter("default").rate("10/s")).await, 19);
    /// assert_eq!(first_second(rg.limiter("outgoing").rate("10/s").burst(1)).await, 10);
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// The algorithm (default [`Algorithm::Gcra`]).
    #[inline]
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Units this call consumes (default 1); more than the burst is [`Error::InvalidLimit`].
    #[inline]
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// Penalty: once the key exceeds its limit, reject it for `block` without counting. A
    /// limit configured without a penalty ignores one set under an earlier configuration.
    #[inline]
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// Bounded waiting for [`check`](Limiter::check) (and [`run`](Limiter::run)): the call
    /// waits until the limit admits it or `wait` has passed. Nothing is admitted earlier than
    /// the limit allows, and a call is refused only when the limit would not admit it within
    /// its `wait` (behind those who came first).
    ///
    /// On GCRA (without `block` or `shadow`) the call reserves its slot: the store admits it
    /// now if its next free slot is within `wait`, charged as arriving then, and the call
    /// sleeps until that slot; a call whose slot lies beyond `wait` is refused at once. The
    /// slots are the store's schedule, so a late caller never delays those behind it: 100
    /// callers of `10/s` with `burst(1)` and a 10 s wait are all admitted, the last at 9.9 s
    /// of the store's time plus one reply's latency. One store call per admission. A call
    /// dropped while asleep on its slot gives the slot up (it is not given to another).
    ///
    /// Other algorithms wait in arrival order among this handle's callers of the same key:
    /// only the first asks the store, again at its `retry_after` (one call per admission,
    /// plus about one refused call each while the limit is saturated); a call dropped while
    /// waiting has reserved nothing. Across instances the store decides between them.
    /// [`decide`](Limiter::decide) never waits.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// let rg = redguard::Redguard::memory();
    /// let api = rg.limiter("provider").rate("10/s").burst(1).wait(Duration::from_secs(2));
    /// let start = tokio::time::Instant::now();
    /// let mut calls = tokio::task::JoinSet::new();
    /// for _ in 0..20 {
    ///     let api = api.clone();
    ///     calls.spawn(async move { api.check().await });
    /// }
    /// while let Some(call) = calls.join_next().await {
    ///     call.expect("no panic")?; // none refused: 20 calls fit in 2 s at 10/s
    /// }
    /// assert!(start.elapsed() >= Duration::from_millis(1900)); // and none early
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The in-process first tier: once the store rejected this key, reject further calls
    /// (of at least that cost) locally until its `retry_after`, without a round trip. It only
    /// repeats the store's own rejections, so it never admits more than the store would.
    #[inline]
    pub fn local(mut self, local: bool) -> Self {
        self.local = local;
        self
    }

    /// Shadow (dry-run) mode: the limit is decided and counted as if enforced, but a call it
    /// would refuse is admitted anyway, so a new limit can be watched before it is enforced.
    /// A would-be refusal is counted as `outcome="shadow_rejected"` in
    /// `redguard_rate_decisions_total` and recorded on the call's span (`shadow_rejected`);
    /// the decision returned says `allowed`. Stacked with enforced limits, those are still
    /// enforced and charged. Switching it off is configuration, not code (`.shadow(flag)`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// # redguard::Redguard::memory().scope(async {
    /// let watched = redguard::limiter("export").rate("1/h").shadow(true);
    /// watched.check().await?;
    /// let d = watched.check().await?; // over the limit: admitted anyway, and counted so
    /// assert!(d.allowed && d.remaining == 0);
    /// # Ok(()) }).await }
    /// ```
    #[inline]
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// The near-limit signal: an admitted call that leaves fewer than `threshold` units is
    /// counted in `redguard_rate_near_limit_total` and marked on its span (`near_limit`),
    /// before the key starts refusing (default 0: off).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// # redguard::Redguard::memory().scope(async {
    /// let api = redguard::limiter("tenant:acme").rate("100/min").near_limit(10);
    /// api.check().await?; // 99 left: no signal; at 9 left, each call is counted
    /// # Ok(()) }).await }
    /// ```
    #[inline]
    pub fn near_limit(mut self, threshold: u64) -> Self {
        self.near_limit = threshold;
        self
    }

    /// Runs on `handle` instead of the current one.
    #[inline]
    pub fn on(mut self, handle: &Redguard) -> Self {
        self.handle = Some(handle.clone());
        self
    }

    /// Enforces the limit: checks and, when admitted, counts this call; a **rejection is
    /// `Err(`[`Error::RateLimited`]`)`**, so `limiter.check().await?` limits. Waits as
    /// [`wait`](Limiter::wait) allows. [`decide`](Limiter::decide) answers `Ok` either way.
    pub async fn check(&self) -> Result<Decision> {
        let (handle, resolved) = self.resolve_alone()?;
        single(enforce_resolved(&handle, &[resolved], &[self.wait]).await?)
    }

    /// Runs `body` if the limit admits this call ([`check`](Limiter::check)), counting it;
    /// a rejection is returned as `E::from(`[`Error::RateLimited`]`)` without running it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let sent = rg.limiter("mail").rate("1/h").run(async { Ok::<_, redguard::Error>(1) }).await?;
    /// assert_eq!(sent, 1);
    /// # Ok(()) }
    /// ```
    pub async fn run<T, E, F>(&self, body: F) -> Result<T, E>
    where
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        self.check().await.map_err(E::from)?;
        body.await
    }

    /// Decides and, when admitted, counts this call, returning the decision **either way**:
    /// a rejection is `Ok` with `allowed == false`, and nothing stops the caller unless it
    /// looks. For callers that answer a rejection themselves (headers, a queue); use
    /// [`check`](Limiter::check) to enforce. Never waits.
    #[must_use = "a rejection is `Ok` with `allowed == false`: look at `.allowed`, or use `check()?` to enforce the limit"]
    pub async fn decide(&self) -> Result<Decision> {
        let (handle, resolved) = self.resolve_alone()?;
        single(decide(&handle, &[resolved], RateMode::Consume).await?)
    }

    /// Reports what [`decide`](Limiter::decide) would decide, without counting.
    #[must_use = "peeking changes nothing: look at the decision"]
    pub async fn peek(&self) -> Result<Decision> {
        let (handle, resolved) = self.resolve_alone()?;
        single(decide(&handle, &[resolved], RateMode::Peek).await?)
    }

    /// This limit and `other`, decided together (see [`RateLimits`]).
    pub fn and(self, other: Limiter) -> RateLimits {
        RateLimits::new().with(self).with(other)
    }

    /// [`check`](Limiter::check), keeping the key and the limit it decided on: the
    /// admission of [`reserve`](Limiter::reserve).
    pub(super) async fn admit(&self) -> Result<(Redguard, Decision, crate::key::Key, Limit)> {
        let (handle, resolved) = self.resolve_alone()?;
        let limits = std::slice::from_ref(&resolved);
        let decision = single(enforce_resolved(&handle, limits, &[self.wait]).await?)?;
        Ok((handle.into_owned(), decision, resolved.key, resolved.limit))
    }

    /// Bounded waiting allowed by this limit (see [`wait`](Limiter::wait)).
    pub(super) fn max_wait(&self) -> Duration {
        self.wait
    }

    /// This limit on its own handle (or the current one), ready for the store.
    fn resolve_alone(&self) -> Result<(Cow<'_, Redguard>, Resolved<'_>)> {
        // Borrowed when set: a clone per check is two atomic writes to one cache line that
        // every thread checking on this handle shares.
        let handle = match &self.handle {
            Some(handle) => Cow::Borrowed(handle),
            None => Cow::Owned(Redguard::current()?),
        };
        crate::handle::need_runtime_for(&handle)?;
        let resolved = self.resolve(&handle)?;
        Ok((handle, resolved))
    }

    fn resolve(&self, handle: &Redguard) -> Result<Resolved<'_>> {
        let body = self.key.as_ref().map_err(KeyError::to_error)?;
        if let Some(invalid) = &self.invalid {
            return Err(Error::InvalidLimit(invalid.clone()));
        }
        let rate = match &self.rate {
            None => {
                return Err(Error::InvalidLimit(
                    "no rate set; call `.rate(..)` on the limiter".to_owned(),
                ));
            }
            Some(Err(message)) => return Err(Error::InvalidLimit(message.clone())),
            Some(Ok(rate)) => *rate,
        };
        let limit = Limit::new(self.algorithm, rate, self.burst, self.cost, self.block)?;
        let key = handle.key(GuardKind::RateLimit, &self.scope, body)?;
        Ok(Resolved {
            key,
            limit,
            scope: &self.scope,
            local: self.local,
            shadow: self.shadow,
            near_limit: self.near_limit,
        })
    }
}

fn single(mut decisions: Vec<Decision>) -> Result<Decision> {
    decisions.pop().ok_or_else(|| Error::Corrupt {
        key: String::new(),
        detail: "the store returned no decision".to_owned(),
    })
}

/// Several limits decided all-or-nothing: the call is admitted only if every limit admits,
/// and a rejection by one charges none of the others (the per-user limit turning a call away
/// does not use up the global budget).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// # redguard::Redguard::memory().scope(async {
/// let global = redguard::limiter("orders").rate("100/s");
/// let user = redguard::limiter(redguard::key("orders:user:{id}").part("id", &7u64)).rate("1/min");
/// let both = global.clone().and(user);
/// assert!(both.check().await.is_ok());
/// assert!(both.check().await.is_err()); // the user limit says no...
/// // ...and the global one was not charged: one call used, one more would leave 98.
/// assert_eq!(global.peek().await?.remaining, 98);
/// # Ok(()) }).await }
/// ```
#[derive(Debug, Clone, Default)]
#[must_use = "limits do nothing until `.check().await`"]
pub struct RateLimits {
    limiters: Vec<Limiter>,
}

impl RateLimits {
    /// No limits yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a limit.
    pub fn with(mut self, limiter: Limiter) -> Self {
        self.limiters.push(limiter);
        self
    }

    /// Decides and (when all admit) counts; one decision per limit, in order, whether
    /// admitted or not: a rejection is **`Ok`** with some `allowed == false` (see
    /// [`Limiter::decide`]). Never waits.
    #[must_use = "a rejection is `Ok` with some `allowed == false`: look at the decisions, or use `check()?` to enforce the limits"]
    pub async fn decide(&self) -> Result<Vec<Decision>> {
        self.ask(RateMode::Consume).await
    }

    /// Decides without counting.
    #[must_use = "peeking changes nothing: look at the decisions"]
    pub async fn peek(&self) -> Result<Vec<Decision>> {
        self.ask(RateMode::Peek).await
    }

    /// Runs `body` if every limit admits this call ([`check`](RateLimits::check)); a
    /// rejection is returned as `E::from(`[`Error::RateLimited`]`)` without running it.
    pub async fn run<T, E, F>(&self, body: F) -> Result<T, E>
    where
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        self.check().await.map_err(E::from)?;
        body.await
    }

    /// Enforces the limits: decides and (when all admit) counts; a rejection is
    /// `Err(`[`Error::RateLimited`]`)`
    /// carrying the rejecting decision that asks to wait longest. Waits while every
    /// rejecting limit's [`wait`](Limiter::wait) still covers its `retry_after`, in arrival
    /// order among this handle's callers of the same limits (see [`Limiter::wait`]).
    pub async fn check(&self) -> Result<Vec<Decision>> {
        let (handle, resolved) = self.resolve()?;
        let waits: Vec<Duration> = self.limiters.iter().map(Limiter::max_wait).collect();
        enforce_resolved(&handle, &resolved, &waits).await
    }

    fn resolve(&self) -> Result<(Redguard, Vec<Resolved<'_>>)> {
        let handle = match self.limiters.first().and_then(|l| l.handle.clone()) {
            Some(handle) => handle,
            None => Redguard::current()?,
        };
        crate::handle::need_runtime_for(&handle)?;
        let mut resolved = Vec::with_capacity(self.limiters.len());
        for limiter in &self.limiters {
            resolved.push(limiter.resolve(&handle)?);
        }
        Ok((handle, resolved))
    }

    async fn ask(&self, mode: RateMode) -> Result<Vec<Decision>> {
        let (handle, resolved) = self.resolve()?;
        decide(&handle, &resolved, mode).await
    }
}
