//! One connection type for a single node, a Cluster and a Sentinel-managed master, so every
//! guard operation is written once; and the target a handle names to open one.

use std::fmt;

use redis::aio::{ConnectionLike, ConnectionManager};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

#[cfg(feature = "sentinel")]
use super::sentinel::{SentinelConn, SentinelTarget};
#[cfg(feature = "test-util")]
use super::test_util::TestHooks;

/// What a Redis store connects to.
#[derive(Debug)]
pub(crate) enum Endpoint {
    /// One node: `redis://…` or `rediss://…`.
    Single(String),
    /// A Cluster, given some of its nodes.
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
    /// The master the sentinels name.
    #[cfg(feature = "sentinel")]
    Sentinel(Box<SentinelTarget>),
    /// A connection the application opened.
    Existing(Box<Existing>),
}

/// Where a Redis store connects, and how.
#[derive(Debug)]
pub(crate) struct RedisTarget {
    pub(crate) endpoint: Endpoint,
    pub(crate) options: Options,
}

/// The settings of a Redis connection whatever its endpoint.
#[derive(Debug, Default)]
pub(crate) struct Options {
    /// What connect does when the server may evict guard keys.
    pub(crate) eviction: crate::store::EvictionCheck,
    /// PEM root certificate(s) to trust for TLS instead of the system's roots.
    #[cfg(feature = "tls")]
    pub(crate) tls_root_ca: Option<Vec<u8>>,
    #[cfg(feature = "test-util")]
    pub(crate) test: TestHooks,
}

/// An application's own connection, and the client the lock-release subscription opens its
/// connection from (pub/sub needs a connection of its own).
pub(crate) struct Existing {
    pub(crate) client: redis::Client,
    pub(crate) conn: Conn,
}

impl fmt::Debug for Existing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client's Debug would print its address, password included.
        f.debug_struct("Existing").finish_non_exhaustive()
    }
}

/// A multiplexed connection: to one node (reconnecting by itself) or to a Cluster (routing
/// each command by its key's slot, following MOVED/ASK and failovers) or to the master a set
/// of sentinels names (following failovers). Cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster(ClusterConnection),
    #[cfg(feature = "sentinel")]
    Sentinel(SentinelConn),
}

impl Conn {
    /// Through Sentinel, the current master's generation (0 while none is known); `None`
    /// elsewhere.
    pub(crate) fn generation(&self) -> Option<u64> {
        match self {
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(conn) => Some(conn.generation()),
            _ => None,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.get_db(),
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(conn) => conn.get_db(),
        }
    }
}
