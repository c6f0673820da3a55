//! Which servers a store runs on, and whether they may evict its keys: checked once at
//! connect, from `INFO`, so a server the scripts cannot run on is refused with its version
//! named, instead of a guard that fails (and by default fails open) on every call, and a
//! server that may evict guard keys is reported (or refused) before a lock or a record goes
//! missing. Nothing here runs per call.
//!
//! Supported: Redis 6.2 and later, Valkey 7.2 and later (`redguard::guide::servers`). Valkey
//! answers `redis_version:7.2.4` for compatibility and its own version as `valkey_version`.

use std::fmt;
use std::time::Duration;

use redis::Value;

use super::{Conn, bounded};
use crate::error::{BackendError, Error, Result};
use crate::store::{Eviction, EvictionCheck};

/// The oldest Redis the scripts run on: 6.2 added `SET … PXAT` and `ZRANGE … BYSCORE`, which
/// they use; `PEXPIRETIME` (7.0) is replaced where missing (`expiry.lua`).
const OLDEST_REDIS: Version = Version(6, 2, 0);
/// The oldest Valkey (its first release, compatible with Redis 7.2).
const OLDEST_VALKEY: Version = Version(7, 2, 0);

/// A server as `INFO server` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Server {
    Redis(Version),
    Valkey(Version),
}

/// `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Version(pub(crate) u32, pub(crate) u32, pub(crate) u32);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

impl Version {
    fn parse(text: &str) -> Option<Version> {
        let mut parts = text.trim().splitn(3, '.').map(|part| {
            // A pre-release suffix ("8.0.0-rc1") does not change what the server has.
            let digits = part.split(|c: char| !c.is_ascii_digit()).next()?;
            digits.parse().ok()
        });
        Some(Version(
            parts.next()??,
            parts.next().unwrap_or(Some(0))?,
            parts.next().unwrap_or(Some(0))?,
        ))
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Server::Redis(version) => write!(f, "Redis {version}"),
            Server::Valkey(version) => write!(f, "Valkey {version}"),
        }
    }
}

impl Server {
    /// The server an `INFO server` reply names, or `None` when it names none.
    pub(crate) fn from_info(info: &str) -> Option<Server> {
        let field = |name: &str| {
            info.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key == name).then_some(value.trim())
            })
        };
        if let Some(version) = field("valkey_version") {
            return Version::parse(version).map(Server::Valkey);
        }
        field("redis_version")
            .and_then(Version::parse)
            .map(Server::Redis)
    }

    /// `Ok` for a supported server; otherwise the error naming what was found and needed.
    pub(crate) fn check(self) -> Result<()> {
        let (found, oldest, family) = match self {
            Server::Redis(version) => (version, OLDEST_REDIS, "Redis"),
            Server::Valkey(version) => (version, OLDEST_VALKEY, "Valkey"),
        };
        if found >= oldest {
            return Ok(());
        }
        Err(Error::Config(format!(
            "the server is {self}, and redguard needs {family} {}.{} or later (Redis 6.2+ or \
             Valkey 7.2+; see redguard::guide::servers)",
            oldest.0, oldest.1
        )))
    }
}

/// The eviction setting an `INFO` text (its `memory` section) shows, or `None` when it shows
/// none (a proxy's own `INFO`, a section left out).
pub(crate) fn eviction_from_info(info: &str) -> Option<Eviction> {
    let field = |name: &str| {
        info.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key == name).then_some(value.trim())
        })
    };
    Some(Eviction {
        policy: field("maxmemory_policy")?.to_owned(),
        maxmemory: field("maxmemory")?.parse().ok()?,
    })
}

/// What one `INFO` reply says: the servers' versions checked, and the eviction setting of
/// the node most likely to lose guard keys (on a Cluster: the first that may evict any).
#[derive(Debug, Default)]
pub(crate) struct Found {
    pub(crate) server: Option<Server>,
    pub(crate) eviction: Option<Eviction>,
}

