//! A real Redis Sentinel deployment: one master, two replicas and three sentinels
//! (`redis-server --sentinel`) on free ports, monitoring the master as [`MASTER_NAME`] with a
//! quorum of 2 and short timeouts (a dead master is replaced in about 2 s). Torn down on drop.
//!
//! ```no_run
//! let mut sentinel = redguard_tests::RedisSentinel::start();
//! let old = sentinel.master();
//! sentinel.kill_master();                       // SIGKILL: its data is gone
//! let new = sentinel.wait_for_promotion(old);   // the index of the promoted replica
//! sentinel.failover();                          // `SENTINEL FAILOVER`: a planned switch
//! # let _ = new;
//! ```

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{RedisServer, free_port};

/// The name the sentinels monitor the master under (Sentinel's customary default).
pub const MASTER_NAME: &str = "mymaster";

/// How long the sentinels wait before they call an unanswering master down.
pub const DOWN_AFTER_MS: u64 = 1000;

/// Short, so a second failover in one test is not refused for long (Sentinel waits twice
/// this before failing the same master over again).
const FAILOVER_TIMEOUT_MS: u64 = 3000;

const INSTALL_HINT: &str = "redis-server was not found on PATH. The Sentinel tests start \
    their own sentinels (`redis-server --sentinel`): install it (Debian/Ubuntu: `sudo apt-get \
    install redis-server`; macOS: `brew install redis`) or run `scripts/test`; or name another \
    server binary in REDGUARD_TEST_SERVER";

/// One master, two replicas, three sentinels.
#[derive(Debug)]
pub struct RedisSentinel {
    /// The data nodes; which one is the master changes with failovers.
    nodes: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
    /// With TLS: the certificates, and each node's TLS port (what the sentinels name).
    tls: Option<Tls>,
}

#[derive(Debug)]
struct Tls {
    dir: tempfile::TempDir,
    node_ports: Vec<u16>,
}

impl Tls {
    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// The `tls-*` settings of a node or sentinel listening for TLS on `port`; replication
    /// and the sentinels' own connections use TLS too.
    fn args(&self, port: u16) -> Vec<String> {
        vec![
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            self.file("server.crt"),
            "--tls-key-file".into(),
            self.file("server.key"),
            "--tls-ca-cert-file".into(),
            self.file("ca.crt"),
            "--tls-auth-clients".into(),
            "no".into(),
            "--tls-replication".into(),
            "yes".into(),
        ]
    }
}

/// One sentinel process (`redis-server --sentinel`) with its own config file (Sentinel rewrites it).
#[derive(Debug)]
struct SentinelProcess {
    /// The plain port (the harness's own questions).
    port: u16,
    /// With TLS, the port clients use.
    tls_port: Option<u16>,
    _dir: tempfile::TempDir,
    child: Child,
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill(1)");
    assert!(status.success(), "kill {signal} {pid} failed");
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        // A stopped process is continued first, so that `wait` returns.
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RedisSentinel {
    /// Starts the nodes and the sentinels and waits until every sentinel knows both replicas
    /// and the other two sentinels (before that, a failover could not be agreed on) and both
    /// replicas have synced.
    ///
    /// # Panics
    /// When the server binary is missing (naming the package), or the
    /// deployment does not come up within 30 s.
    pub fn start() -> RedisSentinel {
        Self::start_sized(2, 3)
    }

    /// One master and one sentinel (quorum 1), no replica: what the conformance suite runs
    /// on (a handle on Sentinel, without the cost of a deployment that can fail over).
    pub fn start_small() -> RedisSentinel {
        Self::start_sized(0, 1)
    }

    /// [`start`](RedisSentinel::start) with every node and sentinel also serving TLS (one
    /// test CA, trust [`ca_pem`](RedisSentinel::ca_pem)); replication and the sentinels'
    /// connections use TLS, and the sentinels name the nodes' TLS ports.
    pub fn start_tls() -> RedisSentinel {
        let dir = tempfile::tempdir().expect("create a temp dir for certificates");
        crate::make_test_certificates(dir.path());
        let tls = Tls {
            dir,
            node_ports: (0..3).map(|_| free_port()).collect(),
        };
        Self::start_with_tls(2, 3, Some(tls))
    }

    /// The test CA's certificate, PEM (TLS deployments only).
    pub fn ca_pem(&self) -> Vec<u8> {
        let tls = self.tls.as_ref().expect("not a TLS deployment");
        std::fs::read(tls.dir.path().join("ca.crt")).expect("read the test CA")
    }

    fn start_sized(replicas: usize, sentinels: usize) -> RedisSentinel {
        Self::start_with_tls(replicas, sentinels, None)
    }

    fn start_with_tls(replicas: usize, sentinels: usize, tls: Option<Tls>) -> RedisSentinel {
        let node_args = |index: usize| -> Vec<String> {
            tls.as_ref()
                .map(|tls| tls.args(tls.node_ports[index]))
                .unwrap_or_default()
        };
        let start = |args: Vec<String>| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            RedisServer::start_with(&args)
        };
        let master = start(node_args(0));
        let monitored = match &tls {
            Some(tls) => tls.node_ports[0],
            None => master.port(),
        };
        let mut nodes = vec![master];
        for index in 1..=replicas {
            let mut args = node_args(index);
            args.extend([
                "--replicaof".into(),
                "127.0.0.1".into(),
                monitored.to_string(),
            ]);
            nodes.push(start(args));
        }
        let quorum = sentinels / 2 + 1;
        let sentinels = (0..sentinels)
            .map(|_| SentinelProcess::start(monitored, quorum, tls.as_ref()))
            .collect();
        let deployment = RedisSentinel {
            nodes,
            sentinels,
            tls,
        };
        deployment.wait_until_ready(Duration::from_secs(30));
        deployment
    }

