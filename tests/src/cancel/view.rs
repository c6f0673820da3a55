//! Direct reads of the Redis under test, and its pauses, on connections of their own (not the
//! handle's, so what they see does not depend on the runtime's code).

use std::fmt;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::RedisServer;

/// Bound on each call the harness makes itself.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Keys with no TTL, in one round trip (the keyspace of a test server is small).
const KEYS_WITHOUT_TTL: &str = "local forever = {}
for _, key in ipairs(redis.call('KEYS', '*')) do
  if redis.call('PTTL', key) == -1 then
    table.insert(forever, key)
  end
end
return forever";

/// Reads and pauses the test server.
#[derive(Clone)]
pub struct View {
    reads: MultiplexedConnection,
    /// A paused server keeps this connection's next command waiting too: pauses only.
    pauses: MultiplexedConnection,
}

impl fmt::Debug for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("View").finish_non_exhaustive()
    }
}

impl View {
    pub(super) async fn connect(server: &RedisServer) -> View {
        let client = redis::Client::open(server.url()).expect("test server URL");
        let connect = || async {
            bounded(client.get_multiplexed_async_connection())
                .await
                .expect("connect to the test redis-server")
        };
        View {
            reads: connect().await,
            pauses: connect().await,
        }
    }

    /// `HGET key field`.
    pub async fn field(&self, key: &str, field: &str) -> Option<String> {
        let mut conn = self.reads.clone();
        bounded(
            redis::cmd("HGET")
                .arg(key)
                .arg(field)
                .query_async(&mut conn),
        )
        .await
        .expect("HGET")
    }

    /// Every key without a TTL.
    pub async fn keys_without_ttl(&self) -> Vec<String> {
        let mut conn = self.reads.clone();
        bounded(
            redis::cmd("EVAL")
                .arg(KEYS_WITHOUT_TTL)
                .arg(0)
                .query_async(&mut conn),
        )
        .await
        .expect("scan for keys without a TTL")
    }

    /// `CLIENT PAUSE <pause> ALL`: from now on Redis runs no command of any client (they
    /// wait, queued) until `pause` has passed.
    pub(super) async fn pause(&self, pause: Duration) {
        let mut conn = self.pauses.clone();
        let ms = u64::try_from(pause.as_millis()).expect("pause in ms");
        let () = bounded(
            redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(ms)
                .arg("ALL")
                .query_async(&mut conn),
        )
        .await
        .expect("CLIENT PAUSE");
    }
}

async fn bounded<T>(call: impl Future<Output = redis::RedisResult<T>>) -> redis::RedisResult<T> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(reply) => reply,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the test redis-server did not answer the harness in 5 s",
        ))),
    }
}
