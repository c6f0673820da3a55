//! [`Builder`]: the settings every handle shares, written once for every target, and
//! `connect`.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::Redguard;
use super::target::{Backend, Target, Topology};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::key::{GuardKind, check_name};
use crate::store::{EvictionCheck, MemoryStore, Options, RedisStore, RedisTarget, Store};

/// Default bound on every store call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);
/// Default bound on establishing the Redis connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "redguard";

/// What a guard does when the store cannot answer.
///
/// Defaults follow what each guard protects: rate limits fail **open** (an outage of the
/// limiter should not become an outage of the service); idempotency, tokens and locks fail
/// **closed** (a duplicate order, a reused token or an unprotected critical section is what
/// they exist to prevent: a `503` the client retries is the cheaper outcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailMode {
    /// Let the call through, log a warning and count it.
    Open,
    /// Refuse the call with [`Error::Backend`].
    Closed,
    /// Rate limits only: decide in process, each instance at its share of every limit (rate
    /// and burst divided by `instances`, the burst rounded down but never below one call),
    /// until the store answers again; then, for one window of each limit, admit a key that
    /// was admitted locally only when the store and the local limiter both do, so the
    /// store, which did not see the local admissions, grants no stale burst. Build it with
    /// [`FailMode::local`]; the guide's [failures page](crate::guide::failures) has the
    /// details.
    Local {
        /// The instances expected to share the limit while the store is down.
        instances: NonZeroU32,
    },
}

/// The most instances [`FailMode::local`] takes.
pub const MAX_FALLBACK_INSTANCES: u32 = 100_000;

impl FailMode {
    /// The local fallback for a service of `instances` instances (1 to
    /// [`MAX_FALLBACK_INSTANCES`]): each admits `rate ÷ instances`, bursts of
    /// `burst ÷ instances`, while the store cannot answer.
    ///
    /// ```
    /// use redguard::handle::FailMode;
    ///
    /// let mode = FailMode::local(4)?;
    /// assert!(matches!(mode, FailMode::Local { instances } if instances.get() == 4));
    /// assert!(FailMode::local(0).is_err());
    /// # Ok::<(), redguard::Error>(())
    /// ```
    pub fn local(instances: u32) -> Result<FailMode> {
        NonZeroU32::new(instances)
            .filter(|n| n.get() <= MAX_FALLBACK_INSTANCES)
            .map(|instances| FailMode::Local { instances })
            .ok_or_else(|| {
                Error::Config(format!(
                    "a local fallback needs 1 to {MAX_FALLBACK_INSTANCES} instances, not \
                     {instances}"
                ))
            })
    }
}

#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) prefix: String,
    pub(super) timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) idempotency: FailMode,
    pub(super) lock: FailMode,
    pub(super) rate_limit: FailMode,
    pub(super) top_tally: bool,
    pub(super) top_metrics: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            idempotency: FailMode::Closed,
            lock: FailMode::Closed,
            rate_limit: FailMode::Open,
            top_tally: true,
            top_metrics: 0,
        }
    }
}

/// Builds a [`Redguard`]; start from [`Redguard::redis`], [`Redguard::redis_cluster`],
/// [`Redguard::redis_sentinel`] (a `Builder<Sentinel>`, with the sentinel settings) or
/// [`Redguard::memory_builder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `.connect().await`"]
pub struct Builder<T: Topology = Target> {
    pub(super) topology: T,
    settings: Settings,
    /// The Redis connection's settings whatever the endpoint.
    options: Options,
    /// A setting that does not apply to the target, reported by `connect`, where errors are
    /// returned.
    misuse: Option<&'static str>,
}

impl<T: Topology> Builder<T> {
    pub(super) fn new(topology: T) -> Self {
        Builder {
            topology,
            settings: Settings::default(),
            options: Options::default(),
            misuse: None,
        }
    }

    pub(super) fn misused(mut self, misuse: Option<&'static str>) -> Self {
        self.misuse = self.misuse.or(misuse);
        self
    }

    #[cfg(feature = "sentinel")]
    pub(super) fn map<U: Topology>(self, f: impl FnOnce(T) -> U) -> Builder<U> {
        Builder {
            topology: f(self.topology),
            settings: self.settings,
            options: self.options,
            misuse: self.misuse,
        }
    }

