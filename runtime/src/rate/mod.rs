//! Rate limits: the [`limiter`] API and what `#[rate_limit]` expands into.
//!
//! A call names one or more limits; the store decides them together, at its own time, in one
//! round trip ([`RateOps`](crate::RateOps)): either every limit admits and all are charged,
//! or the call is turned away and none is. When the store cannot answer, the rate-limit
//! [`FailMode`](crate::FailMode) applies: by default the call is let through, logged and
//! counted (`redguard_backend_errors_total`).

mod decision;
mod local;
mod spec;

use std::time::Duration;

use crate::degrade::Degrade;
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, Key, KeyBody, KeyBuilder, KeyPart, KeyRule};
use crate::store::{RateCheck, RateMode};

pub use self::decision::Decision;
pub(crate) use self::spec::micros;
pub use self::spec::{
    Algorithm, Limit, MAX_RATE_COUNT, MAX_RATE_PERIOD, MAX_SLIDING_WINDOW_COUNT, Rate,
};

/// Scope of keys built by [`limiter`] unless [`Limiter::scope`] says otherwise.
const DEFAULT_SCOPE: &str = "limiter";

/// Starts a limit on the key `text` (template text, `[A-Za-z0-9._@:-]`), to which
/// [`Limiter::part`] appends request values.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// # redguard::Redguard::memory().scope(async {
/// use redguard::{Algorithm, Rate};
///
/// let ip = "203.0.113.9";
/// let login = redguard::limiter("login:ip:")
///     .part("ip", ip)
///     .rate(Rate::per_minute(10))
///     .burst(3)
///     .algorithm(Algorithm::Gcra);
/// for _ in 0..3 {
///     assert!(login.check().await?.allowed);
/// }
/// let d = login.check().await?;
/// assert!(!d.allowed);
/// // Looking does not count:
/// assert!(!login.peek().await?.allowed);
/// // Or turn a rejection into `Error::RateLimited`:
/// assert!(matches!(login.enforce().await, Err(redguard::Error::RateLimited(_))));
/// # Ok(()) }).await }
/// ```
pub fn limiter(text: &str) -> Limiter {
    let mut limiter = Limiter {
        handle: None,
        rendered: None,
        key_error: None,
        scope: DEFAULT_SCOPE.to_owned(),
        rate: None,
        burst: None,
        algorithm: Algorithm::Gcra,
        cost: 1,
        block: Duration::ZERO,
        wait: Duration::ZERO,
        local: false,
    };
    if !text.is_empty() {
        match KeyBuilder::new().text(text).finish() {
            Ok(body) => limiter.rendered = Some(body),
            Err(err) => limiter.key_error = KeyError::from_error(err),
        }
    }
    limiter
}

/// One limit on one key, built by [`limiter`]. Cheap to keep and reuse.
#[derive(Debug, Clone)]
#[must_use = "a limiter does nothing until `.check().await`"]
pub struct Limiter {
    handle: Option<Redguard>,
    rendered: Option<KeyBody>,
    key_error: Option<KeyError>,
    scope: String,
    rate: Option<std::result::Result<Rate, String>>,
    burst: Option<u64>,
    algorithm: Algorithm,
    cost: u64,
    block: Duration,
    wait: Duration,
    local: bool,
}

/// A key-rendering failure, kept so a reused limiter reports it on every check.
#[derive(Debug, Clone)]
enum KeyError {
    Invalid { part: String, rule: KeyRule },
    Missing { part: String },
}

impl KeyError {
    fn from_error(err: Error) -> Option<KeyError> {
        match err {
            Error::InvalidKey { part, rule } => Some(KeyError::Invalid { part, rule }),
            Error::MissingKey { part } => Some(KeyError::Missing { part }),
            _ => None,
        }
    }

    fn to_error(&self) -> Error {
        match self {
            KeyError::Invalid { part, rule } => Error::InvalidKey {
                part: part.clone(),
                rule: rule.clone(),
            },
            KeyError::Missing { part } => Error::MissingKey { part: part.clone() },
        }
    }
}

/// What [`Limiter::rate`] accepts: a [`Rate`], or text such as `"100/s"` from configuration
/// (checked when the limiter runs: a bad value is [`Error::InvalidLimit`], never a panic).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a rate",
    label = "expected a `redguard::Rate`, or text such as \"100/s\"",
    note = "build one with `redguard::Rate::new(count, period)` or `Rate::per_second(n)`, or \
            pass the configured text (`&str` / `String`)"
)]
pub trait IntoRate {
    /// The rate, or why the value is not one.
    fn into_rate(self) -> Result<Rate>;
}

impl IntoRate for Rate {
    fn into_rate(self) -> Result<Rate> {
        Ok(self)
    }
}

