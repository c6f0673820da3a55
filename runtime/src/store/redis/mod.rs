//! [`Store`] on Redis: one multiplexed, self-reconnecting connection and one Lua script per
//! guard operation. Each guard's operations and scripts live in their own file here.

mod admin;
mod breaker;
mod conn;
mod gcra;
mod idem;
mod idem_batch;
mod lock;
mod lua;
mod rate;
#[cfg(feature = "sentinel")]
mod sentinel;
mod server;
#[cfg(feature = "test-util")]
pub(crate) mod test_util;
mod token;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "cluster")]
use redis::cluster::ClusterClientBuilder;
use redis::{FromRedisValue, RedisError, ServerErrorKind, ToRedisArgs};

use super::{EvictionCheck, Health, Store, StoreKind};
use crate::error::{BackendError, Error, Result, StoreFailure};
use crate::key::Key;
use crate::values::Replicas;

/// Every script, loaded with `SCRIPT LOAD` at connect.
///
/// Invocations go through `EVALSHA`; after a Redis restart or `SCRIPT FLUSH` the first call
/// gets `NOSCRIPT`, and the client loads the script and retries it transparently.
fn all_scripts() -> impl Iterator<Item = &'static Lua> {
    token::scripts()
        .into_iter()
        .chain(idem::scripts())
        .chain(idem_batch::scripts())
        .chain(lock::scripts())
        .chain(rate::scripts())
        .chain(gcra::scripts())
        .chain(admin::scripts())
}

pub(crate) use self::conn::{Conn, Endpoint, Existing, Options, RedisTarget};
pub(crate) use self::lock::BusSource;
use self::lua::Lua;
#[cfg(feature = "sentinel")]
pub(crate) use self::sentinel::{Auth, SentinelTarget};