    /// Waits until every sentinel sees every replica and every other sentinel, and every
    /// replica is in sync with the master the sentinels name.
    pub fn wait_until_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        let replicas = (self.nodes.len() - 1).to_string();
        let others = (self.sentinels.len() - 1).to_string();
        loop {
            let ready = self.sentinels.iter().all(|sentinel| {
                let fields = sentinel.master_fields();
                let field = |name: &str| {
                    fields
                        .iter()
                        .position(|f| f == name)
                        .and_then(|i| fields.get(i + 1))
                        .cloned()
                        .unwrap_or_default()
                };
                field("num-slaves") == replicas
                    && field("num-other-sentinels") == others
                    && field("flags") == "master"
            }) && self.replicas_in_sync();
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Sentinel deployment did not become ready in {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The port the sentinels name node `index` by.
    fn named_port(&self, index: usize) -> u16 {
        match &self.tls {
            Some(tls) => tls.node_ports[index],
            None => self.nodes[index].port(),
        }
    }

    fn index_of(&self, named: u16) -> Option<usize> {
        (0..self.nodes.len()).find(|&index| self.named_port(index) == named)
    }

    fn replicas_in_sync(&self) -> bool {
        let master = self.master_port();
        (0..self.nodes.len())
            .filter(|&index| self.named_port(index) != master)
            .map(|index| &self.nodes[index])
            .filter(|node| node.pid().is_some())
            .all(|node| {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut node.connection())
                    .unwrap_or_default();
                info.contains("master_link_status:up")
                    && info.contains(&format!("master_port:{master}"))
            })
    }

    /// `host:port` of each sentinel, what [`redguard::Redguard::redis_sentinel`] takes.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|sentinel| format!("127.0.0.1:{}", sentinel.tls_port.unwrap_or(sentinel.port)))
            .collect()
    }

    /// The builder of a handle on this deployment, for settings of the test's own.
    pub fn builder(&self) -> redguard::Builder<redguard::handle::Sentinel> {
        redguard::Redguard::redis_sentinel(self.sentinel_addrs(), MASTER_NAME)
    }

    /// A handle on this deployment with default settings.
    pub async fn connect(&self) -> redguard::Redguard {
        self.builder()
            .connect()
            .await
            .expect("connect to the test Sentinel deployment")
    }

