//! The [`Redguard`] handle: a store plus the settings every guard reads, and the process-wide
//! default that macro expansions use.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, Once, PoisonError};
use std::time::Duration;

use once_cell::sync::OnceCell;
use tokio::runtime;

use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result};
use crate::key::{GuardKind, Key, KeyBody, check_name};
use crate::state::State;
use crate::store::{Conn, Existing, MemoryStore, RedisStore, RedisTarget, Store};
#[cfg(feature = "sentinel")]
use crate::store::{SentinelAuth, SentinelTarget};

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
}

#[derive(Debug, Clone)]
struct Settings {
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    idempotency: FailMode,
    lock: FailMode,
    rate_limit: FailMode,
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
        }
    }
}

/// A store and its settings: the entry point of the runtime.
///
/// Build one at startup, then either [`install`](Redguard::install) it as the process-wide
/// default (what `#[idempotent]`, `#[dist_lock]` and `#[rate_limit]` use) or pass it around.
/// Clones share the store.
///
/// ```no_run
/// # async fn run() -> redguard::Result<()> {
/// use std::time::Duration;
/// use redguard::{FailMode, GuardKind, Redguard};
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

static INSTALLED: OnceCell<Redguard> = OnceCell::new();

tokio::task_local! {
    static SCOPED: Redguard;
}

/// Scope futures being run now, per Tokio runtime, so a task without a handle can be told
/// that it was probably spawned from inside one (per runtime: a scope in another runtime, a
/// test running next to this one, says nothing about this task).
static LIVE_SCOPES: Mutex<Vec<(runtime::Id, usize)>> = Mutex::new(Vec::new());

struct LiveScope(Option<runtime::Id>);

impl LiveScope {
    fn enter() -> LiveScope {
        let Ok(rt) = runtime::Handle::try_current() else {
            return LiveScope(None);
        };
        let id = rt.id();
        let mut live = LIVE_SCOPES.lock().unwrap_or_else(PoisonError::into_inner);
        match live.iter_mut().find(|(rt, _)| *rt == id) {
            Some((_, n)) => *n += 1,
            None => live.push((id, 1)),
        }
        LiveScope(Some(id))
    }

    /// Whether a scope is being run on the current runtime.
    fn any_here() -> bool {
        let Ok(rt) = runtime::Handle::try_current() else {
            return false;
        };
        let id = rt.id();
        let live = LIVE_SCOPES.lock().unwrap_or_else(PoisonError::into_inner);
        live.iter().any(|(rt, _)| *rt == id)
    }
}

impl Drop for LiveScope {
    fn drop(&mut self) {
        let Some(id) = self.0 else { return };
        let mut live = LIVE_SCOPES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = live.iter().position(|(rt, _)| *rt == id) {
            live[i].1 -= 1;
            if live[i].1 == 0 {
                live.swap_remove(i);
            }
        }
    }
}

/// `tokio::spawn` carrying the current handle: guards in the task use the handle of the
/// [`Redguard::scope`] that spawned it (a scope does not reach into a plain `tokio::spawn`),
/// or the installed one outside any scope.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use std::time::Duration;
///
/// let token = redguard::Redguard::memory()
///     .scope(async {
///         redguard::spawn(async { redguard::tokens().issue("signup", Duration::from_secs(60)).await })
///             .await
///             .expect("the task panicked")
///     })
///     .await?;
/// assert_eq!(token.len(), 32);
/// # Ok(()) }
/// ```
pub fn spawn<F>(future: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match SCOPED.try_with(Redguard::clone) {
        Ok(handle) => tokio::spawn(handle.scope(future)),
        Err(_) => tokio::spawn(future),
    }
}

impl Redguard {
    /// Starts building a handle on Redis at `url`: `redis://[user:password@]host[:port][/db]`
    /// or `rediss://…` for TLS.
    pub fn redis(url: impl Into<String>) -> Builder {
        Builder {
            backend: Backend::Redis(RedisTarget {
                urls: vec![url.into()],
                cluster: false,
                #[cfg(feature = "tls")]
                tls_root_ca: None,
                existing: None,
                #[cfg(feature = "sentinel")]
                sentinel: None,
                #[cfg(feature = "test-util")]
                test: Default::default(),
            }),
            settings: Settings::default(),
            misuse: None,
        }
    }

