//! The [`Redguard`] handle: a store plus the settings every guard reads; its [`Builder`]
//! (`builder.rs`) for each [target](Target) (`target.rs`); and the process-wide current
//! handle that macro expansions use (`current.rs`).

mod builder;
mod current;
mod target;

use std::fmt;
use std::sync::{Arc, Once};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::key::{GuardKind, Key, KeyBody};
use crate::state::State;
use crate::store::{MemoryStore, Store};

use self::builder::Settings;
pub use self::builder::{
    Builder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, DEFAULT_TIMEOUT, FailMode,
    MAX_FALLBACK_INSTANCES,
};
pub use self::current::spawn;
pub(crate) use self::current::{need_runtime, need_runtime_for};
#[cfg(feature = "sentinel")]
pub use self::target::Sentinel;
pub use self::target::{Target, Topology};
pub use crate::store::{Eviction, EvictionCheck, Health, StoreKind};

/// A store and its settings: the entry point of the runtime.
///
/// Build one at startup, then either [`install`](Redguard::install) it as the process-wide
/// default (what `#[idempotent]`, `#[dist_lock]` and `#[rate_limit]` use) or pass it around.
/// Clones share the store.
///
/// ```no_run
/// # async fn run() -> redguard::Result<()> {
/// use std::time::Duration;
/// use redguard::Redguard;
/// use redguard::handle::FailMode;
/// use redguard::key::GuardKind;
///
/// Redguard::redis("redis://:secret@127.0.0.1:6379/0")
///     .prefix("shop")
///     .timeout(Duration::from_millis(150))
///     .fail_mode(GuardKind::RateLimit, FailMode::Closed)
///     .connect()
///     .await?
///     .install()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redguard {
    inner: Arc<Inner>,
}

/// A [`Redguard`] that does not keep its handle alive: a background task's reference, which
/// ends when the application drops the handle.
#[derive(Clone)]
pub(crate) struct WeakRedguard(std::sync::Weak<Inner>);

impl WeakRedguard {
    pub(crate) fn upgrade(&self) -> Option<Redguard> {
        self.0.upgrade().map(|inner| Redguard { inner })
    }
}

struct Inner {
    store: Arc<dyn Store>,
    settings: Settings,
    /// Shared with the twin: it is this handle on another connection (its locks' queues and
    /// watchdogs are this handle's).
    state: Arc<State>,
    /// This handle on the store's [`Store::twin`], opened on first use; `Some(None)` when
    /// the store has no twin, or this is a twin.
    twin: tokio::sync::OnceCell<Option<Redguard>>,
}

impl fmt::Debug for Redguard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redguard")
            .field("store", &self.inner.store)
            .field("settings", &self.inner.settings)
            .finish()
    }
}

impl Redguard {
    /// A handle on a fresh in-process store with default settings. Safe for one instance
    /// only. Its clock is a [`TokioClock`](crate::clock::TokioClock): with Tokio's time paused
    /// (`#[tokio::test(start_paused = true)]`), records expire, leases end and rate windows
    /// turn as `tokio::time::advance` says.
    ///
    /// ```
    /// let rg = redguard::Redguard::memory();
    /// assert_eq!(rg.prefix(), "redguard");
    /// ```
    pub fn memory() -> Redguard {
        Redguard::from_store(MemoryStore::with_clock(crate::clock::TokioClock::new()))
    }

    /// A handle on `store` with default settings (the seam is crate-private: redguard's own
    /// tests reach this through `__private::store`).
    pub(crate) fn from_store(store: impl Store) -> Redguard {
        Redguard::new(Arc::new(store), Settings::default())
    }

    /// This handle's settings on `wrap` of its store, with guard state of its own: how
    /// `redguard::testing` puts its faulty and pass-through stores behind a handle.
    #[cfg(feature = "testing")]
    pub(crate) fn wrap_store(
        &self,
        wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
    ) -> Redguard {
        Redguard::new(
            wrap(Arc::clone(&self.inner.store)),
            self.inner.settings.clone(),
        )
    }

    /// This handle's store and settings with every key under `prefix`, and guard state of its
    /// own: how `testing::Explore::on` keeps each run's keys apart on one Redis.
    #[cfg(feature = "testing")]
    pub(crate) fn under_prefix(&self, prefix: String) -> Redguard {
        let mut settings = self.inner.settings.clone();
        settings.prefix = prefix;
        Redguard::new(Arc::clone(&self.inner.store), settings)
    }

    fn new(store: Arc<dyn Store>, settings: Settings) -> Redguard {
        Redguard {
            inner: Arc::new(Inner {
                store,
                settings,
                state: Arc::default(),
                twin: tokio::sync::OnceCell::new(),
            }),
        }
    }