/// The Redis-backed [`Store`]: a single node ([`Redguard::redis`](crate::Redguard::redis)),
/// a Cluster (`Redguard::redis_cluster`, feature `cluster`) or the master Redis Sentinel names
/// (`Redguard::redis_sentinel`, feature `sentinel`). Every key one operation touches shares a hash
/// tag, so each operation is one script on one node either way.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    /// Opens another connection like `conn`, for [`Store::twin`]; `None` for a twin itself
    /// and on a Cluster.
    opener: Option<Arc<Opener>>,
    timeout: Duration,
    /// Lock release notifications; its connection opens on the first wait.
    bus: Arc<lock::ReleaseBus>,
    /// Concurrent GCRA checks waiting to share a script call.
    gcra: Arc<gcra::Coalescer>,
    /// Fails calls at once while the connection is known down (`breaker.rs`); `None` on a
    /// twin, whose calls wait behind `WAIT`s by design: a timeout there says nothing of the
    /// connection.
    breaker: Option<Arc<breaker::Breaker>>,
    /// Whether the user may run `INFO` (found at connect): [`Store::health`] sends it only
    /// then, since every refused command is an `ACL LOG` entry.
    info: bool,
    #[cfg(feature = "test-util")]
    test: test_util::TestHooks,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The connection's Debug would print the URL, password included.
        f.debug_struct("RedisStore")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to `target`, bounding every later call by `timeout`. Lock release
    /// notifications are subscribed to for the keys under `prefix`.
    pub(crate) async fn connect(
        target: RedisTarget,
        prefix: &str,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Self> {
        let RedisTarget { endpoint, options } = target;
        let eviction = options.eviction;
        #[cfg(feature = "tls")]
        let tls = options.tls_root_ca;
        #[cfg(not(feature = "tls"))]
        let tls = None;
        // Without `tls` and `test-util` there are no options.
        #[cfg(not(any(feature = "tls", feature = "test-util")))]
        let Options { .. } = options;
        let (conn, opener, source) = match endpoint {
            Endpoint::Existing(existing) => {
                let opener = matches!(existing.conn, Conn::Single(_)).then(|| {
                    Arc::new(Opener {
                        client: existing.client.clone(),
                        connect_timeout,
                    })
                });
                (
                    existing.conn,
                    opener,
                    BusSource::Fixed(Box::new(existing.client)),
                )
            }
            #[cfg(feature = "sentinel")]
            Endpoint::Sentinel(sentinel) => {
                let conn = sentinel::SentinelConn::connect(
                    *sentinel,
                    #[cfg(feature = "tls")]
                    tls,
                    connect_timeout,
                )
                .await?;
                // A second Sentinel connection would follow failovers on its own watcher;
                // confirmed writes share this one (the guide's "Replica-safe writes").
                let source = BusSource::Sentinel(conn.clone());
                (Conn::Sentinel(conn), None, source)
            }
            Endpoint::Single(url) => {
                let node = node_client(&url, tls)?;
                let opener = Opener {
                    client: node.clone(),
                    connect_timeout,
                };
                let conn = opener.open().await?;
                (
                    conn,
                    Some(Arc::new(opener)),
                    BusSource::Fixed(Box::new(node)),
                )
            }
            // A Cluster has no twin: a second cluster connection, idle through a failover,
            // kept timing out afterwards in `it::replicas` (its writes then share the
            // handle's).
            #[cfg(feature = "cluster")]
            Endpoint::Cluster(urls) => {
                // Pub/sub goes through one node: classic `PUBLISH` reaches every node.
                let first = urls.first().map(String::as_str).unwrap_or_default();
                let node = node_client(first, tls.clone())?;
                let conn = cluster_conn(&urls, tls, timeout, connect_timeout).await?;
                (conn, None, BusSource::Fixed(Box::new(node)))
            }
        };
        let store = RedisStore {
            conn,
            opener,
            timeout,
            bus: Arc::new(lock::ReleaseBus::new(source, prefix)),
            gcra: Arc::default(),
            breaker: Some(Arc::default()),
            info: true,
            #[cfg(feature = "test-util")]
            test: options.test,
        };
        store.load_scripts(connect_timeout, eviction).await
    }

    /// Refuses an unsupported server, and one that may evict guard keys when `eviction` says
    /// so (`server.rs`), then loads every script.
    async fn load_scripts(
        mut self,
        connect_timeout: Duration,
        eviction: EvictionCheck,
    ) -> Result<Self> {
        self.info = server::check(self.conn.clone(), connect_timeout, eviction).await?;
        for script in all_scripts() {
            let mut conn = self.conn.clone();
            bounded("script_load", connect_timeout, async move {
                script.prepare_invoke().load_async(&mut conn).await
            })
            .await?;
        }
        Ok(self)
    }

    /// A clone of the multiplexed connection (cheap: a handle to the same socket).
    pub(crate) fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// True on a Redis Cluster.
    #[cfg(feature = "cluster")]
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// True on a Redis Cluster: never without the `cluster` feature.
    #[cfg(not(feature = "cluster"))]
    pub(crate) fn is_cluster(&self) -> bool {
        false
    }

    /// The bound on each call.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `script` on `keys` with `args` under the timeout; `WRONGTYPE` becomes
    /// [`Error::Corrupt`] naming the first key.
    pub(crate) async fn eval<T: FromRedisValue>(
        &self,
        op: &'static str,
        script: &Lua,
        keys: &[&Key],
        args: &[&dyn ToRedisArgsDyn],
    ) -> Result<T> {
        let mut cmd = evalsha(script, keys.len(), args.len());
        for key in keys {
            cmd.arg(key.as_str());
        }
        for arg in args {
            arg.write_to(&mut cmd);
        }
        self.run_script(op, script, cmd, keys.first().copied())
            .await
    }

    /// Sends `cmd` (built by [`evalsha`] for `script`) under the timeout, loading the script
    /// and retrying once on `NOSCRIPT` (after a restart or `SCRIPT FLUSH`). `WRONGTYPE`
    /// becomes [`Error::Corrupt`] naming `key`.
    pub(crate) async fn run_script<T: FromRedisValue>(
        &self,
        op: &'static str,
        script: &Lua,
        cmd: redis::Cmd,
        key: Option<&Key>,
    ) -> Result<T> {
        #[cfg(feature = "test-util")]
        let cmd = self.test.rewrite(script, cmd);
        let mut conn = self.conn.clone();
        self.bounded(op, async move {
            match cmd.query_async(&mut conn).await {
                Err(err) if err.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
                    script.load_async(&mut conn).await?;
                    cmd.query_async(&mut conn).await
                }
                reply => reply,
            }
        })
        .await
        .map_err(|err| match key {
            Some(key) => corrupt_or(err, key),
            None => err,
        })
    }
}