    /// Starts building a handle on a Redis Cluster, given some of its nodes' URLs (the rest
    /// are discovered). Each guard operation stays one script on one node: all keys it
    /// touches share a hash tag.
    ///
    /// ```no_run
    /// # async fn run() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::redis_cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    pub fn redis_cluster<I, S>(nodes: I) -> Builder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let urls: Vec<String> = nodes.into_iter().map(Into::into).collect();
        Builder {
            misuse: urls
                .is_empty()
                .then_some("a Redis Cluster needs at least one node URL"),
            backend: Backend::Redis(RedisTarget {
                urls,
                cluster: true,
                #[cfg(feature = "tls")]
                tls_root_ca: None,
                existing: None,
                #[cfg(feature = "sentinel")]
                sentinel: None,
                #[cfg(feature = "test-util")]
                test: Default::default(),
            }),
            settings: Settings::default(),
        }
    }

    /// Starts building a handle on the master that Redis Sentinel names `master` (Sentinel's
    /// customary default is `mymaster`), given some sentinels as `host:port`. The handle asks
    /// them for the master at connect, and follows it through failovers by itself: see
    /// [the guide](crate::guide::servers#redis-sentinel) for the time a failover takes and
    /// what it may lose.
    ///
    /// Credentials and the database of the data nodes are set apart from the sentinels':
    /// [`node_auth`](Builder::node_auth), [`node_db`](Builder::node_db),
    /// [`sentinel_auth`](Builder::sentinel_auth).
    ///
    /// ```no_run
    /// # async fn run() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::redis_sentinel(["10.0.0.1:26379", "10.0.0.2:26379"], "mymaster")
    ///     .node_auth("app", "secret")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn redis_sentinel<I, S>(sentinels: I, master: impl Into<String>) -> Builder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let sentinels: Vec<String> = sentinels.into_iter().map(Into::into).collect();
        Builder {
            misuse: sentinels
                .is_empty()
                .then_some("Redis Sentinel needs at least one sentinel address"),
            backend: Backend::Redis(RedisTarget {
                urls: Vec::new(),
                cluster: false,
                #[cfg(feature = "tls")]
                tls_root_ca: None,
                existing: None,
                sentinel: Some(Box::new(SentinelTarget::new(sentinels, master.into()))),
                #[cfg(feature = "test-util")]
                test: Default::default(),
            }),
            settings: Settings::default(),
        }
    }

    /// Starts building a handle on a connection the application already has. `client` is
    /// the one it was opened from: lock waiters get release notifications over a pub/sub
    /// connection of their own, opened from it on the first wait.
    ///
    /// Every call is still bounded by the handle's [`timeout`](Builder::timeout); the
    /// manager's own settings (reconnection, its response timeout) apply beneath.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379/0")?;
    /// let manager = client.get_connection_manager().await?;
    /// let rg = redguard::Redguard::redis_connection(client, manager).prefix("shop").connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn redis_connection(
        client: redis::Client,
        connection: redis::aio::ConnectionManager,
    ) -> Builder {
        Redguard::existing(client, Conn::Single(connection), false)
    }

    /// [`Redguard::redis_connection`] for a Cluster connection; `client` is any one node's
    /// (release notifications use classic pub/sub, which reaches every node).
    #[cfg(feature = "cluster")]
    pub fn redis_cluster_connection(
        client: redis::Client,
        connection: redis::cluster_async::ClusterConnection,
    ) -> Builder {
        Redguard::existing(client, Conn::Cluster(connection), true)
    }

    fn existing(client: redis::Client, conn: Conn, cluster: bool) -> Builder {
        Builder {
            backend: Backend::Redis(RedisTarget {
                urls: Vec::new(),
                cluster,
                #[cfg(feature = "tls")]
                tls_root_ca: None,
                existing: Some(Box::new(Existing { client, conn })),
                #[cfg(feature = "sentinel")]
                sentinel: None,
                #[cfg(feature = "test-util")]
                test: Default::default(),
            }),
            settings: Settings::default(),
            misuse: None,
        }
    }

    /// A handle on a fresh in-process store with default settings. Safe for one instance only.
    ///
    /// ```
    /// let rg = redguard::Redguard::memory();
    /// assert_eq!(rg.prefix(), "redguard");
    /// ```
    pub fn memory() -> Redguard {
        Redguard::from_store(MemoryStore::new())
    }

    /// Starts building a handle on an in-process store (to set a clock, a prefix, …).
    pub fn memory_builder() -> Builder {
        Builder {
            backend: Backend::Memory(Arc::new(SystemClock)),
            settings: Settings::default(),
            misuse: None,
        }
    }

    /// A handle on any [`Store`] with default settings.
    pub fn from_store(store: impl Store) -> Redguard {
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

    /// Builds a handle from the environment: `REDGUARD_REDIS_CLUSTER_URLS` (comma-separated)
    /// selects a Cluster, else `REDGUARD_REDIS_URL` or `REDIS_URL` one Redis;
    /// `REDGUARD_TLS_CA` names a PEM file of roots to trust, `REDGUARD_PREFIX` the prefix.
    /// With no Redis named, the in-process store is used (logged once at info level).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// // With no Redis variable set, this is the in-memory store.
    /// # unsafe { std::env::remove_var("REDGUARD_REDIS_URL"); std::env::remove_var("REDIS_URL"); }
    /// let rg = redguard::Redguard::from_env().await?;
    /// assert_eq!(rg.store().kind(), redguard::store::StoreKind::Memory);
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

    /// Makes this handle the process-wide default used by the attribute macros and the free
    /// functions (`redguard::tokens`, …). Once per process; a second call is an error
    /// (use [`Redguard::scope`] to run code against another handle).
    pub fn install(self) -> Result<Redguard> {
        let mut fresh = false;
        let installed = INSTALLED.get_or_init(|| {
            fresh = true;
            self.clone()
        });
        if fresh {
            Ok(installed.clone())
        } else {
            Err(Error::Config(
                "a redguard handle is already installed; install once at startup, or use \
                 `Redguard::scope` to run a future against another handle"
                    .to_owned(),
            ))
        }
    }

    /// Runs `future` with this handle as the default, overriding the installed one for that
    /// future only. Made for tests: each can use its own in-memory store and clock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// use redguard::Redguard;
    ///
    /// let token = Redguard::memory()
    ///     .scope(async { redguard::tokens().issue("signup", Duration::from_secs(60)).await })
    ///     .await?;
    /// assert_eq!(token.len(), 32);
    /// # Ok(()) }
    /// ```
    ///
    /// The scope covers `future` only, not tasks it starts with `tokio::spawn`: start those
    /// with [`redguard::spawn`](crate::spawn).
    pub fn scope<F: Future>(&self, future: F) -> impl Future<Output = F::Output> + use<F> {
        let future = SCOPED.scope(self.clone(), future);
        async move {
            // Entered when first polled: only then is the runtime known.
            let _live = LiveScope::enter();
            future.await
        }
    }

    /// The handle a guard should use right now: the scoped one, else the installed one.
    ///
    /// Neither is [`Error::NotInstalled`], or [`Error::NotInScope`] while a scope runs
    /// elsewhere (the usual cause: a task spawned from inside a scope).
    pub fn current() -> Result<Redguard> {
        SCOPED
            .try_with(Redguard::clone)
            .ok()
            .or_else(|| INSTALLED.get().cloned())
            .ok_or_else(|| {
                if LiveScope::any_here() {
                    Error::NotInScope
                } else {
                    Error::NotInstalled
                }
            })
    }

    /// The store behind this handle.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// In-process state of this handle's guards (local queues, the local rate tier).
    pub(crate) fn state(&self) -> &State {
        &self.inner.state
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

/// Builds a [`Redguard`]; start from [`Redguard::redis`] or [`Redguard::memory_builder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `.connect().await`"]
pub struct Builder {
    backend: Backend,
    settings: Settings,
    misuse: Option<&'static str>,
}

#[derive(Debug)]
enum Backend {
    Redis(RedisTarget),
    Memory(Arc<dyn Clock>),
}

impl Builder {
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
    /// [`GuardKind::Token`] shares the idempotency setting.
    pub fn fail_mode(mut self, guard: GuardKind, mode: FailMode) -> Self {
        match guard {
            GuardKind::Idempotency | GuardKind::Token => self.settings.idempotency = mode,
            GuardKind::Lock => self.settings.lock = mode,
            GuardKind::RateLimit => self.settings.rate_limit = mode,
        }
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
        match &mut self.backend {
            Backend::Redis(target) if target.existing.is_some() => {
                self.misuse = Some(
                    "`tls_root_ca` applies to connections redguard opens; configure TLS on the \
                     client of an existing connection",
                );
            }
            Backend::Redis(target) => target.tls_root_ca = Some(pem.into()),
            Backend::Memory(_) => {
                self.misuse = Some("`tls_root_ca` applies to Redis stores only");
            }
        }
        self
    }

    /// The sentinels' ACL user and password (a `username` of `""`: the `default` user of a
    /// `requirepass` sentinel). Sentinel handles only.
    ///
    /// ```no_run
    /// # async fn run() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::redis_sentinel(["10.0.0.1:26379"], "mymaster")
    ///     .sentinel_auth("watcher", "s3")
    ///     .node_auth("app", "secret")
    ///     .node_db(2)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn sentinel_auth(self, username: impl Into<String>, password: impl Into<String>) -> Self {
        let auth = SentinelAuth {
            username: username.into(),
            password: password.into(),
        };
        self.with_sentinel(
            "`sentinel_auth` applies to Redis Sentinel handles only",
            |target| target.sentinel_auth = Some(auth),
        )
    }

    /// The data nodes' ACL user and password (`""` as `username`: the `default` user).
    /// Sentinel handles only: a single node or Cluster takes them in its URLs.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// // On another builder, a configuration error.
    /// let wrong = redguard::Redguard::redis("redis://127.0.0.1:1").node_auth("app", "secret");
    /// assert!(matches!(wrong.connect().await, Err(redguard::Error::Config(_))));
    /// # }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn node_auth(self, username: impl Into<String>, password: impl Into<String>) -> Self {
        let auth = SentinelAuth {
            username: username.into(),
            password: password.into(),
        };
        self.with_sentinel(
            "`node_auth` applies to Redis Sentinel handles only",
            |target| target.node_auth = Some(auth),
        )
    }

    /// The database number on the data nodes (default 0). Sentinel handles only.
    ///
    /// ```no_run
    /// # async fn run() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::redis_sentinel(["10.0.0.1:26379"], "mymaster")
    ///     .node_db(3)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn node_db(self, db: i64) -> Self {
        self.with_sentinel(
            "`node_db` applies to Redis Sentinel handles only",
            |target| target.node_db = db,
        )
    }

    /// TLS to the sentinels and the data nodes, trusting [`tls_root_ca`](Builder::tls_root_ca)
    /// when set, else the system's roots. Sentinel handles only.
    ///
    /// ```no_run
    /// # async fn run() -> redguard::Result<()> {
    /// let ca = std::fs::read("/etc/redis/tls/ca.crt").expect("read the CA");
    /// let rg = redguard::Redguard::redis_sentinel(["sentinel.internal:26379"], "mymaster")
    ///     .sentinel_tls()
    ///     .tls_root_ca(ca)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(all(feature = "sentinel", feature = "tls"))]
    pub fn sentinel_tls(self) -> Self {
        self.with_sentinel(
            "`sentinel_tls` applies to Redis Sentinel handles only",
            |target| target.tls = true,
        )
    }

    #[cfg(feature = "sentinel")]
    fn with_sentinel(
        mut self,
        misuse: &'static str,
        set: impl FnOnce(&mut SentinelTarget),
    ) -> Self {
        match &mut self.backend {
            Backend::Redis(RedisTarget {
                sentinel: Some(target),
                ..
            }) => set(target),
            _ => self.misuse = Some(misuse),
        }
        self
    }

    /// The clock of an in-memory store (default: the system clock). Redis uses its own clock,
    /// so setting one on a Redis builder is a configuration error — except with the
    /// `test-util` feature, where it pins the scripts' clock (see `script_transform`).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        match &mut self.backend {
            Backend::Memory(current) => *current = Arc::new(clock),
            #[cfg(feature = "test-util")]
            Backend::Redis(target) => target.test.clock = Some(Arc::new(clock)),
            // Reported by `connect`, where errors are returned.
            #[cfg(not(feature = "test-util"))]
            Backend::Redis(_) => {
                self.misuse = Some(
                    "a Redis store takes time from Redis; `clock` applies to in-memory stores only",
                )
            }
        }
        self
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
        match &mut self.backend {
            Backend::Redis(target) => target.test.transform = Some(Arc::new(transform)),
            Backend::Memory(_) => {
                self.misuse = Some("`script_transform` applies to Redis stores only");
            }
        }
        self
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
        let store: Arc<dyn Store> = match self.backend {
            Backend::Redis(target) => Arc::new(
                RedisStore::connect(
                    target,
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
