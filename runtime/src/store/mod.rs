//! The seam between guards and where their state lives.
//!
//! [`Store`] is a small set of *guard operations* — each one atomic, each one a single round
//! trip — not a list of Redis commands. Each guard declares its operations as a sub-trait in
//! its own file here ([`TokenOps`], [`IdemOps`], [`LockOps`], [`RateOps`], and [`AdminOps`] for the operator's
//! tools); [`Store`] is all of them
//! together.
//! [`RedisStore`] implements them as Lua scripts that read Redis's own clock;
//! [`MemoryStore`] implements the same semantics in-process. Both run the same conformance
//! suite (`tests/tests/it/conformance*.rs`), so a guard behaves the same on either, and the
//! guards never know which one is behind.
//!
//! Not a public API: guards are what users call. Its items are `pub` so that redguard's own
//! tests reach them, with the `test-util` feature only, through
//! `redguard::__private::store` (unstable: it changes with any release).
// Without `test-util` nothing outside the crate reaches these `pub` items.
#![cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]

pub mod admin;
mod idem;
pub(crate) mod lock;
mod memory;
mod rate;
mod redis;
mod token;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;

pub use self::admin::AdminOps;
pub use self::idem::{
    Begin, Finish, IdemBegin, IdemFinish, IdemFinished, IdemOps, IdemStatus, Resolve, Resolved,
};
pub use self::lock::{
    Acquire, FAIR_REGISTRATION, LockAcquire, LockOps, LockRelease, LockWatch, Release, rw_readers,
};
#[cfg(feature = "test-util")]
pub use self::lock::{FENCE_TTL, WRITER_INTENT};
pub use self::memory::MemoryStore;
pub use self::rate::{RateAdjust, RateCheck, RateMode, RateOps, RateOutcome};
pub use self::redis::RedisStore;
#[cfg(feature = "sentinel")]
pub(crate) use self::redis::{Auth as SentinelAuth, SentinelTarget};
pub(crate) use self::redis::{Conn, Endpoint, Existing, Options, RedisTarget};
pub use self::token::{TokenOps, TokenOutcome};
#[cfg(feature = "test-util")]
pub use crate::error::StoreFailure;
#[cfg(feature = "test-util")]
pub use crate::values::Replicas;

/// Where guard state lives. Implemented by [`RedisStore`] and [`MemoryStore`].
///
/// Every operation is atomic with respect to every other operation on the same key, writes
/// only keys with a TTL, and is bounded in time (the Redis store by its per-call timeout).
///
#[async_trait]
pub trait Store:
    TokenOps + IdemOps + LockOps + RateOps + AdminOps + Send + Sync + fmt::Debug + 'static
{
    /// Which implementation this is.
    fn kind(&self) -> StoreKind;

    /// The store's clock, as a duration since the Unix epoch. Guards that need time read it
    /// inside their own operation; this is for diagnostics and tests.
    async fn time(&self) -> Result<Duration>;

    /// The same store on connections of its own, for the guards whose writes wait for
    /// replicas ([`Replicas`]): Redis's `WAIT` blocks the connection that
    /// sent it, so on a shared one every other call would queue behind it. `None` (the
    /// default) when there is no connection to keep apart: use this store as it is.
    async fn twin(&self) -> Result<Option<std::sync::Arc<dyn Store>>> {
        Ok(None)
    }

    /// Whether an operator's reset of the rate limit at `key` reached this store after
    /// `since` (announced by [`AdminOps::admin_announce_reset`]); the local tier then forgets
    /// the key. `false` (the default) when the store has no such notifications.
    fn rate_reset_after(&self, _key: &crate::key::Key, _since: std::time::Instant) -> bool {
        false
    }

    /// Starts listening for [`rate_reset_after`](Store::rate_reset_after)'s notifications
    /// (the default: there are none).
    fn listen_rate_resets(&self) {}

    /// One bounded round trip to the store, and the server that answered when it says (the
    /// default: the round trip of [`time`](Store::time), no server).
    async fn health(&self) -> Result<Health> {
        let started = std::time::Instant::now();
        self.time().await?;
        Ok(Health {
            kind: self.kind(),
            round_trip: started.elapsed(),
            server: None,
            eviction: None,
        })
    }
}