/// How to open another connection to a single node like a store's, for its
/// [`Store::twin`].
struct Opener {
    client: redis::Client,
    connect_timeout: Duration,
}

impl Opener {
    async fn open(&self) -> Result<Conn> {
        // No response timeout of the client's own: every call is bounded by `bounded`
        // already, and a second timer per call cost as much as building the command.
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(self.connect_timeout))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_millis(500));
        let client = self.client.clone();
        let address = self.client.get_connection_info().addr().to_string();
        Ok(Conn::Single(
            bounded("connect", self.connect_timeout, async {
                ConnectionManager::new_with_config(client, config).await
            })
            .await
            .map_err(|err| tried_at(err, address))?,
        ))
    }
}

/// A failed connect names the address it tried: the client's message does not, and with
/// several nodes or a misread setting that is what the operator needs. Only `host:port`,
/// never the URL, which may hold a password.
fn tried_at(err: Error, address: String) -> Error {
    match err {
        Error::Backend(BackendError::Failed { op, source }) => BackendError::Failed {
            op,
            source: source.at(address),
        }
        .into(),
        other => other,
    }
}

/// PEM root certificate(s) to trust instead of the system's (`None`: the system's, or no
/// TLS feature).
#[cfg(feature = "tls")]
type Roots = Option<Vec<u8>>;
#[cfg(not(feature = "tls"))]
type Roots = Option<std::convert::Infallible>;

/// The client of one node at `url`.
fn node_client(url: &str, roots: Roots) -> Result<redis::Client> {
    #[cfg(feature = "tls")]
    let node = match roots {
        None => redis::Client::open(url),
        Some(root_cert) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root_cert),
            },
        ),
    };
    #[cfg(not(feature = "tls"))]
    let node = {
        let _ = roots;
        redis::Client::open(url)
    };
    node.map_err(invalid_url)
}

/// A Cluster connection from the seed nodes at `urls`.
#[cfg(feature = "cluster")]
async fn cluster_conn(
    urls: &[String],
    roots: Roots,
    timeout: Duration,
    connect_timeout: Duration,
) -> Result<Conn> {
    let builder = ClusterClientBuilder::new(urls.iter().map(String::as_str))
        .connection_timeout(connect_timeout)
        .response_timeout(timeout)
        // Retries (after MOVED, a refused connection, a failover) must fit inside the
        // per-call timeout, or every call during a failover is cut off before the client
        // gets to refresh its slot map.
        .retries(3)
        .min_retry_wait(10)
        .max_retry_wait(timeout.as_millis().try_into().unwrap_or(u64::MAX) / 4)
        .retry_wait_formula(10, 2);
    #[cfg(feature = "tls")]
    let builder = match roots {
        Some(root_cert) => builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root_cert),
        }),
        None => builder,
    };
    #[cfg(not(feature = "tls"))]
    let _ = roots;
    let client = builder.build().map_err(invalid_url)?;
    let addresses: Vec<String> = urls
        .iter()
        .filter_map(|url| redis::IntoConnectionInfo::into_connection_info(url.as_str()).ok())
        .map(|info| info.addr().to_string())
        .collect();
    Ok(Conn::Cluster(
        bounded("connect", connect_timeout, client.get_async_connection())
            .await
            .map_err(|err| tried_at(err, addresses.join(", ")))?,
    ))
}

// The client's own message can echo the URL; keep credentials out of logs.
fn invalid_url(err: RedisError) -> Error {
    Error::Config(format!(
        "invalid Redis URL ({:?}): expected redis://[user:password@]host[:port][/db] \
         or rediss://...",
        err.kind()
    ))
}