/// Reads `reply` (to `INFO`): `Err` naming the first unsupported server, else what it found.
/// A reply that names no server (a proxy answering its own `INFO`) is let through: the
/// scripts loaded next are the test that counts.
pub(crate) fn read_info(reply: &Value) -> Result<Found> {
    let mut found = Found::default();
    for text in info_texts(reply) {
        if let Some(server) = Server::from_info(&text) {
            server.check()?;
            found.server.get_or_insert(server);
        }
        if let Some(eviction) = eviction_from_info(&text)
            && !found
                .eviction
                .as_ref()
                .is_some_and(Eviction::may_evict_guard_keys)
        {
            found.eviction = Some(eviction);
        }
    }
    Ok(found)
}

/// Every `INFO` text in `reply`: one from a node, or one per node (a Cluster
/// connection asks every master and answers a map of address to text).
pub(crate) fn info_texts(reply: &Value) -> Vec<String> {
    match reply {
        Value::BulkString(bytes) => vec![String::from_utf8_lossy(bytes).into_owned()],
        Value::VerbatimString { text, .. } | Value::SimpleString(text) => vec![text.clone()],
        Value::Map(pairs) => pairs.iter().flat_map(|(_, v)| info_texts(v)).collect(),
        Value::Array(items) => items.iter().flat_map(info_texts).collect(),
        _ => Vec::new(),
    }
}

/// `INFO` (its default sections, `server` and `memory` among them) behind `conn`: `None`
/// when the user may not run it (an ACL without `+info`) or it is renamed away.
pub(crate) async fn info(mut conn: Conn, timeout: Duration) -> Result<Option<Value>> {
    match bounded("info", timeout, async move {
        redis::cmd("INFO").query_async::<Value>(&mut conn).await
    })
    .await
    {
        Ok(reply) => Ok(Some(reply)),
        Err(Error::Backend(BackendError::Failed { .. })) => Ok(None),
        Err(other) => Err(other),
    }
}

/// Refuses an unsupported server behind `conn`, and one that may evict guard keys when
/// `eviction` says so; answers whether the user may run `INFO` (so [`health`] asks it again
/// only then). A command the ACL refuses is an `ACL LOG` entry, which operators alert on, so
/// nothing is sent that the user may not run: a script (`EVAL` is granted to any user the
/// guards work for) says first whether `INFO` is granted, where the server can tell (7.0+),
/// and the version. `INFO` then names the server (Valkey as itself) and its eviction
/// setting; without it, the version is the script's and the eviction setting is unknown.
///
/// [`health`]: crate::store::Store::health
pub(crate) async fn check(conn: Conn, timeout: Duration, eviction: EvictionCheck) -> Result<bool> {
    let probe = probe(conn.clone(), timeout).await?;
    let reply = match probe.info {
        true => info(conn, timeout).await?,
        false => None,
    };
    let Some(reply) = reply else {
        probe.check()?;
        return Ok(false);
    };
    let found = read_info(&reply)?;
    if let Some(setting) = found.eviction.filter(Eviction::may_evict_guard_keys) {
        let message = format!(
            "the server may evict guard keys: maxmemory-policy is {} with maxmemory {} bytes, \
             so a lock, a fence counter or an idempotency record can vanish under memory \
             pressure (a second holder, a payment run twice); set maxmemory-policy to \
             noeviction, or give redguard a Redis of its own that has it (see \
             redguard::guide::servers)",
            setting.policy, setting.maxmemory
        );
        match eviction {
            EvictionCheck::Refuse => return Err(Error::Config(message)),
            EvictionCheck::Warn => tracing::warn!(
                policy = %setting.policy,
                maxmemory = setting.maxmemory,
                "{message}"
            ),
        }
    }
    Ok(true)
}

/// What a script sees of the server: [`PROBE`]'s answer.
struct Probe {
    /// `redis.REDIS_VERSION` (7.0+; Valkey's Redis-compatible one), or empty.
    version: String,
    /// The error `GETDEL` without arguments gave: unknown before 6.2.
    getdel: String,
    /// Whether the user may run `INFO`: asked with `redis.acl_check_cmd` (7.0+), which
    /// logs nothing; assumed on 6.2, which cannot tell.
    info: bool,
}