/// What is behind a handle: the in-process store, or Redis as a single node, a Cluster or
/// the master Redis Sentinel names.
///
/// ```
/// use redguard::handle::StoreKind;
///
/// assert_eq!(redguard::Redguard::memory().kind(), StoreKind::Memory);
/// assert_eq!(StoreKind::Cluster.to_string(), "redis-cluster");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreKind {
    /// Redis, a single node (opened by redguard or handed over by the application).
    Redis,
    /// A Redis Cluster.
    Cluster,
    /// The master Redis Sentinel names, followed through failovers.
    Sentinel,
    /// The in-process store.
    Memory,
}

impl StoreKind {
    /// `"redis"`, `"redis-cluster"`, `"redis-sentinel"` or `"memory"`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Redis => "redis",
            StoreKind::Cluster => "redis-cluster",
            StoreKind::Sentinel => "redis-sentinel",
            StoreKind::Memory => "memory",
        }
    }

    /// Whether Redis is behind the handle (in any topology).
    pub fn is_redis(self) -> bool {
        self != StoreKind::Memory
    }
}

/// What [`Redguard::health`](crate::Redguard::health) found: the store answered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// What is behind the handle.
    pub kind: StoreKind,
    /// How long the store took to answer one round trip.
    pub round_trip: Duration,
    /// The server that answered, as `INFO server` names it (`"Redis 7.2.4"`); `None` for the
    /// in-process store, or when the user may not run `INFO`.
    pub server: Option<String>,
    /// The server's eviction setting, read now (on a Cluster: the first node that may evict
    /// guard keys, else any); `None` for the in-process store, or when the user may not run
    /// `INFO`.
    pub eviction: Option<Eviction>,
}

/// A Redis server's memory eviction setting, as `INFO memory` shows it.
///
/// When Redis reaches `maxmemory` it evicts keys by `maxmemory-policy`: `allkeys-*` any key,
/// `volatile-*` any key with a TTL — and every key redguard writes has one. An evicted lock
/// lets a second holder in, an evicted fence counter starts again lower (fences stay above
/// Redis's clock in µs, but no longer above every fence handed out), an evicted SUCCESS
/// record runs a payment twice. Only `noeviction` (writes refused with an error at the
/// limit, which the guards' fail modes handle) or no `maxmemory` keeps them: give redguard a
/// Redis of its own with that setting when the application's caches need eviction.
///
/// ```
/// use redguard::handle::Eviction;
///
/// let safe = Eviction::new("noeviction", 1 << 30);
/// assert!(!safe.may_evict_guard_keys());
/// assert!(Eviction::new("volatile-lru", 1 << 30).may_evict_guard_keys());
/// assert!(!Eviction::new("allkeys-lru", 0).may_evict_guard_keys()); // no limit set
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Eviction {
    /// `maxmemory-policy`: `noeviction`, `allkeys-lru`, `volatile-ttl`, …
    pub policy: String,
    /// `maxmemory` in bytes; `0` is no limit (on 64-bit servers), so nothing is evicted.
    pub maxmemory: u64,
}

impl Eviction {
    /// The setting `policy` with `maxmemory` bytes.
    pub fn new(policy: impl Into<String>, maxmemory: u64) -> Eviction {
        Eviction {
            policy: policy.into(),
            maxmemory,
        }
    }

    /// Whether the server may evict guard keys when it is full: a `maxmemory` set with any
    /// policy but `noeviction`.
    pub fn may_evict_guard_keys(&self) -> bool {
        self.maxmemory != 0 && self.policy != "noeviction"
    }
}

/// What [`connect`](crate::handle::Builder::connect) does when the server
/// [may evict guard keys](Eviction::may_evict_guard_keys) (set with
/// [`Builder::eviction_check`](crate::handle::Builder::eviction_check)). A server whose
/// user may not run `INFO` is not checked.
///
/// ```no_run
/// # async fn run() -> redguard::Result<()> {
/// use redguard::{Redguard, handle::EvictionCheck};
///
/// // A payment service: better no service than a lock that may vanish.
/// let rg = Redguard::redis("redis://127.0.0.1:6379/")
///     .eviction_check(EvictionCheck::Refuse)
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum EvictionCheck {
    /// Connect, and log a warning naming the setting and the fix (the default).
    #[default]
    Warn,
    /// Refuse to connect: [`Error::Config`](crate::Error::Config) naming the setting.
    Refuse,
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
