//! A real Redis Cluster from `redis-server` processes: 3 masters and 3 replicas on free
//! ports, created with `redis-cli --cluster create`, torn down on drop.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::RedisServer;

/// Short, so a killed master's replica is promoted in a couple of seconds.
const NODE_TIMEOUT_MS: &str = "1000";

/// Six nodes; which are masters changes with failovers.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts 6 nodes, creates the cluster (1 replica per master) and waits until every node
    /// reports `cluster_state:ok`.
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    NODE_TIMEOUT_MS,
                    "--cluster-require-full-coverage",
                    "no",
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("run redis-cli (install the `redis-tools` package)");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ok(Duration::from_secs(20));
        cluster
    }

    /// Waits until every running node says `cluster_state:ok` with all slots served, and
    /// every replica has synced with its master.
    pub fn wait_until_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if self.running().all(node_ok) {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|node| node.pid().is_some())
    }

    /// Seed URLs for a client.
    pub fn urls(&self) -> Vec<String> {
        self.running().map(RedisServer::url).collect()
    }

    /// A handle on this cluster with default settings.
    pub async fn connect(&self) -> redguard::Redguard {
        redguard::Redguard::redis_cluster(self.urls())
            .connect()
            .await
            .expect("connect to the test cluster")
    }

    /// The nodes, by index (stable across failovers).
    pub fn node(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// The index of the running master serving `key`.
    pub fn master_of(&self, key: &str) -> usize {
        let mut conn = self.running().next().expect("no running node").connection();
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .expect("CLUSTER KEYSLOT");
        let shards: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut conn)
            .expect("CLUSTER SLOTS");
        let redis::Value::Array(ranges) = shards else {
            panic!("unexpected CLUSTER SLOTS reply");
        };
        for range in ranges {
            let redis::Value::Array(fields) = range else {
                continue;
            };
            let (
                Some(redis::Value::Int(start)),
                Some(redis::Value::Int(end)),
                Some(redis::Value::Array(master)),
            ) = (fields.first(), fields.get(1), fields.get(2))
            else {
                continue;
            };
            if (*start..=*end).contains(&i64::from(slot))
                && let Some(redis::Value::Int(port)) = master.get(1)
            {
                return self
                    .nodes
                    .iter()
                    .position(|node| i64::from(node.port()) == *port)
                    .expect("the master is one of ours");
            }
        }
        panic!("no master serves slot {slot}");
    }

    /// The index of a running replica of master `index`.
    pub fn replica_of(&self, index: usize) -> usize {
        let port = i64::from(self.nodes[index].port());
        self.nodes
            .iter()
            .position(|node| {
                if node.pid().is_none() {
                    return false;
                }
                let reply: redis::Value = redis::cmd("ROLE")
                    .query(&mut node.connection())
                    .expect("ROLE");
                // A replica's ROLE: ["slave", master host, master port, state, offset].
                matches!(
                    reply,
                    redis::Value::Array(fields)
                        if matches!(fields.first(), Some(redis::Value::BulkString(role)) if role == b"slave")
                            && matches!(fields.get(2), Some(redis::Value::Int(p)) if *p == port)
                )
            })
            .expect("master has no running replica")
    }

    /// The URLs of the running masters.
    pub fn master_urls(&self) -> Vec<String> {
        self.running()
            .filter(|node| role(node) == "master")
            .map(RedisServer::url)
            .collect()
    }

    /// Every key on every running master.
    pub fn keys(&self) -> Vec<String> {
        self.running()
            .filter(|node| role(node) == "master")
            .flat_map(RedisServer::keys)
            .collect()
    }

    /// Fails the test if any key on any master has no TTL.
    pub fn assert_every_key_has_ttl(&self) {
        for node in self.running().filter(|node| role(node) == "master") {
            node.assert_every_key_has_ttl();
        }
    }
}

fn role(node: &RedisServer) -> String {
    let reply: redis::Value = redis::cmd("ROLE")
        .query(&mut node.connection())
        .expect("ROLE");
    match reply {
        redis::Value::Array(fields) => match fields.first() {
            Some(redis::Value::BulkString(role)) => String::from_utf8_lossy(role).into_owned(),
            _ => String::new(),
        },
        _ => String::new(),
    }
}

fn node_ok(node: &RedisServer) -> bool {
    let Ok(client) = redis::Client::open(node.url()) else {
        return false;
    };
    let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(500)) else {
        return false;
    };
    let info: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query(&mut conn)
        .unwrap_or_default();
    if !(info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")) {
        return false;
    }
    // A replica that never finished its first sync cannot be promoted: wait for it.
    let replication: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut conn)
        .unwrap_or_default();
    !replication.contains("role:slave") || replication.contains("master_link_status:up")
}
