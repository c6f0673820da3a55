//! The connection settings every redguard program reads from its environment: the library's
//! [`Redguard::from_env`](crate::Redguard::from_env) and the `redguard` command-line tool.
//!
//! | variable | meaning |
//! |---|---|
//! | `REDGUARD_REDIS_CLUSTER_URLS` | comma-separated Cluster node URLs (takes precedence) |
//! | `REDGUARD_REDIS_SENTINELS` | comma-separated sentinel `host:port`s or `redis://host:port/`s: Redis Sentinel (not with `REDGUARD_REDIS_URL`) |
//! | `REDGUARD_REDIS_MASTER` | the master name the sentinels monitor (default `mymaster`) |
//! | `REDGUARD_REDIS_SENTINEL_USERNAME`, `_PASSWORD` | the sentinels' credentials |
//! | `REDGUARD_REDIS_USERNAME`, `_PASSWORD`, `_DB` | the data nodes' credentials and database, with Sentinel |
//! | `REDGUARD_REDIS_URL`, else `REDIS_URL` | one Redis: `redis://[user:password@]host[:port][/db]`, `rediss://` for TLS |
//! | `REDGUARD_TLS_CA` | path of PEM root certificate(s) to trust for `rediss://` |
//! | `REDGUARD_PREFIX` | the key prefix (default `redguard`) |

use crate::error::{Error, Result};
use crate::handle::{Builder, Redguard};

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A builder for the store the environment names; `None` when it names no Redis.
pub(crate) fn builder() -> Result<Option<Builder>> {
    builder_from(&var)
}

/// [`builder`] with the variables read through `var`.
fn builder_from(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<Builder>> {
    let builder = if let Some(urls) = var("REDGUARD_REDIS_CLUSTER_URLS") {
        cluster(&urls)?
    } else if let Some(sentinels) = var("REDGUARD_REDIS_SENTINELS") {
        if var("REDGUARD_REDIS_URL").is_some() {
            return Err(Error::Config(
                "both REDGUARD_REDIS_URL and REDGUARD_REDIS_SENTINELS are set: name one Redis \
                 (a URL) or the sentinels that find it, not both"
                    .to_owned(),
            ));
        }
        sentinel(&sentinels, var)?
    } else if let Some(url) = var("REDGUARD_REDIS_URL").or_else(|| var("REDIS_URL")) {
        Redguard::redis(url)
    } else {
        return Ok(None);
    };
    let builder = match var("REDGUARD_TLS_CA") {
        Some(path) => tls_root_ca(builder, &path)?,
        None => builder,
    };
    Ok(Some(match var("REDGUARD_PREFIX") {
        Some(prefix) => builder.prefix(prefix),
        None => builder,
    }))
}

#[cfg(feature = "cluster")]
fn cluster(urls: &str) -> Result<Builder> {
    Ok(Redguard::redis_cluster(
        urls.split(',').map(str::trim).filter(|u| !u.is_empty()),
    ))
}

#[cfg(not(feature = "cluster"))]
fn cluster(_: &str) -> Result<Builder> {
    Err(Error::Config(
        "REDGUARD_REDIS_CLUSTER_URLS is set, but redguard was built without the `cluster` \
         feature"
            .to_owned(),
    ))
}

#[cfg(feature = "sentinel")]
fn sentinel(sentinels: &str, var: &dyn Fn(&str) -> Option<String>) -> Result<Builder> {
    let master = var("REDGUARD_REDIS_MASTER").unwrap_or_else(|| "mymaster".to_owned());
    let mut builder = Redguard::redis_sentinel(
        sentinels
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty()),
        master,
    );
    if let Some(password) = var("REDGUARD_REDIS_SENTINEL_PASSWORD") {
        let username = var("REDGUARD_REDIS_SENTINEL_USERNAME").unwrap_or_default();
        builder = builder.sentinel_auth(username, password);
    }
    if let Some(password) = var("REDGUARD_REDIS_PASSWORD") {
        let username = var("REDGUARD_REDIS_USERNAME").unwrap_or_default();
        builder = builder.node_auth(username, password);
    }
    if let Some(db) = var("REDGUARD_REDIS_DB") {
        let db = db.trim().parse().map_err(|_| {
            Error::Config(format!(
                "REDGUARD_REDIS_DB: {db:?} is not a database number"
            ))
        })?;
        builder = builder.node_db(db);
    }
    Ok(builder.into())
}

#[cfg(not(feature = "sentinel"))]
fn sentinel(_: &str, _: &dyn Fn(&str) -> Option<String>) -> Result<Builder> {
    Err(Error::Config(
        "REDGUARD_REDIS_SENTINELS is set, but redguard was built without the `sentinel` \
         feature"
            .to_owned(),
    ))
}

#[cfg(feature = "tls")]
fn tls_root_ca(builder: Builder, path: &str) -> Result<Builder> {
    let pem = std::fs::read(path)
        .map_err(|err| Error::Config(format!("REDGUARD_TLS_CA: cannot read {path}: {err}")))?;
    Ok(builder.tls_root_ca(pem))
}

#[cfg(not(feature = "tls"))]
fn tls_root_ca(_: Builder, _: &str) -> Result<Builder> {
    Err(Error::Config(
        "REDGUARD_TLS_CA is set, but redguard was built without the `tls` feature".to_owned(),
    ))
}

/// The prefix the environment names, for the in-memory store.
pub(crate) fn prefix() -> Option<String> {
    var("REDGUARD_PREFIX")
}

#[cfg(test)]
mod tests {
    use super::builder_from;
    use crate::error::Error;

    fn from(vars: &[(&str, &str)]) -> crate::Result<Option<crate::handle::Builder>> {
        builder_from(&|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn a_url_and_sentinels_together_are_a_config_error() {
        let both = from(&[
            ("REDGUARD_REDIS_URL", "redis://127.0.0.1:6379"),
            ("REDGUARD_REDIS_SENTINELS", "127.0.0.1:26379"),
        ]);
        assert!(matches!(both, Err(Error::Config(_))), "{both:?}");
    }

    #[cfg(feature = "sentinel")]
    #[test]
    fn sentinels_alone_select_sentinel() {
        let sentinel = from(&[
            ("REDGUARD_REDIS_SENTINELS", "10.0.0.1:26379, 10.0.0.2:26379"),
            ("REDGUARD_REDIS_MASTER", "orders"),
            ("REDGUARD_REDIS_DB", "2"),
        ])
        .unwrap()
        .expect("a Redis builder");
        let text = format!("{sentinel:?}");
        assert!(
            text.contains("10.0.0.2:26379") && text.contains("\"orders\""),
            "{text}"
        );
        assert!(text.contains("node_db: 2"), "{text}");
        let bad_db = from(&[
            ("REDGUARD_REDIS_SENTINELS", "h:1"),
            ("REDGUARD_REDIS_DB", "x"),
        ]);
        assert!(matches!(bad_db, Err(Error::Config(_))), "{bad_db:?}");
    }
}
