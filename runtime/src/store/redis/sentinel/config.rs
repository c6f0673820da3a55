//! What a Sentinel handle is told (sentinel addresses, credentials, database, TLS), and the
//! clients it opens from that.

use std::fmt;
use std::sync::Mutex;

use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use crate::error::{Error, Result};

/// Where and how a Sentinel handle connects, as the builder collected it.
#[derive(Debug)]
pub(crate) struct SentinelTarget {
    /// `host:port` of each sentinel.
    pub(crate) sentinels: Vec<String>,
    /// The name the sentinels monitor the master under.
    pub(crate) master: String,
    pub(crate) sentinel_auth: Option<Auth>,
    pub(crate) node_auth: Option<Auth>,
    pub(crate) node_db: i64,
    /// TLS to the sentinels and the data nodes.
    #[cfg(feature = "tls")]
    pub(crate) tls: bool,
}

impl SentinelTarget {
    pub(crate) fn new(sentinels: Vec<String>, master: String) -> SentinelTarget {
        SentinelTarget {
            sentinels,
            master,
            sentinel_auth: None,
            node_auth: None,
            node_db: 0,
            #[cfg(feature = "tls")]
            tls: false,
        }
    }
}

/// An ACL user (empty: the `default` user of `requirepass`) and its password.
#[derive(Clone)]
pub(crate) struct Auth {
    pub(crate) username: String,
    pub(crate) password: String,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// The validated settings, and the clients made from them.
pub(super) struct Nodes {
    /// Each sentinel's client.
    pub(super) sentinels: Vec<redis::Client>,
    /// Each sentinel's connection for questions, kept between them (a handle asks every
    /// second); dropped after a failed or unanswered question.
    pub(super) asked: Vec<Mutex<Option<MultiplexedConnection>>>,
    pub(super) master_name: String,
    node_auth: Option<Auth>,
    node_db: i64,
    #[cfg(feature = "tls")]
    tls: Option<redis::TlsCertificates>,
}

impl Nodes {
    pub(super) fn new(
        target: SentinelTarget,
        #[cfg(feature = "tls")] tls_root_ca: Option<Vec<u8>>,
    ) -> Result<Nodes> {
        if target.sentinels.is_empty() {
            return Err(Error::Config(
                "Redis Sentinel needs at least one sentinel address".to_owned(),
            ));
        }
        if target.master.is_empty()
            || !target
                .master
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(Error::Config(format!(
                "invalid Sentinel master name {:?}: expected [A-Za-z0-9._-]+",
                target.master
            )));
        }
        if target.node_db < 0 {
            return Err(Error::Config("the Redis database must be ≥ 0".to_owned()));
        }
        let mut nodes = Nodes {
            sentinels: Vec::new(),
            asked: Vec::new(),
            master_name: target.master,
            node_auth: target.node_auth,
            node_db: target.node_db,
            #[cfg(feature = "tls")]
            tls: target.tls.then_some(redis::TlsCertificates {
                client_tls: None,
                root_cert: tls_root_ca,
            }),
        };
        for addr in &target.sentinels {
            let (host, port) = parse_addr(addr)?;
            let redis = settings(target.sentinel_auth.as_ref(), 0)
                // Sentinels before 7.2 do not know `CLIENT SETINFO`.
                .set_skip_set_lib_name();
            nodes.sentinels.push(nodes.client(host, port, redis)?);
            nodes.asked.push(Mutex::new(None));
        }
        Ok(nodes)
    }

    /// A client for the data node at `host:port`.
    pub(super) fn node(&self, host: &str, port: u16) -> Result<redis::Client> {
        self.client(host, port, settings(self.node_auth.as_ref(), self.node_db))
    }

    fn client(&self, host: &str, port: u16, redis: RedisConnectionInfo) -> Result<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(certificates) = &self.tls {
            let addr = ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            };
            return redis::Client::build_with_tls(info(addr, redis)?, certificates.clone())
                .map_err(invalid);
        }
        redis::Client::open(info(ConnectionAddr::Tcp(host.to_owned(), port), redis)?)
            .map_err(invalid)
    }
}

fn info(addr: ConnectionAddr, redis: RedisConnectionInfo) -> Result<ConnectionInfo> {
    Ok(addr
        .into_connection_info()
        .map_err(invalid)?
        .set_redis_settings(redis))
}

fn settings(auth: Option<&Auth>, db: i64) -> RedisConnectionInfo {
    let redis = RedisConnectionInfo::default().set_db(db);
    match auth {
        Some(auth) if auth.username.is_empty() => redis.set_password(&auth.password),
        Some(auth) => redis
            .set_username(&auth.username)
            .set_password(&auth.password),
        None => redis,
    }
}

// The client's own message can echo settings; keep credentials out of logs.
fn invalid(err: redis::RedisError) -> Error {
    Error::Config(format!(
        "invalid Redis Sentinel settings ({:?})",
        err.kind()
    ))
}

/// `host:port` (an IPv6 host in brackets).
fn parse_addr(addr: &str) -> Result<(&str, u16)> {
    let bad = || {
        Error::Config(format!(
            "invalid sentinel address {addr:?}: expected host:port"
        ))
    };
    let (host, port) = addr.trim().rsplit_once(':').ok_or_else(bad)?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']').ok_or_else(bad)?,
        None if host.contains(':') => return Err(bad()),
        None => host,
    };
    let port = port.parse().map_err(|_| bad())?;
    if host.is_empty() || host.contains('/') || port == 0 {
        return Err(bad());
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::parse_addr;

    #[test]
    fn sentinel_addresses_are_host_and_port() {
        assert_eq!(parse_addr("10.0.0.1:26379").unwrap(), ("10.0.0.1", 26379));
        assert_eq!(parse_addr(" [::1]:26379 ").unwrap(), ("::1", 26379));
        for bad in ["10.0.0.1", ":26379", "host:0", "host:x", "redis://h:1"] {
            assert!(parse_addr(bad).is_err(), "{bad}");
        }
    }
}
