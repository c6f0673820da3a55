//! [`Store`] on Redis: one multiplexed, self-reconnecting connection and one Lua script per
//! guard operation.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use once_cell::sync::Lazy;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, RedisError, Script};

use super::{Store, StoreKind, TOKEN_TOMBSTONE, TokenOutcome};
use crate::error::{BackendError, Error, Result};
use crate::key::Key;

/// The scripts, compiled into the binary and loaded with `SCRIPT LOAD` at connect.
///
/// Invocations go through `EVALSHA`; after a Redis restart or `SCRIPT FLUSH` the first call
/// gets `NOSCRIPT`, and the client loads the script and retries it transparently.
struct Scripts {
    token_consume: Script,
}

static SCRIPTS: Lazy<Scripts> = Lazy::new(|| Scripts {
    token_consume: Script::new(include_str!("scripts/token_consume.lua")),
});

impl Scripts {
    fn all(&self) -> [&Script; 1] {
        [&self.token_consume]
    }
}

/// The Redis-backed [`Store`]. Built by [`Redguard::redis`](crate::Redguard::redis).
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    timeout: Duration,
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
    /// Connects to `url` (`redis://` or `rediss://`, with optional `user:password@`), bounding
    /// every later call by `timeout`.
    pub(crate) async fn connect(
        url: &str,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Self> {
        // The client's own message can echo the URL; keep credentials out of logs.
        let client = redis::Client::open(url).map_err(|err| {
            Error::Config(format!(
                "invalid Redis URL ({:?}): expected redis://[user:password@]host[:port][/db] \
                 or rediss://...",
                err.kind()
            ))
        })?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(connect_timeout))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_millis(500));
        let conn = bounded("connect", connect_timeout, async {
            ConnectionManager::new_with_config(client, config).await
        })
        .await?;
        let store = RedisStore { conn, timeout };
        store.load_scripts(connect_timeout).await?;
        Ok(store)
    }

    async fn load_scripts(&self, timeout: Duration) -> Result<()> {
        for script in SCRIPTS.all() {
            let mut conn = self.conn.clone();
            bounded("script_load", timeout, async move {
                script.prepare_invoke().load_async(&mut conn).await
            })
            .await?;
        }
        Ok(())
    }

    /// Runs `script` with one key and `args`, mapping errors and the timeout.
    async fn eval<T: FromRedisValue>(
        &self,
        op: &'static str,
        script: &Script,
        key: &Key,
        args: &[&str],
    ) -> Result<T> {
        let mut invocation = script.prepare_invoke();
        invocation.key(key.as_str());
        for arg in args {
            invocation.arg(*arg);
        }
        let mut conn = self.conn.clone();
        bounded(op, self.timeout, async move {
            invocation.invoke_async(&mut conn).await
        })
        .await
        .map_err(|err| corrupt_or(err, key))
    }
}

/// A `WRONGTYPE` reply means someone else's data sits at our key: say which key.
fn corrupt_or(err: Error, key: &Key) -> Error {
    match err {
        Error::Backend(BackendError::Redis { source, .. })
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

/// Bounds a Redis call by `after`. The connection has its own response timeout; this one also
/// covers waiting for a reconnect and the `NOSCRIPT` reload.
async fn bounded<T>(
    op: &'static str,
    after: Duration,
    call: impl Future<Output = Result<T, RedisError>>,
) -> Result<T> {
    match tokio::time::timeout(after, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) if source.is_timeout() => Err(BackendError::Timeout { op, after }.into()),
        Ok(Err(source)) => Err(BackendError::Redis { op, source }.into()),
        Err(_) => Err(BackendError::Timeout { op, after }.into()),
    }
}

#[async_trait]
impl Store for RedisStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Redis
    }

    async fn time(&self) -> Result<Duration> {
        let mut conn = self.conn.clone();
        let (secs, micros): (u64, u64) = bounded("time", self.timeout, async move {
            redis::cmd("TIME").query_async(&mut conn).await
        })
        .await?;
        Ok(Duration::from_secs(secs) + Duration::from_micros(micros))
    }

    async fn token_issue(&self, key: &Key, scene: &str, ttl: Duration) -> Result<()> {
        debug_assert_ne!(scene, TOKEN_TOMBSTONE);
        let mut conn = self.conn.clone();
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let key_str = key.as_str();
        bounded("token_issue", self.timeout, async move {
            redis::cmd("SET")
                .arg(key_str)
                .arg(scene)
                .arg("PX")
                .arg(ttl_ms)
                .arg("NX")
                .query_async::<Option<String>>(&mut conn)
                .await
        })
        .await
        .map_err(|err| corrupt_or(err, key))?
        .ok_or_else(|| Error::Corrupt {
            key: key.to_string(),
            detail: "a freshly generated token already exists".to_owned(),
        })?;
        Ok(())
    }

    async fn token_consume(&self, key: &Key, scene: &str) -> Result<TokenOutcome> {
        let code: i64 = self
            .eval("token_consume", &SCRIPTS.token_consume, key, &[scene])
            .await?;
        match code {
            0 => Ok(TokenOutcome::Consumed),
            1 => Ok(TokenOutcome::AlreadyUsed),
            2 => Ok(TokenOutcome::Unknown),
            3 => Ok(TokenOutcome::Mismatch),
            other => Err(Error::Corrupt {
                key: key.to_string(),
                detail: format!("token script returned {other}"),
            }),
        }
    }
}