    /// The first segment of every key (default `redguard`): `[A-Za-z0-9._@:-]`, ≤ 64 bytes.
    /// Give each application sharing a Redis its own.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.prefix = prefix.into();
        self
    }

    /// Bound on each store call (default 250 ms). A hung Redis costs at most this per call.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// Bound on establishing the connection at [`connect`](Builder::connect) (default 3 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// What `guard` does when the store cannot answer; see [`FailMode`] for the defaults.
    /// [`GuardKind::Token`] shares the idempotency setting. [`FailMode::Local`] applies to
    /// rate limits only (`connect` refuses it for another guard).
    ///
    /// ```no_run
    /// # async fn run() -> redguard::Result<()> {
    /// use redguard::{Redguard, handle::FailMode, key::GuardKind};
    ///
    /// // Three instances: while Redis is down, each admits a third of every rate limit.
    /// let rg = Redguard::redis("redis://127.0.0.1:6379/")
    ///     .fail_mode(GuardKind::RateLimit, FailMode::local(3)?)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn fail_mode(mut self, guard: GuardKind, mode: FailMode) -> Self {
        if matches!(mode, FailMode::Local { .. }) && guard != GuardKind::RateLimit {
            return self.misused(Some(
                "`FailMode::Local` applies to rate limits only: a lock, an idempotency key or \
                 a token decided in one process would not exclude the others",
            ));
        }
        match guard {
            GuardKind::Idempotency | GuardKind::Token => self.settings.idempotency = mode,
            GuardKind::Lock => self.settings.lock = mode,
            GuardKind::RateLimit => self.settings.rate_limit = mode,
        }
        self
    }

    /// Whether this handle tallies the keys its rate limits admit and refuse most, for
    /// [`Admin::top`](crate::admin::Admin::top) and `redguard top` (default on): a map update
    /// in process per decision, and one store call per scope and outcome per second while
    /// decisions are made. Off, `top` counts nothing of this instance.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory_builder().top_tally(false).connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn top_tally(mut self, on: bool) -> Self {
        self.settings.top_tally = on;
        self
    }

    /// Exports this instance's `keys` most admitted and most refused keys per scope (at most
    /// 64; default 0: off) as the gauge `redguard_rate_top_calls{scope, outcome, key}`, their
    /// calls in the last second, set once a second by the tally ([`top_tally`](Self::top_tally)
    /// must be on). A key that leaves the top is set to 0 once and not set again, so at any
    /// time at most `keys` series per scope and outcome change; **the exporter must drop
    /// gauges left idle** (metrics-exporter-prometheus:
    /// `idle_timeout(MetricKindMask::GAUGE, Some(Duration::from_secs(60)))`), or every key
    /// that was ever in the top stays a series: off by default for that reason.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory_builder().top_metrics(10).connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn top_metrics(mut self, keys: usize) -> Self {
        self.settings.top_metrics = keys.min(crate::rate::top::SKETCH);
        self
    }

    /// What [`connect`](Builder::connect) does when the Redis server may evict guard keys
    /// (a `maxmemory` with any `maxmemory-policy` but `noeviction`; see [`Eviction`]): warn
    /// (the default) or refuse. The in-process store evicts nothing.
    ///
    /// [`Eviction`]: crate::handle::Eviction
    pub fn eviction_check(mut self, check: EvictionCheck) -> Self {
        self.options.eviction = check;
        self
    }

    /// Trusts the PEM certificate(s) in `pem` for a `rediss://` connection, instead of the
    /// system's root certificates (a private CA, a self-signed server).
    ///
    /// ```no_run
    /// # async fn run() -> redguard::Result<()> {
    /// let ca = std::fs::read("/etc/redis/tls/ca.crt").expect("read the CA");
    /// let rg = redguard::Redguard::redis("rediss://redis.internal:6380")
    ///     .tls_root_ca(ca)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        if self.topology.opens() {
            self.options.tls_root_ca = Some(pem.into());
            self
        } else if self.is_memory() {
            self.misused(Some("`tls_root_ca` applies to Redis stores only"))
        } else {
            self.misused(Some(
                "`tls_root_ca` applies to connections redguard opens; configure TLS on the \
                 client of an existing connection",
            ))
        }
    }

    /// The clock of an in-memory store (default: [`TokioClock`](crate::clock::TokioClock), the
    /// system's time that follows Tokio's paused time in tests). Redis uses its own clock,
    /// so setting one on a Redis builder is a configuration error — except with the
    /// `test-util` feature, where it pins the scripts' clock (see `script_transform`).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        if let Some(current) = self.topology.memory_clock() {
            *current = Arc::new(clock);
            return self;
        }
        self.pin_script_clock(Arc::new(clock))
    }

    #[cfg(feature = "test-util")]
    fn pin_script_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.options.test.clock = Some(clock);
        self
    }

    #[cfg(not(feature = "test-util"))]
    fn pin_script_clock(self, _: Arc<dyn Clock>) -> Self {
        self.misused(Some(
            "a Redis store takes time from Redis; `clock` applies to in-memory stores only",
        ))
    }

    /// Test-only (the `test-util` feature, never for production): every script this Redis
    /// store runs is rewritten by `transform` and sent with `EVAL`. With [`clock`](Builder::clock)
    /// set on a Redis builder, the scripts' `TIME` is that clock's time as well, so tests can
    /// compare them exactly with a model on a virtual clock, or run deliberately mutated scripts.
    /// Redis still expires keys on its own clock.
    #[cfg(feature = "test-util")]
    pub fn script_transform(
        mut self,
        transform: impl Fn(&str) -> String + Send + Sync + 'static,
    ) -> Self {
        if self.is_memory() {
            return self.misused(Some("`script_transform` applies to Redis stores only"));
        }
        self.options.test.transform = Some(Arc::new(transform));
        self
    }

    #[cfg(any(feature = "tls", feature = "test-util"))]
    fn is_memory(&mut self) -> bool {
        self.topology.memory_clock().is_some()
    }

    /// Validates the settings and connects (for Redis: one connection, scripts loaded).
    pub async fn connect(self) -> Result<Redguard> {
        if let Some(misuse) = self.misuse {
            return Err(Error::Config(misuse.to_owned()));
        }
        let settings = self.settings;
        check_name("prefix", &settings.prefix, 64)?;
        crate::telemetry::describe_metrics();
        if settings.timeout.is_zero() || settings.connect_timeout.is_zero() {
            return Err(Error::Config(
                "timeouts must be greater than zero".to_owned(),
            ));
        }
        let store: Arc<dyn Store> = match self.topology.into_target().0 {
            Backend::Redis(endpoint) => Arc::new(
                RedisStore::connect(
                    RedisTarget {
                        endpoint,
                        options: self.options,
                    },
                    &settings.prefix,
                    settings.timeout,
                    settings.connect_timeout,
                )
                .await?,
            ),
            Backend::Memory(clock) => Arc::new(MemoryStore::with_clock(clock)),
        };
        Ok(Redguard::new(store, settings))
    }
}

impl Clock for Arc<dyn Clock> {
    fn now(&self) -> Duration {
        (**self).now()
    }
}
