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
        let addrs = target
            .sentinels
            .iter()
            .map(|addr| parse_addr(addr))
            .collect::<Result<Vec<_>>>()?;
        let tls = wants_tls(&addrs, {
            #[cfg(feature = "tls")]
            {
                target.tls
            }
            #[cfg(not(feature = "tls"))]
            {
                false
            }
        })?;
        let mut nodes = Nodes {
            sentinels: Vec::new(),
            asked: Vec::new(),
            master_name: target.master,
            node_auth: target.node_auth,
            node_db: target.node_db,
            #[cfg(feature = "tls")]
            tls: tls.then_some(redis::TlsCertificates {
                client_tls: None,
                root_cert: tls_root_ca,
            }),
        };
        #[cfg(not(feature = "tls"))]
        let _ = tls;
        for (host, port, _) in addrs {
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

/// How a sentinel address asks to be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    /// `host:port`: as the builder says (`sentinel_tls`).
    Bare,
    /// `redis://host:port/`: plain TCP.
    Plain,
    /// `rediss://host:port/`: TLS.
    Tls,
}

/// Whether to use TLS, given the addresses and `sentinel_tls`: `rediss://` asks for it as
/// `sentinel_tls` does (to the sentinels and the data nodes); `redis://` refuses it.
fn wants_tls(addrs: &[(&str, u16, Scheme)], sentinel_tls: bool) -> Result<bool> {
    let has = |scheme| addrs.iter().any(|(_, _, s)| *s == scheme);
    if has(Scheme::Plain) && (has(Scheme::Tls) || sentinel_tls) {
        return Err(Error::Config(
            "sentinel addresses mix plain `redis://` with TLS (`rediss://` or `sentinel_tls`): \
             one deployment is reached one way"
                .to_owned(),
        ));
    }
    let tls = sentinel_tls || has(Scheme::Tls);
    if tls && !cfg!(feature = "tls") {
        return Err(Error::Config(
            "a `rediss://` sentinel address needs redguard's `tls` feature".to_owned(),
        ));
    }
    Ok(tls)
}

/// `host:port` (an IPv6 host in brackets), or the same as a URL, `redis://host:port[/]` or
/// `rediss://host:port[/]`, the form redis-rs and most clients take.
fn parse_addr(addr: &str) -> Result<(&str, u16, Scheme)> {
    let trimmed = addr.trim();
    // Credentials stay out of the message (and the logs it reaches).
    let shown = match trimmed.rsplit_once('@') {
        Some((_, host)) => format!("…@{host}"),
        None => trimmed.to_owned(),
    };
    let bad = |why: &str| {
        Error::Config(format!(
            "invalid sentinel address {shown:?}: {why}; expected host:port or \
             redis://host:port/ (rediss:// for TLS)"
        ))
    };
    let (scheme, rest) = if let Some(rest) = trimmed.strip_prefix("redis://") {
        (Scheme::Plain, rest)
    } else if let Some(rest) = trimmed.strip_prefix("rediss://") {
        (Scheme::Tls, rest)
    } else if trimmed.contains("://") {
        return Err(bad("unknown scheme"));
    } else {
        (Scheme::Bare, trimmed)
    };
    let authority = match scheme {
        Scheme::Bare => rest,
        Scheme::Plain | Scheme::Tls => {
            let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
            if !path.is_empty() {
                return Err(bad(
                    "a sentinel has no database (the data nodes' is `node_db`)",
                ));
            }
            if authority.contains('@') {
                return Err(bad(
                    "credentials go to `sentinel_auth`, not into the address",
                ));
            }
            authority
        }
    };
    let (host, port) = authority.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']').ok_or_else(|| bad("unclosed `[`"))?,
        None if host.contains(':') => return Err(bad("an IPv6 host goes in brackets")),
        None => host,
    };
    let port = port.parse().map_err(|_| bad("bad port"))?;
    if host.is_empty() || host.contains('/') || port == 0 {
        return Err(bad("no host or port"));
    }
    Ok((host, port, scheme))
}

#[cfg(test)]
mod tests {
    use super::{Scheme, parse_addr, wants_tls};

    #[test]
    fn sentinel_addresses_are_host_and_port() {
        assert_eq!(
            parse_addr("10.0.0.1:26379").unwrap(),
            ("10.0.0.1", 26379, Scheme::Bare)
        );
        assert_eq!(
            parse_addr(" [::1]:26379 ").unwrap(),
            ("::1", 26379, Scheme::Bare)
        );
        for bad in [
            "10.0.0.1",
            ":26379",
            "host:0",
            "host:x",
            "::1:26379",
            "[::1:26379",
        ] {
            assert!(parse_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sentinel_addresses_take_the_url_form_too() {
        assert_eq!(
            parse_addr("redis://127.0.0.1:26379/").unwrap(),
            ("127.0.0.1", 26379, Scheme::Plain)
        );
        assert_eq!(
            parse_addr("redis://[::1]:26379").unwrap(),
            ("::1", 26379, Scheme::Plain)
        );
        assert_eq!(
            parse_addr("rediss://sentinel.internal:26380/").unwrap(),
            ("sentinel.internal", 26380, Scheme::Tls)
        );
        for (bad, says) in [
            ("redis://h:1/0", "no database"),
            ("redis://user:pw@h:1/", "sentinel_auth"),
            ("redis://h/", "no port"),
            ("http://h:1", "unknown scheme"),
            ("redis://", "no port"),
            ("redis://:1/", "no host"),
        ] {
            let err = parse_addr(bad).unwrap_err().to_string();
            assert!(
                err.contains(says) && err.contains("redis://host:port/"),
                "{bad}: {err}"
            );
            assert!(!err.contains("pw"), "{err}");
        }
    }

    #[test]
    fn rediss_asks_for_tls_and_plain_refuses_it() {
        let addr = |a| parse_addr(a).unwrap();
        let plain = [addr("redis://h:1"), addr("h:2")];
        assert!(!wants_tls(&plain, false).unwrap());
        assert!(
            wants_tls(&plain, true).is_err(),
            "redis:// with sentinel_tls"
        );
        let mixed = [addr("redis://h:1"), addr("rediss://h:2")];
        assert!(wants_tls(&mixed, false).is_err());
        let tls = [addr("rediss://h:1"), addr("h:2")];
        assert_eq!(wants_tls(&tls, false).is_ok(), cfg!(feature = "tls"));
    }
}