// Replica confirmation: `WAIT` behind a guard's write.
impl RedisStore {
    /// Runs `script` as [`eval`](RedisStore::eval) does and, with `replicas`, `WAIT count
    /// timeout` right behind it in one pipeline: on the same connection, so it confirms this
    /// write (`WAIT` counts replicas that have everything this connection wrote), and on a
    /// Cluster to the node of the first key's slot, which took the write. A `WAIT` sent
    /// separately could go out on a reconnected connection that wrote nothing, and confirm
    /// nothing. When `wrote` says the reply made a write and fewer replicas confirmed it,
    /// [`BackendError::Unconfirmed`]: the write stands on the master, and the guard undoes it.
    pub(crate) async fn eval_confirmed<T: FromRedisValue + Send>(
        &self,
        op: &'static str,
        script: &Lua,
        keys: &[&Key],
        args: &[&dyn ToRedisArgsDyn],
        replicas: Option<Replicas>,
        wrote: impl FnOnce(&T) -> bool + Send,
    ) -> Result<T> {
        let mut cmd = evalsha(script, keys.len(), args.len());
        for key in keys {
            cmd.arg(key.as_str());
        }
        for arg in args {
            arg.write_to(&mut cmd);
        }
        self.run_confirmed(op, script, cmd, keys.first().copied(), replicas, wrote)
            .await
    }

    /// [`eval_confirmed`](RedisStore::eval_confirmed) of a command already built by
    /// [`evalsha`] for `script`, `key` being its first key.
    pub(crate) async fn run_confirmed<T: FromRedisValue + Send>(
        &self,
        op: &'static str,
        script: &Lua,
        cmd: redis::Cmd,
        key: Option<&Key>,
        replicas: Option<Replicas>,
        wrote: impl FnOnce(&T) -> bool + Send,
    ) -> Result<T> {
        let Some(replicas) = replicas else {
            return self.run_script(op, script, cmd, key).await;
        };
        self.check_replicas(replicas)?;
        #[cfg(feature = "test-util")]
        let cmd = self.test.rewrite(script, cmd);
        let mut pipe = redis::pipe();
        pipe.add_command(cmd);
        wait_behind(&mut pipe, replicas);
        let mut conn = self.conn.clone();
        // Not through the breaker: a `WAIT` holds its connection (a Cluster's, which has no
        // twin) by design, so a timeout here says nothing of the connection.
        let (reply, confirmed): (T, u32) = bounded(op, self.timeout, async move {
            match pipe.query_async(&mut conn).await {
                Err(err) if err.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
                    script.load_async(&mut conn).await?;
                    pipe.query_async(&mut conn).await
                }
                reply => reply,
            }
        })
        .await
        .map_err(|err| match key {
            Some(key) => corrupt_or(err, key),
            None => err,
        })?;
        if wrote(&reply) {
            confirmed_by(op, replicas, confirmed)?;
        }
        Ok(reply)
    }

    /// Passes `result` on; when it is [`BackendError::Unconfirmed`], only once `undo` (the
    /// write's compensating call, on this connection, so applied after the write) is
    /// answered, or the call's bound from `started` ran out: a retry sent right after the
    /// refusal then finds the write undone. An undo that fails or runs out of time is left to
    /// the guard's own undo, which the error arms (an idempotency begin), or to the key's TTL
    /// (a token nobody was given).
    pub(crate) async fn undo_unconfirmed<T>(
        &self,
        result: Result<T>,
        started: Instant,
        undo: impl Future<Output = Result<()>>,
    ) -> Result<T> {
        if !matches!(
            result,
            Err(Error::Backend(BackendError::Unconfirmed { .. }))
        ) {
            return result;
        }
        match tokio::time::timeout_at((started + self.timeout).into(), undo).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "could not undo an unconfirmed write");
            }
            Err(_) => tracing::debug!("undoing an unconfirmed write ran out of time"),
        }
        result
    }

    /// `WAIT`'s timeout must leave room in the call's own for the write and the round trip:
    /// at most half of it, or the call would time out first and report an unknown outcome
    /// instead of an unconfirmed write.
    pub(crate) fn check_replicas(&self, replicas: Replicas) -> Result<()> {
        if replicas.timeout() * 2 > self.timeout {
            return Err(Error::Config(format!(
                "replicas timeout {:?} must be at most half the store's call timeout {:?}",
                replicas.timeout(),
                self.timeout
            )));
        }
        Ok(())
    }
}