impl IntoRate for &Rate {
    fn into_rate(self) -> Result<Rate> {
        Ok(*self)
    }
}

impl IntoRate for &str {
    fn into_rate(self) -> Result<Rate> {
        self.parse()
    }
}

impl IntoRate for String {
    fn into_rate(self) -> Result<Rate> {
        self.parse()
    }
}

impl IntoRate for &String {
    fn into_rate(self) -> Result<Rate> {
        self.parse()
    }
}

impl Limiter {
    /// Appends the value of request field `name` to the key, validated as a key part
    /// (`[A-Za-z0-9._@-]`, ≤ 64 bytes; `None` or empty is [`Error::MissingKey`]).
    pub fn part<T: KeyPart + ?Sized>(mut self, name: &str, value: &T) -> Self {
        if self.key_error.is_none() {
            let builder = match self.rendered.take() {
                Some(body) => KeyBuilder::continuing(body),
                None => KeyBuilder::new(),
            };
            match builder.part(name, value).finish() {
                Ok(body) => self.rendered = Some(body),
                Err(err) => self.key_error = KeyError::from_error(err),
            }
        }
        self
    }

    /// The scope of the key (default `limiter`): separates unrelated limits on equal keys.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = scope.into();
        self
    }

    /// The rate (required): a [`Rate`] or text such as `"100/s"`.
    pub fn rate(mut self, rate: impl IntoRate) -> Self {
        self.rate = Some(rate.into_rate().map_err(|err| err.to_string()));
        self
    }

    /// The burst of the bucket algorithms (default: the rate's count).
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// The algorithm (default [`Algorithm::Gcra`]).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Units this call consumes (default 1); more than the burst is [`Error::InvalidLimit`].
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// Penalty: once the key exceeds its limit, reject it for `block` without counting. A
    /// limit configured without a penalty ignores one set under an earlier configuration.
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// Bounded waiting for [`enforce`](Limiter::enforce): when rejected with a `retry_after`
    /// of at most `wait`, sleep that long (plus up to 10% jitter, so waiters do not return in
    /// lockstep) and try once more. [`check`](Limiter::check) never waits.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The in-process first tier: once the store rejected this key, reject further calls
    /// (of at least that cost) locally until its `retry_after`, without a round trip. It only
    /// repeats the store's own rejections, so it never admits more than the store would.
    pub fn local(mut self, local: bool) -> Self {
        self.local = local;
        self
    }

    /// Runs on `handle` instead of the current one.
    pub fn on(mut self, handle: &Redguard) -> Self {
        self.handle = Some(handle.clone());
        self
    }

    /// Checks and, when admitted, counts this call. A rejection is `Ok` with
    /// `allowed == false`; see [`Limiter::enforce`] for an `Err` instead.
    pub async fn check(&self) -> Result<Decision> {
        let (handle, resolved) = self.resolve_alone()?;
        single(decide(&handle, &[resolved], RateMode::Consume).await?)
    }

    /// Reports what [`check`](Limiter::check) would decide, without counting.
    pub async fn peek(&self) -> Result<Decision> {
        let (handle, resolved) = self.resolve_alone()?;
        single(decide(&handle, &[resolved], RateMode::Peek).await?)
    }

    /// Like [`check`](Limiter::check), with a rejection as [`Error::RateLimited`].
    pub async fn enforce(&self) -> Result<Decision> {
        let (handle, resolved) = self.resolve_alone()?;
        single(enforce_resolved(&handle, &[resolved], &[self.wait]).await?)
    }

    /// This limit and `other`, decided together (see [`RateLimits`]).
    pub fn and(self, other: Limiter) -> RateLimits {
        RateLimits::new().with(self).with(other)
    }

    /// This limit on its own handle (or the current one), ready for the store.
    fn resolve_alone(&self) -> Result<(Redguard, Resolved<'_>)> {
        let handle = match &self.handle {
            Some(handle) => handle.clone(),
            None => Redguard::current()?,
        };
        let resolved = self.resolve(&handle)?;
        Ok((handle, resolved))
    }

    fn resolve(&self, handle: &Redguard) -> Result<Resolved<'_>> {
        if let Some(err) = &self.key_error {
            return Err(err.to_error());
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
        let body = match &self.rendered {
            Some(body) => body,
            None => &KeyBuilder::new().finish()?,
        };
        let key = handle.key(GuardKind::RateLimit, &self.scope, body)?;
        Ok(Resolved {
            key,
            limit,
            scope: &self.scope,
            local: self.local,
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
/// let user = redguard::limiter("orders:user:").part("user", &7u64).rate("1/min");
/// let both = global.clone().and(user);
/// assert!(both.enforce().await.is_ok());
/// assert!(both.enforce().await.is_err()); // the user limit says no...
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

    /// Decides and (when all admit) counts; one decision per limit, in order.
    pub async fn check(&self) -> Result<Vec<Decision>> {
        self.run(RateMode::Consume).await
    }

    /// Decides without counting.
    pub async fn peek(&self) -> Result<Vec<Decision>> {
        self.run(RateMode::Peek).await
    }

    /// Like [`check`](RateLimits::check), with a rejection as [`Error::RateLimited`] carrying
    /// the rejecting decision that asks to wait longest. Waits once if every rejecting limit
    /// allows it (see [`Limiter::wait`]).
    pub async fn enforce(&self) -> Result<Vec<Decision>> {
        let (handle, resolved) = self.resolve()?;
        let waits: Vec<Duration> = self.limiters.iter().map(|l| l.wait).collect();
        enforce_resolved(&handle, &resolved, &waits).await
    }

    fn resolve(&self) -> Result<(Redguard, Vec<Resolved<'_>>)> {
        let handle = match self.limiters.first().and_then(|l| l.handle.clone()) {
            Some(handle) => handle,
            None => Redguard::current()?,
        };
        let mut resolved = Vec::with_capacity(self.limiters.len());
        for limiter in &self.limiters {
            resolved.push(limiter.resolve(&handle)?);
        }
        Ok((handle, resolved))
    }

    async fn run(&self, mode: RateMode) -> Result<Vec<Decision>> {
        let (handle, resolved) = self.resolve()?;
        decide(&handle, &resolved, mode).await
    }
}

/// Checks `limits`; when rejected, and every rejecting limit's wait covers its
/// `retry_after`, sleeps (with jitter) and checks once more.
async fn enforce_resolved(
    handle: &Redguard,
    limits: &[Resolved<'_>],
    waits: &[Duration],
) -> Result<Vec<Decision>> {
    let decisions = decide(handle, limits, RateMode::Consume).await?;
    let Some(rejected) = most_restrictive(&decisions) else {
        return Ok(decisions);
    };
    let may_wait = decisions
        .iter()
        .zip(waits)
        .all(|(d, wait)| d.allowed || d.retry_after <= *wait);
    if !may_wait {
        return Err(Error::RateLimited(rejected));
    }
    tokio::time::sleep(rejected.retry_after + jitter(rejected.retry_after)).await;
    let decisions = decide(handle, limits, RateMode::Consume).await?;
    match most_restrictive(&decisions) {
        Some(rejected) => Err(Error::RateLimited(rejected)),
        None => Ok(decisions),
    }
}

/// Up to 10% of `base` (at most 50 ms), random: waiters released by the same refill do not
/// all come back in the same millisecond.
fn jitter(base: Duration) -> Duration {
    let cap = (base / 10).min(Duration::from_millis(50));
    let cap_us = u64::try_from(cap.as_micros()).unwrap_or(0);
    if cap_us == 0 {
        return Duration::ZERO;
    }
    let random = uuid::Uuid::new_v4().as_u128() as u64;
    Duration::from_micros(random % cap_us)
}

/// The rejecting decision that asks to wait longest, if any limit rejected.
fn most_restrictive(decisions: &[Decision]) -> Option<Decision> {
    decisions
        .iter()
        .filter(|d| !d.allowed)
        .max_by_key(|d| d.retry_after)
        .copied()
}

/// One limit ready for the store.
#[derive(Debug)]
struct Resolved<'a> {
    key: Key,
    limit: Limit,
    scope: &'a str,
    local: bool,
}

/// Asks the store (or the local tier), applying the fail mode, and records the outcome.
async fn decide(
    handle: &Redguard,
    limits: &[Resolved<'_>],
    mode: RateMode,
) -> Result<Vec<Decision>> {
    let Some(first) = limits.first() else {
        return Ok(Vec::new());
    };
    // The same key twice in one call would be decided twice on the same state and charged
    // once: refuse it rather than under-count.
    for (i, r) in limits.iter().enumerate() {
        if limits[..i].iter().any(|other| other.key == r.key) {
            return Err(Error::InvalidLimit(format!(
                "two limits of one call use the key `{}`; give them different keys or scopes",
                r.key
            )));
        }
    }
    if mode == RateMode::Consume
        && let Some(decisions) = local_rejection(handle, limits)
    {
        return Ok(decisions);
    }
    let checks: Vec<RateCheck<'_>> = limits
        .iter()
        .map(|r| RateCheck {
            key: &r.key,
            limit: &r.limit,
        })
        .collect();
    let op = match mode {
        RateMode::Consume => "rate_check",
        RateMode::Peek => "rate_peek",
    };
    let outcome = handle.store().rate_check(&checks, mode).await;
    let Some(outcome) = outcome.or_degrade(handle, GuardKind::RateLimit, op, &first.key)? else {
        return Ok(limits
            .iter()
            .map(|r| Decision::degraded(r.limit.burst, r.limit.window()))
            .collect());
    };
    if mode == RateMode::Consume {
        let allowed = outcome.allowed();
        for (r, decision) in limits.iter().zip(&outcome.decisions) {
            let (key, scope) = (&r.key, r.scope);
            if r.local {
                if decision.allowed {
                    local::forget(handle, key);
                } else {
                    local::remember(handle, key, r.limit.cost, *decision);
                }
            }
            let result = match (allowed, decision.allowed) {
                (true, _) => "allowed",
                (false, false) => "rejected",
                // Admitted by this limit, turned away by another: not charged.
                (false, true) => "not_charged",
            };
            metrics::counter!(
                "redguard_rate_decisions_total",
                "scope" => scope.to_string(),
                "outcome" => result,
            )
            .increment(1);
            if !decision.allowed {
                tracing::debug!(
                    guard = "rate",
                    %key,
                    outcome = result,
                    retry_after_ms = decision.retry_after.as_millis() as u64,
                    "rate limited"
                );
            }
        }
    }
    Ok(outcome.decisions)
}

/// Decisions when the local tier already knows a limit is exhausted: the known rejection for
/// those limits, and for the others an "admitted, not charged" decision (they were not asked).
fn local_rejection(handle: &Redguard, limits: &[Resolved<'_>]) -> Option<Vec<Decision>> {
    let known: Vec<Option<Decision>> = limits
        .iter()
        .map(|r| {
            r.local
                .then(|| local::rejected(handle, &r.key, r.limit.cost))
                .flatten()
        })
        .collect();
    if known.iter().all(Option::is_none) {
        return None;
    }
    Some(
        limits
            .iter()
            .zip(known)
            .map(|(r, known)| {
                metrics::counter!(
                    "redguard_rate_decisions_total",
                    "scope" => r.scope.to_string(),
                    "outcome" => if known.is_some() { "rejected_local" } else { "not_charged" },
                )
                .increment(1);
                known.unwrap_or_else(|| Decision::degraded(r.limit.burst, r.limit.window()))
            })
            .collect(),
    )
}

/// A limit as `#[rate_limit]` evaluated it for one call, before the body ran. Errors (a bad
/// key part, a bad configured rate) are kept and reported when the wrapper runs.
#[doc(hidden)]
#[derive(Debug)]
pub struct RateSpec {
    key: Result<KeyBody>,
    scope: &'static str,
    rate: Result<Rate>,
    burst: Option<Result<u64>>,
    algorithm: Algorithm,
    cost: Result<u64>,
    block: Duration,
    wait: Duration,
    local: bool,
}

/// Built by the expansion as `rate_spec(key, scope, rate)` followed by one call per argument
/// the user wrote.
#[doc(hidden)]
impl RateSpec {
    pub fn new(key: Result<KeyBody>, scope: &'static str, rate: Result<Rate>) -> RateSpec {
        RateSpec {
            key,
            scope,
            rate,
            burst: None,
            algorithm: Algorithm::Gcra,
            cost: Ok(1),
            block: Duration::ZERO,
            wait: Duration::ZERO,
            local: false,
        }
    }

    pub fn burst(mut self, burst: Result<u64>) -> Self {
        self.burst = Some(burst);
        self
    }

    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    pub fn cost(mut self, cost: Result<u64>) -> Self {
        self.cost = cost;
        self
    }

    pub fn block_ms(mut self, ms: u64) -> Self {
        self.block = Duration::from_millis(ms);
        self
    }

    pub fn wait_ms(mut self, ms: u64) -> Self {
        self.wait = Duration::from_millis(ms);
        self
    }

    pub fn local(mut self, local: bool) -> Self {
        self.local = local;
        self
    }
}

/// Decides the stacked limits of one guarded call, all-or-nothing; a rejection is
/// [`Error::RateLimited`].
pub(crate) async fn enforce_specs(specs: Vec<RateSpec>) -> Result<()> {
    let handle = Redguard::current()?;
    let mut resolved = Vec::with_capacity(specs.len());
    let waits: Vec<Duration> = specs.iter().map(|spec| spec.wait).collect();
    for spec in specs {
        let burst = spec.burst.transpose()?;
        let limit = Limit::new(spec.algorithm, spec.rate?, burst, spec.cost?, spec.block)?;
        let key = handle.key(GuardKind::RateLimit, spec.scope, &spec.key?)?;
        resolved.push(Resolved {
            key,
            limit,
            scope: spec.scope,
            local: spec.local,
        });
    }
    enforce_resolved(&handle, &resolved, &waits).await.map(drop)
}