    /// Builds a handle from the environment, the first of these naming its Redis:
    ///
    /// - `REDGUARD_REDIS_CLUSTER_URLS` (comma-separated, feature `cluster`): a Cluster;
    /// - `REDGUARD_REDIS_SENTINELS` (comma-separated `host:port` or `redis://` URLs, feature
    ///   `sentinel`): the master the sentinels name, with `REDGUARD_REDIS_MASTER` (the
    ///   master's name, default `mymaster`), `REDGUARD_REDIS_SENTINEL_USERNAME` /
    ///   `REDGUARD_REDIS_SENTINEL_PASSWORD` (the sentinels' credentials),
    ///   `REDGUARD_REDIS_USERNAME` / `REDGUARD_REDIS_PASSWORD` (the master's) and
    ///   `REDGUARD_REDIS_DB` (its database number); setting `REDGUARD_REDIS_URL` as well is
    ///   an error;
    /// - `REDGUARD_REDIS_URL`, else `REDIS_URL`: one Redis.
    ///
    /// With any of them, `REDGUARD_TLS_CA` names a PEM file of roots to trust and
    /// `REDGUARD_PREFIX` the prefix. With no Redis named, the in-process store is used
    /// (logged once at info level).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// // With no Redis variable set, this is the in-memory store.
    /// # unsafe { std::env::remove_var("REDGUARD_REDIS_URL"); std::env::remove_var("REDIS_URL"); }
    /// let rg = redguard::Redguard::from_env().await?;
    /// assert_eq!(rg.kind(), redguard::handle::StoreKind::Memory);
    /// # Ok(()) }
    /// ```
    pub async fn from_env() -> Result<Redguard> {
        if let Some(builder) = crate::env::builder()? {
            return builder.connect().await;
        }
        static LOGGED: Once = Once::new();
        LOGGED.call_once(|| {
            tracing::info!(
                "REDGUARD_REDIS_URL and REDIS_URL are unset: using the in-memory store, \
                 which guards this process only"
            );
        });
        let builder = Redguard::memory_builder();
        match crate::env::prefix() {
            Some(prefix) => builder.prefix(prefix).connect().await,
            None => builder.connect().await,
        }
    }

    /// What is behind this handle: memory, or Redis as a single node, a Cluster or through
    /// Sentinel.
    ///
    /// ```
    /// use redguard::handle::StoreKind;
    ///
    /// assert_eq!(redguard::Redguard::memory().kind(), StoreKind::Memory);
    /// ```
    pub fn kind(&self) -> StoreKind {
        self.inner.store.kind()
    }

    /// Asks the store to answer, within the handle's [`timeout`](Builder::timeout): one
    /// round trip (`PING` on Redis), and the server's version when the user may read it
    /// (`INFO server`). The in-process store is always up. An error is the store's trouble
    /// (a timeout, a refused connection), as a guard would meet it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let health = redguard::Redguard::memory().health().await?;
    /// assert_eq!(health.kind, redguard::handle::StoreKind::Memory);
    /// assert_eq!(health.server, None);
    /// # Ok(()) }
    /// ```
    pub async fn health(&self) -> Result<Health> {
        self.inner.store.health().await
    }

    /// The store behind this handle: the guards' seam, not a user API.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// In-process state of this handle's guards (local queues, the local rate tier).
    pub(crate) fn state(&self) -> &State {
        &self.inner.state
    }

    /// Whether decisions are tallied for `top` ([`Builder::top_tally`]).
    pub(crate) fn top_tally(&self) -> bool {
        self.inner.settings.top_tally
    }

    /// How many keys per scope and outcome the tally exports as gauges
    /// ([`Builder::top_metrics`]); 0: none.
    pub(crate) fn top_metrics(&self) -> usize {
        self.inner.settings.top_metrics
    }

    pub(crate) fn downgrade(&self) -> WeakRedguard {
        WeakRedguard(Arc::downgrade(&self.inner))
    }

    /// The handle a guard with [`Replicas`](crate::Replicas) runs on, every call of it (so
    /// an undo still follows its write on the same connection): this one on the store's
    /// [`twin`](Store::twin), whose `WAIT`s then hold up no other guard's calls. When the
    /// twin's connection cannot be opened, this handle (the `WAIT` confirms as well on it, it
    /// only holds up the others while replicas lag), and the next call tries again: the
    /// guard's own call then meets the store's trouble, and its `FailMode`.
    pub(crate) async fn for_replicas(&self) -> Redguard {
        let twin = self
            .inner
            .twin
            .get_or_try_init(|| async {
                Ok::<_, Error>(self.inner.store.twin().await?.map(|store| Redguard {
                    inner: Arc::new(Inner {
                        store,
                        settings: self.inner.settings.clone(),
                        state: Arc::clone(&self.inner.state),
                        twin: tokio::sync::OnceCell::new_with(Some(None)),
                    }),
                }))
            })
            .await;
        match twin {
            Ok(twin) => twin.clone().unwrap_or_else(|| self.clone()),
            Err(err) => {
                tracing::warn!(error = %err, "could not open the connection for writes that wait for replicas; they share the handle's");
                self.clone()
            }
        }
    }

    /// The prefix of every key this handle writes.
    pub fn prefix(&self) -> &str {
        &self.inner.settings.prefix
    }

    /// The bound on each store call.
    pub fn timeout(&self) -> Duration {
        self.inner.settings.timeout
    }

    /// What `guard` does when the store cannot answer.
    pub fn fail_mode(&self, guard: GuardKind) -> FailMode {
        let settings = &self.inner.settings;
        match guard {
            GuardKind::Idempotency | GuardKind::Token => settings.idempotency,
            GuardKind::Lock => settings.lock,
            GuardKind::RateLimit => settings.rate_limit,
        }
    }

    /// The full store key for `body` of `guard` in `scope`.
    pub fn key(&self, guard: GuardKind, scope: &str, body: &KeyBody) -> Result<Key> {
        Key::new(self.prefix(), guard, scope, body)
    }
}