    /// The data nodes, by index (stable across failovers).
    pub fn node(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// The port of the master the first answering sentinel names.
    pub fn master_port(&self) -> u16 {
        self.sentinels
            .iter()
            .find_map(SentinelProcess::master_addr)
            .map(|(_, port)| port)
            .expect("no sentinel names a master")
    }

    /// The index of the node the sentinels name as master.
    pub fn master(&self) -> usize {
        self.index_of(self.master_port())
            .expect("the master is one of ours")
    }

    /// SIGKILLs the master; returns its index. Its unreplicated writes are gone.
    pub fn kill_master(&mut self) -> usize {
        let master = self.master();
        self.nodes[master].kill();
        master
    }

    /// Asks a sentinel for a planned failover (`SENTINEL FAILOVER`): a replica is promoted
    /// while the old master still runs, then the old master is made its replica.
    pub fn failover(&self) {
        let mut conn = self.sentinels[0]
            .connection()
            .expect("connect to a test sentinel");
        let _: () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(MASTER_NAME)
            .query(&mut conn)
            .expect("SENTINEL FAILOVER");
    }

    /// [`wait_for_promotion`](RedisSentinel::wait_for_promotion) from async code: on a
    /// blocking thread (it sleeps between polls), handing the harness back when done.
    pub async fn promoted(self, old: usize) -> RedisSentinel {
        tokio::task::spawn_blocking(move || {
            self.wait_for_promotion(old);
            self
        })
        .await
        .expect("wait for the promotion")
    }

    /// Waits until every answering sentinel names a master other than node `old`, and that
    /// node says `ROLE` master; returns its index.
    pub fn wait_for_promotion(&self, old: usize) -> usize {
        let old_port = self.named_port(old);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let named: Vec<u16> = self
                .sentinels
                .iter()
                .filter_map(SentinelProcess::master_addr)
                .map(|(_, port)| port)
                .collect();
            if let Some(&port) = named.first()
                && port != old_port
                && named.iter().all(|&p| p == port)
                && let Some(index) = self.index_of(port)
                && role(&self.nodes[index]) == "master"
            {
                return index;
            }
            assert!(
                Instant::now() < deadline,
                "no replica was promoted within 30 s (sentinels name {named:?})"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A plain connection to the current master.
    pub fn master_connection(&self) -> redis::Connection {
        self.nodes[self.master()].connection()
    }

    /// SIGSTOPs sentinel `index`: it keeps its connections and answers nothing.
    pub fn pause_sentinel(&self, index: usize) {
        signal(self.sentinels[index].child.id(), "-STOP");
    }

    /// SIGCONTs a paused sentinel.
    pub fn resume_sentinel(&self, index: usize) {
        signal(self.sentinels[index].child.id(), "-CONT");
    }

    /// Fails the test if any key on the current master has no TTL.
    pub fn assert_every_key_has_ttl(&self) {
        self.nodes[self.master()].assert_every_key_has_ttl();
    }
}

impl SentinelProcess {
    fn start(master_port: u16, quorum: usize, tls: Option<&Tls>) -> SentinelProcess {
        for _ in 0..5 {
            let port = free_port();
            let tls_port = tls.map(|_| free_port());
            let tls_config = match (tls, tls_port) {
                (Some(tls), Some(tls_port)) => tls
                    .args(tls_port)
                    .chunks(2)
                    .map(|pair| format!("{} {}\n", pair[0].trim_start_matches("--"), pair[1]))
                    .collect(),
                _ => String::new(),
            };
            let dir = tempfile::tempdir().expect("create a temp dir for redis-sentinel");
            let config = dir.path().join("sentinel.conf");
            std::fs::write(
                &config,
                format!(
                    "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {quorum}\n\
                     sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                     sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
                     sentinel parallel-syncs {MASTER_NAME} 2\n{tls_config}",
                    dir = dir.path().display(),
                ),
            )
            .expect("write sentinel.conf");
            let child = Command::new(crate::server_binary())
                .arg(&config)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            let child = match child {
                Ok(child) => child,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL_HINT}"),
                Err(err) => panic!("could not run redis-sentinel: {err}"),
            };
            let mut sentinel = SentinelProcess {
                port,
                tls_port,
                _dir: dir,
                child,
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if ping(port) {
                    return sentinel;
                }
                if let Ok(Some(_)) = sentinel.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = sentinel.child.kill();
        }
        panic!("redis-sentinel did not start on any of 5 free ports");
    }

    /// A connection, or an error within about a second (a paused sentinel accepts
    /// connections, as the kernel does, and answers nothing).
    fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let conn = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?
            .get_connection_with_timeout(Duration::from_secs(1))?;
        conn.set_read_timeout(Some(Duration::from_secs(1)))?;
        Ok(conn)
    }

    /// `SENTINEL MASTER <name>` as a flat list of field names and values.
    fn master_fields(&self) -> Vec<String> {
        let Ok(mut conn) = self.connection() else {
            return Vec::new();
        };
        redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(MASTER_NAME)
            .query(&mut conn)
            .unwrap_or_default()
    }

    fn master_addr(&self) -> Option<(String, u16)> {
        let reply: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER_NAME)
            .query(&mut self.connection().ok()?)
            .ok()?;
        reply
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

/// The node's `ROLE`: `master` or `slave` (empty when it does not answer).
pub fn role(node: &RedisServer) -> String {
    let Ok(client) = redis::Client::open(node.url()) else {
        return String::new();
    };
    let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(500)) else {
        return String::new();
    };
    let reply: redis::Value = redis::cmd("ROLE")
        .query(&mut conn)
        .unwrap_or(redis::Value::Nil);
    match reply {
        redis::Value::Array(fields) => match fields.first() {
            Some(redis::Value::BulkString(role)) => String::from_utf8_lossy(role).into_owned(),
            _ => String::new(),
        },
        _ => String::new(),
    }
}