/// Appends `WAIT count timeout` to `pipe`.
pub(crate) fn wait_behind(pipe: &mut redis::Pipeline, replicas: Replicas) {
    let timeout = u64::try_from(replicas.timeout().as_millis()).unwrap_or(u64::MAX);
    pipe.cmd("WAIT").arg(replicas.count()).arg(timeout);
}

/// [`BackendError::Unconfirmed`] when fewer than asked confirmed.
pub(crate) fn confirmed_by(op: &'static str, replicas: Replicas, confirmed: u32) -> Result<()> {
    if confirmed < replicas.count() {
        return Err(BackendError::Unconfirmed {
            op,
            wanted: replicas.count(),
            confirmed,
            after: replicas.timeout(),
        }
        .into());
    }
    Ok(())
}

/// `EVALSHA <script's sha1> <keys>`, ready for `keys` keys, then `args` arguments. Built
/// directly (not through `Script::prepare_invoke`, which copies every argument into its own
/// buffer and then again into the command), in buffers sized up front: growing them argument
/// by argument cost more than the rest of building the command.
pub(crate) fn evalsha(script: &Lua, keys: usize, args: usize) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(3 + keys + args, 64 + 96 * keys + 24 * args);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    cmd
}

/// Object-safe argument for [`RedisStore::eval`]: scripts take strings and integers.
pub(crate) trait ToRedisArgsDyn: Sync {
    fn write_to(&self, cmd: &mut redis::Cmd);
}

impl<T: ToRedisArgs + Sync> ToRedisArgsDyn for T {
    fn write_to(&self, cmd: &mut redis::Cmd) {
        cmd.arg(self);
    }
}

/// A `WRONGTYPE` reply means someone else's data sits at our key: say which key. A script
/// that finds data it never writes replies `CORRUPT <key> <what>` itself.
pub(crate) fn corrupt_or(err: Error, key: &Key) -> Error {
    match err {
        Error::Backend(BackendError::Failed { source, .. }) if source.code() == Some("CORRUPT") => {
            let detail = source.detail().unwrap_or_default();
            let (at, what) = detail.split_once(' ').unwrap_or((detail, ""));
            Error::Corrupt {
                key: at.to_owned(),
                detail: what.to_owned(),
            }
        }
        Error::Backend(BackendError::Failed { source, .. }) if source.code() == Some("DENIED") => {
            let detail = source.detail().unwrap_or_default();
            let (at, why) = detail.split_once(' ').unwrap_or((detail, ""));
            // Redis 7 appends ` script: <sha>, on @user_script:<line>.` to a script's error.
            let why = why.split_once(" script: ").map_or(why, |(why, _)| why);
            Error::Denied {
                key: at.to_owned(),
                reason: (!why.is_empty()).then(|| why.to_owned()),
            }
        }
        Error::Backend(BackendError::Failed { source, .. })
            if source.code() == Some("WRONGTYPE") =>
        {
            Error::Corrupt {
                key: key.to_string(),
                detail: "a value of another type is stored there".to_owned(),
            }
        }
        other => other,
    }
}

/// Bounds a Redis call by `after`, including waiting for a reconnect and the `NOSCRIPT`
/// reload. On a single node this is the only timeout; a Cluster connection also has its own,
/// which paces its retries.
pub(crate) async fn bounded<T>(
    op: &'static str,
    after: Duration,
    call: impl Future<Output = Result<T, RedisError>>,
) -> Result<T> {
    guarded(None, op, after, call).await
}

