//! One connection type for a single node, a Cluster and a Sentinel-managed master, so every
//! guard operation is written once.

use redis::aio::{ConnectionLike, ConnectionManager};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

#[cfg(feature = "sentinel")]
use super::sentinel::SentinelConn;

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
