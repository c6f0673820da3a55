//! Where a handle's state lives, as a [`Builder`] collects it: the in-process store, or Redis
//! reached as one node, a Cluster, through Sentinel or over the application's own
//! connection. The builder's type says which settings apply: the sentinel-only ones exist
//! on a [`Builder<Sentinel>`] only.

use std::sync::Arc;

use super::Redguard;
use super::builder::Builder;
use crate::clock::{Clock, TokioClock};
use crate::store::{Conn, Endpoint, Existing};
#[cfg(feature = "sentinel")]
use crate::store::{SentinelAuth, SentinelTarget};

/// The target of a [`Builder`] for any store: memory, or Redis in any topology. A
/// [`Builder<Sentinel>`] converts into one (`.into()`), for code that picks the topology at
/// run time.
#[derive(Debug)]
pub struct Target(pub(super) Backend);

#[derive(Debug)]
pub(super) enum Backend {
    Memory(Arc<dyn Clock>),
    Redis(Endpoint),
}

/// The target of a [`Builder`] on the master Redis Sentinel names: the settings of the
/// sentinels and of the data nodes they name apply to it only.
#[cfg(feature = "sentinel")]
#[derive(Debug)]
pub struct Sentinel(SentinelTarget);

pub(super) mod sealed {
    use std::sync::Arc;

    use crate::clock::Clock;

    /// What a builder needs from its target, whichever it is.
    pub trait Topology: Send + std::fmt::Debug {
        /// Where the target is, as any builder's.
        fn into_target(self) -> super::Target;
        /// The in-memory store's clock, for a memory target.
        fn memory_clock(&mut self) -> Option<&mut Arc<dyn Clock>>;
        /// Whether redguard opens the connection to Redis (TLS settings apply).
        fn opens(&self) -> bool;
    }
}

/// A [`Builder`]'s target: [`Target`] (any store) or [`Sentinel`].
pub trait Topology: sealed::Topology {}

impl Topology for Target {}

impl sealed::Topology for Target {
    fn into_target(self) -> Target {
        self
    }

    fn memory_clock(&mut self) -> Option<&mut Arc<dyn Clock>> {
        match &mut self.0 {
            Backend::Memory(clock) => Some(clock),
            Backend::Redis(_) => None,
        }
    }

    fn opens(&self) -> bool {
        matches!(&self.0, Backend::Redis(endpoint) if !matches!(endpoint, Endpoint::Existing(_)))
    }
}

#[cfg(feature = "sentinel")]
impl Topology for Sentinel {}

#[cfg(feature = "sentinel")]
impl sealed::Topology for Sentinel {
    fn into_target(self) -> Target {
        Target(Backend::Redis(Endpoint::Sentinel(Box::new(self.0))))
    }

    fn memory_clock(&mut self) -> Option<&mut Arc<dyn Clock>> {
        None
    }

    fn opens(&self) -> bool {
        true
    }
}

#[cfg(feature = "sentinel")]
impl From<Builder<Sentinel>> for Builder<Target> {
    fn from(builder: Builder<Sentinel>) -> Self {
        builder.map(sealed::Topology::into_target)
    }
}

fn redis(endpoint: Endpoint) -> Target {
    Target(Backend::Redis(endpoint))
}

impl Redguard {
    /// Starts building a handle on Redis at `url`: `redis://[user:password@]host[:port][/db]`
    /// or `rediss://…` for TLS.
    pub fn redis(url: impl Into<String>) -> Builder {
        Builder::new(redis(Endpoint::Single(url.into())))
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
        let misuse = urls
            .is_empty()
            .then_some("a Redis Cluster needs at least one node URL");
        Builder::new(redis(Endpoint::Cluster(urls))).misused(misuse)
    }

    /// Starts building a handle on the master that Redis Sentinel names `master` (Sentinel's
    /// customary default is `mymaster`), given some sentinels as `host:port` or
    /// `redis://host:port/` (`rediss://` for TLS, as [`sentinel_tls`](Builder::sentinel_tls)).
    /// The handle asks them for the master at connect, and follows it through failovers by
    /// itself: see [the guide](crate::guide::servers#redis-sentinel) for the time a failover
    /// takes and what it may lose.
    ///
    /// Credentials and the database of the data nodes are set apart from the sentinels', on
    /// this builder only: [`node_auth`](Builder::node_auth), [`node_db`](Builder::node_db),
    /// [`sentinel_auth`](Builder::sentinel_auth).
    ///
    /// ```no_run
    /// # async fn run() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::redis_sentinel(["10.0.0.1:26379", "redis://10.0.0.2:26379/"], "mymaster")
    ///     .node_auth("app", "secret")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn redis_sentinel<I, S>(sentinels: I, master: impl Into<String>) -> Builder<Sentinel>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let sentinels: Vec<String> = sentinels.into_iter().map(Into::into).collect();
        let misuse = sentinels
            .is_empty()
            .then_some("Redis Sentinel needs at least one sentinel address");
        Builder::new(Sentinel(SentinelTarget::new(sentinels, master.into()))).misused(misuse)
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
        let conn = Conn::Single(connection);
        Builder::new(redis(Endpoint::Existing(Box::new(Existing {
            client,
            conn,
        }))))
    }

    /// [`Redguard::redis_connection`] for a Cluster connection; `client` is any one node's
    /// (release notifications use classic pub/sub, which reaches every node).
    #[cfg(feature = "cluster")]
    pub fn redis_cluster_connection(
        client: redis::Client,
        connection: redis::cluster_async::ClusterConnection,
    ) -> Builder {
        let conn = Conn::Cluster(connection);
        Builder::new(redis(Endpoint::Existing(Box::new(Existing {
            client,
            conn,
        }))))
    }

    /// Starts building a handle on an in-process store (to set a clock, a prefix, …).
    pub fn memory_builder() -> Builder {
        Builder::new(Target(Backend::Memory(Arc::new(TokioClock::new()))))
    }
}

#[cfg(feature = "sentinel")]
impl Builder<Sentinel> {
    /// The sentinels' ACL user and password (a `username` of `""`: the `default` user of a
    /// `requirepass` sentinel).
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
    ///
    /// Only a Sentinel builder has it: a single node or Cluster takes credentials in its
    /// URLs.
    ///
    /// ```compile_fail
    /// let wrong = redguard::Redguard::redis("redis://127.0.0.1:6379").sentinel_auth("w", "s3");
    /// ```
    pub fn sentinel_auth(
        mut self,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.topology.0.sentinel_auth = Some(auth(username, password));
        self
    }

    /// The data nodes' ACL user and password (`""` as `username`: the `default` user).
    pub fn node_auth(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.topology.0.node_auth = Some(auth(username, password));
        self
    }

    /// The database number on the data nodes (default 0).
    ///
    /// ```no_run
    /// # async fn run() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::redis_sentinel(["10.0.0.1:26379"], "mymaster")
    ///     .node_db(3)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn node_db(mut self, db: i64) -> Self {
        self.topology.0.node_db = db;
        self
    }

    /// TLS to the sentinels and the data nodes, trusting [`tls_root_ca`](Builder::tls_root_ca)
    /// when set, else the system's roots. Sentinel addresses given as `rediss://` ask for the
    /// same; one given as `redis://` is then a configuration error.
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
    #[cfg(feature = "tls")]
    pub fn sentinel_tls(mut self) -> Self {
        self.topology.0.tls = true;
        self
    }
}

#[cfg(feature = "sentinel")]
fn auth(username: impl Into<String>, password: impl Into<String>) -> SentinelAuth {
    SentinelAuth {
        username: username.into(),
        password: password.into(),
    }
}