impl RedisStore {
    /// [`bounded`] by the store's timeout, through its breaker: a call of the store's own
    /// (every guard operation, `PING`, `TIME`) fails at once while Redis is known down.
    pub(crate) async fn bounded<T>(
        &self,
        op: &'static str,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T> {
        guarded(
            self.breaker
                .as_deref()
                .map(|breaker| (breaker, self.conn.generation())),
            op,
            self.timeout,
            call,
        )
        .await
    }
}

/// [`bounded`], counting the outcome in `breaker` when given (see `breaker.rs`).
async fn guarded<T>(
    breaker: Option<(&breaker::Breaker, Option<u64>)>,
    op: &'static str,
    after: Duration,
    call: impl Future<Output = Result<T, RedisError>>,
) -> Result<T> {
    let pass = match breaker {
        // An undo follows its operation on the connection whatever the breaker says: a
        // paused Redis runs both when it resumes.
        Some((breaker, generation)) if crate::undo::compensating() => {
            Some((breaker.force(), generation))
        }
        Some((breaker, generation)) => Some((breaker.pass(op, generation)?, generation)),
        None => None,
    };
    let call = tracing::Instrument::instrument(call, crate::trace::store_call(op));
    let result = tokio::time::timeout(after, call).await;
    if let Some((pass, generation)) = pass {
        let reached = match &result {
            Ok(Ok(_)) => true,
            Ok(Err(err)) => !breaker::unreached(err),
            Err(_) => false,
        };
        pass.record(reached, generation);
    }
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) if source.is_timeout() => Err(BackendError::Timeout { op, after }.into()),
        Ok(Err(source)) => Err(BackendError::Failed {
            op,
            source: StoreFailure::redis(source),
        }
        .into()),
        Err(_) => Err(BackendError::Timeout { op, after }.into()),
    }
}

#[async_trait]
impl Store for RedisStore {
    fn kind(&self) -> StoreKind {
        match self.conn {
            Conn::Single(_) => StoreKind::Redis,
            #[cfg(feature = "cluster")]
            Conn::Cluster(_) => StoreKind::Cluster,
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(_) => StoreKind::Sentinel,
        }
    }

    /// `PING`, then `INFO` for the version and the eviction setting, when the user may run
    /// it (found at connect): a user without `+info` is still healthy, with neither.
    async fn health(&self) -> Result<Health> {
        let started = Instant::now();
        let mut conn = self.conn();
        let _: () = self
            .bounded("ping", async move {
                redis::cmd("PING").query_async(&mut conn).await
            })
            .await?;
        let round_trip = started.elapsed();
        let found = match self.info {
            true => server::info(self.conn(), self.timeout)
                .await?
                .and_then(|reply| server::read_info(&reply).ok()),
            false => None,
        }
        .unwrap_or_default();
        Ok(Health {
            kind: self.kind(),
            round_trip,
            server: found.server.map(|server| server.to_string()),
            eviction: found.eviction,
        })
    }

    async fn time(&self) -> Result<Duration> {
        #[cfg(feature = "test-util")]
        if let Some(clock) = &self.test.clock {
            return Ok(clock.now());
        }
        let mut conn = self.conn();
        let (secs, micros): (u64, u64) = self
            .bounded("time", async move {
                redis::cmd("TIME").query_async(&mut conn).await
            })
            .await?;
        Ok(Duration::from_secs(secs) + Duration::from_micros(micros))
    }

    /// The same Redis on a connection of its own (scripts are the server's, already loaded;
    /// the release notifications' subscription is shared).
    fn rate_reset_after(&self, key: &Key, since: std::time::Instant) -> bool {
        self.bus.reset_after(key, since)
    }

    fn listen_rate_resets(&self) {
        self.bus.listen();
    }

    async fn twin(&self) -> Result<Option<Arc<dyn Store>>> {
        let Some(opener) = &self.opener else {
            return Ok(None);
        };
        let conn = opener.open().await?;
        Ok(Some(Arc::new(RedisStore {
            conn,
            opener: None,
            gcra: Arc::default(),
            breaker: None,
            ..self.clone()
        })))
    }
}