async fn probe(mut conn: Conn, timeout: Duration) -> Result<Probe> {
    let (version, getdel, info): (String, String, i64) = bounded("info", timeout, async move {
        redis::cmd("EVAL")
            .arg(PROBE)
            .arg(0)
            .query_async(&mut conn)
            .await
    })
    .await?;
    Ok(Probe {
        version,
        getdel,
        info: info == 1,
    })
}

impl Probe {
    /// Refuses a server older than the oldest supported, as far as a script can tell.
    fn check(&self) -> Result<()> {
        if let Some(version) = Version::parse(&self.version) {
            return Server::Redis(version).check();
        }
        if self.getdel.contains("Unknown Redis command") {
            return Err(Error::Config(format!(
                "the server is Redis older than 6.2 (it has no GETDEL), and redguard needs \
                 Redis {}.{} or later, or Valkey 7.2 or later (see redguard::guide::servers)",
                OLDEST_REDIS.0, OLDEST_REDIS.1
            )));
        }
        Ok(())
    }
}

/// The version a script sees: `redis.REDIS_VERSION` (7.0+; Valkey's Redis-compatible one),
/// else whether `GETDEL` (new in 6.2) exists: called without arguments it touches no key and
/// needs no grant, failing for its arity where it exists and as unknown where not. Then
/// whether `INFO` is granted, where `redis.acl_check_cmd` (7.0+) can say without a log entry
/// (a renamed `INFO` makes it raise: not granted).
const PROBE: &str = "local info = 1 \
    if redis.acl_check_cmd then \
      local ok, granted = pcall(redis.acl_check_cmd, 'info') \
      if not (ok and granted) then info = 0 end \
    end \
    return { redis.REDIS_VERSION or '', redis.pcall('GETDEL').err or '', info }";

#[cfg(test)]
mod tests {
    use super::*;

    fn info(fields: &str) -> String {
        format!("# Server\r\n{fields}redis_git_sha1:00000000\r\nredis_mode:standalone\r\n")
    }

    #[test]
    fn names_redis_and_valkey() {
        assert_eq!(
            Server::from_info(&info("redis_version:6.2.14\r\n")),
            Some(Server::Redis(Version(6, 2, 14)))
        );
        // Valkey's own version wins over its Redis-compatible one.
        let valkey = info("redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n");
        assert_eq!(
            Server::from_info(&valkey),
            Some(Server::Valkey(Version(8, 1, 8)))
        );
        assert_eq!(
            Server::from_info(&info("redis_version:8.0.0-rc1\r\n")),
            Some(Server::Redis(Version(8, 0, 0)))
        );
        assert_eq!(Server::from_info("# Server\r\nproxy:1\r\n"), None);
    }

    #[test]
    fn refuses_below_the_oldest_supported_naming_both_versions() {
        for ok in ["6.2.0", "6.2.14", "7.0.15", "8.2.3", "10.0.0"] {
            let server = Server::Redis(Version::parse(ok).unwrap());
            assert!(server.check().is_ok(), "{ok}");
        }
        for old in ["6.0.16", "5.0.7", "6.1.9"] {
            let err = Server::Redis(Version::parse(old).unwrap())
                .check()
                .unwrap_err();
            let message = err.to_string();
            assert!(
                message.contains(&format!("Redis {old}")) && message.contains("Redis 6.2 or later"),
                "{message}"
            );
        }
        assert!(Server::Valkey(Version(7, 2, 0)).check().is_ok());
        let err = Server::Valkey(Version(7, 0, 0)).check().unwrap_err();
        assert!(err.to_string().contains("Valkey 7.0.0"), "{err}");
    }

    #[test]
    fn every_node_of_a_cluster_reply_is_checked() {
        let node = |version: &str| {
            Value::BulkString(info(&format!("redis_version:{version}\r\n")).into_bytes())
        };
        let cluster = Value::Map(vec![
            (Value::SimpleString("127.0.0.1:7000".into()), node("7.0.15")),
            (Value::SimpleString("127.0.0.1:7001".into()), node("6.0.9")),
        ]);
        let err = read_info(&cluster).unwrap_err();
        assert!(err.to_string().contains("Redis 6.0.9"), "{err}");
        assert!(read_info(&node("6.2.5")).is_ok());
    }
}
