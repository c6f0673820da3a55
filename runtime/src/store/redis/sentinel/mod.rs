//! Redis Sentinel: a connection to whichever node the sentinels name as master, moving to the
//! new one by itself after a failover.
//!
//! One [`SentinelConn`] shares its state with a follower task ([`follow`]) and one
//! subscription per sentinel ([`events`]). Calls go to the current master over one
//! multiplexed connection; the follower replaces it when
//! - a call finds it broken, or the node says `READONLY`/`MASTERDOWN` (it was demoted): the
//!   sentinels are asked every 100 ms until a master answers, while calls fail at once;
//! - a sentinel announces the replica it is about to promote (`+selected-slave`): calls wait
//!   (within their timeout) while the candidate is polled until it says it is master, so a
//!   planned `SENTINEL FAILOVER` loses no write to the old master;
//! - a sentinel announces `+switch-master`, or the 1 s check finds the sentinels naming
//!   another master that says it is one.
//!
//! A node is only ever used after its own `ROLE` said `master`, and a master is only left for
//! one the sentinels name: a restarted, empty old master is never returned to. Nor, for 10 s, is a
//! master left for an announced promotion: it still says master, and the sentinels that have
//! not heard of the promotion yet name it, but what it acknowledges then is lost.

mod config;
mod events;
mod follow;
mod probe;

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};
use tokio::sync::{Notify, watch};
use tokio::task::AbortHandle;

use self::config::Nodes;
pub(crate) use self::config::{Auth, SentinelTarget};
use crate::error::Result;

/// Where calls go now.
#[derive(Clone)]
enum Master {
    /// A node that said `ROLE` master, and our connection to it.
    Up(Arc<Node>),
    /// A replica is being promoted: calls wait for it (bounded by their timeout).
    Switching,
    /// No known master answers: calls fail at once, as backend errors.
    Broken,
}

struct Node {
    addr: (String, u16),
    conn: MultiplexedConnection,
    /// For connections of other kinds to the same node (the lock-release subscription).
    client: redis::Client,
    /// Bumped on every move, so a call can tell that its reply came from a replaced master.
    generation: u64,
}

struct Shared {
    nodes: Nodes,
    master: watch::Sender<Master>,
    /// Asks the follower to look for the master now.
    kick: Notify,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(PoisonError::into_inner);
        for task in tasks.drain(..) {
            task.abort();
        }
    }
}

/// A connection to the master a set of sentinels names. Cheap to clone.
#[derive(Clone)]
pub(crate) struct SentinelConn {
    shared: Arc<Shared>,
    db: i64,
}

impl fmt::Debug for SentinelConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The node settings hold passwords.
        f.debug_struct("SentinelConn").finish_non_exhaustive()
    }
}

impl SentinelConn {
    /// Finds the master (within `connect_timeout`) and starts following it.
    pub(crate) async fn connect(
        target: SentinelTarget,
        #[cfg(feature = "tls")] tls_root_ca: Option<Vec<u8>>,
        connect_timeout: std::time::Duration,
    ) -> Result<SentinelConn> {
        let db = target.node_db;
        let nodes = Nodes::new(
            target,
            #[cfg(feature = "tls")]
            tls_root_ca,
        )?;
        let first = follow::first_master(&nodes, connect_timeout).await?;
        let shared = Arc::new(Shared {
            nodes,
            master: watch::channel(Master::Up(Arc::new(first))).0,
            kick: Notify::new(),
            tasks: Mutex::new(Vec::new()),
        });
        let (announce, announced) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks =
            vec![tokio::spawn(follow::run(Arc::downgrade(&shared), announced)).abort_handle()];
        for sentinel in 0..shared.nodes.sentinels.len() {
            tasks.push(
                tokio::spawn(events::run(
                    Arc::downgrade(&shared),
                    sentinel,
                    announce.clone(),
                ))
                .abort_handle(),
            );
        }
        *shared.tasks.lock().unwrap_or_else(PoisonError::into_inner) = tasks;
        Ok(SentinelConn { shared, db })
    }

    /// A client for the current master (the lock-release subscription's), if one is known.
    pub(crate) fn master_client(&self) -> Option<redis::Client> {
        match &*self.shared.master.borrow() {
            Master::Up(node) => Some(node.client.clone()),
            Master::Switching | Master::Broken => None,
        }
    }

    /// The current master's generation (0 when none is known).
    pub(crate) fn generation(&self) -> u64 {
        match &*self.shared.master.borrow() {
            Master::Up(node) => node.generation,
            Master::Switching | Master::Broken => 0,
        }
    }

    /// Resolves once the master is no longer the one of `generation`.
    pub(crate) async fn moved_from(&self, generation: u64) {
        let mut master = self.shared.master.subscribe();
        let _ = master
            .wait_for(|master| !matches!(master, Master::Up(node) if node.generation == generation))
            .await;
    }

    /// The node calls go to now: waits out a promotion in progress (the caller's timeout
    /// bounds the wait), fails at once while no master is known.
    async fn node(&self) -> Result<Arc<Node>, RedisError> {
        if let Master::Up(node) = &*self.shared.master.borrow() {
            return Ok(Arc::clone(node));
        }
        let mut master = self.shared.master.subscribe();
        let current = master
            .wait_for(|master| !matches!(master, Master::Switching))
            .await
            .map(|master| master.clone());
        match current {
            Ok(Master::Up(node)) => Ok(node),
            _ => {
                self.shared.kick.notify_one();
                Err(no_master())
            }
        }
    }

    /// After a failed call on `node`: a broken connection or a demoted node means the master
    /// must be looked for again.
    fn check(&self, node: &Node, err: &RedisError) {
        let moved = matches!(
            err.kind(),
            redis::ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        );
        if moved || err.is_io_error() || err.is_connection_dropped() || err.is_unrecoverable_error()
        {
            let replaced = self.shared.master.send_if_modified(|master| match master {
                Master::Up(current) if current.generation == node.generation => {
                    *master = Master::Broken;
                    true
                }
                _ => false,
            });
            if replaced {
                tracing::warn!(
                    error = %err,
                    "the Redis master stopped answering as master; asking the sentinels"
                );
            }
            self.shared.kick.notify_one();
        }
    }

    /// A reply that arrived after the master was replaced came from a node whose writes the
    /// new master may never have seen: its outcome is unknown, as for a lost connection.
    fn still_current(&self, node: &Node) -> Result<(), RedisError> {
        if self.generation() == node.generation {
            Ok(())
        } else {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "the reply came from a Redis master that was replaced meanwhile",
            )))
        }
    }
}

fn no_master() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "no Redis master is reachable now; the sentinels are being asked",
    ))
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let node = self.node().await?;
            let mut conn = node.conn.clone();
            match conn.req_packed_command(cmd).await {
                Ok(value) => self.still_current(&node).map(|()| value),
                Err(err) => {
                    self.check(&node, &err);
                    Err(err)
                }
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let node = self.node().await?;
            let mut conn = node.conn.clone();
            match conn.req_packed_commands(pipeline, offset, count).await {
                Ok(values) => self.still_current(&node).map(|()| values),
                Err(err) => {
                    self.check(&node, &err);
                    Err(err)
                }
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}
