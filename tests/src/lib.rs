//! Test harness: real `redis-server` processes on free ports, started and controlled by the
//! tests themselves.
//!
//! ```no_run
//! let mut server = redguard_tests::RedisServer::start();
//! let url = server.url();
//! server.pause();   // SIGSTOP: calls now time out
//! server.resume();
//! server.restart(); // empty, same port: scripts must be re-loaded
//! server.assert_every_key_has_ttl();
//! # let _ = url;
//! ```

/// Every Rust block of README.md as a doc-test, compiled in `cargo test` (run unless marked
/// `no_run`). Here, not in the runtime crate: this crate builds redguard with the features
/// README's blocks use (`axum`, `anyhow`) and has their dependencies (axum, tower, serde).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

pub mod cancel;
pub mod declared;
pub mod faults;
pub mod history;
pub mod metrics;
pub mod model;
pub mod mutate;
pub mod postgres;
pub mod props;
pub mod proxy;
pub mod rate;
pub mod vclock;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What to tell someone whose machine lacks Redis.
const INSTALL_HINT: &str = "redis-server was not found on PATH. The integration tests start \
    their own Redis: install it (Debian/Ubuntu: `sudo apt-get install redis-server`; macOS: \
    `brew install redis`) or run `scripts/test`, which installs it when apt-get is available; \
    or name another server binary in REDGUARD_TEST_SERVER";

/// The server binary every harness process runs: `$REDGUARD_TEST_SERVER` (a path to a
/// `redis-server` or `valkey-server`, as `scripts/servers` installs them for the
/// compatibility matrix), else `redis-server` from `PATH`. Sentinels run the same binary with
/// `--sentinel`, so one setting picks the server of every topology.
pub fn server_binary() -> String {
    std::env::var("REDGUARD_TEST_SERVER")
        .ok()
        .filter(|path| !path.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// A `redis-server` child process on a free loopback port, in its own temp dir, with
/// persistence off. Killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    core: Option<String>,
    /// With TLS: the TLS port (the plain port stays open for the harness's own inspection).
    tls_port: Option<u16>,
    /// More `redis-server` arguments (cluster mode).
    extra_args: Vec<String>,
}

impl RedisServer {
    /// Starts a server and waits until it answers `PING`.
    ///
    /// # Panics
    /// When `redis-server` is not installed (naming the package to install) or does not come
    /// up: a test that needs Redis must fail loudly, never skip.
    pub fn start() -> RedisServer {
        Self::start_pinned(None)
    }

    /// Like [`start`](RedisServer::start), with the server pinned to `core` by `taskset` (for
    /// benchmarks, so the load and Redis do not share a core).
    pub fn start_pinned(core: Option<&str>) -> RedisServer {
        // A port picked by the OS can be taken by another test between our probe and
        // redis-server's bind; try a few.
        for _ in 0..5 {
            let port = free_port();
            let mut server = RedisServer {
                port,
                dir: tempfile::tempdir().expect("create a temp dir for redis-server"),
                child: None,
                core: core.map(str::to_owned),
                tls_port: None,
                extra_args: Vec::new(),
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server did not start on any of 5 free ports");
    }

    /// Starts a server that also serves TLS (certificate from a fresh test CA made with
    /// `openssl`) on [`tls_url`](RedisServer::tls_url); trust [`ca_pem`](RedisServer::ca_pem).
    pub fn start_tls() -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            dir: tempfile::tempdir().expect("create a temp dir for redis-server"),
            child: None,
            core: None,
            tls_port: Some(free_port()),
            extra_args: Vec::new(),
        };
        make_test_certificates(server.dir.path());
        assert!(server.spawn(), "redis-server with TLS did not start");
        server
    }

    /// Starts a server with `args` added to its command line.
    pub fn start_with(args: &[&str]) -> RedisServer {
        for _ in 0..5 {
            let mut server = RedisServer {
                port: free_port(),
                dir: tempfile::tempdir().expect("create a temp dir for redis-server"),
                child: None,
                core: None,
                tls_port: None,
                extra_args: args.iter().map(|a| (*a).to_owned()).collect(),
            };
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server {args:?} did not start on any of 5 free ports");
    }

    /// `rediss://localhost:<tls port>/` (TLS servers only).
    pub fn tls_url(&self) -> String {
        let port = self
            .tls_port
            .expect("not a TLS server: use RedisServer::start_tls");
        format!("rediss://localhost:{port}/")
    }

    /// The test CA's certificate, PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.path().join("ca.crt")).expect("read the test CA")
    }

    /// Spawns the process on `self.port`; true once it answers `PING`.
    fn spawn(&mut self) -> bool {
        let mut command = match &self.core {
            Some(core) => {
                let mut taskset = Command::new("taskset");
                taskset.args(["-c", core]).arg(server_binary());
                taskset
            }
            None => Command::new(server_binary()),
        };
        let child = command
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(self.tls_args())
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL_HINT}"),
            Err(err) => panic!("could not run redis-server: {err}"),
        };
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.ping() {
                return true;
            }
            if let Some(child) = &mut self.child
                && let Ok(Some(_)) = child.try_wait()
            {
                self.child = None;
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        false
    }

    fn tls_args(&self) -> Vec<String> {
        let Some(port) = self.tls_port else {
            return Vec::new();
        };
        let file = |name: &str| self.dir.path().join(name).display().to_string();
        vec![
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            file("server.crt"),
            "--tls-key-file".into(),
            file("server.key"),
            "--tls-ca-cert-file".into(),
            file("ca.crt"),
            "--tls-auth-clients".into(),
            "no".into(),
        ]
    }

    fn ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
        let mut reply = [0u8; 7];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILLs the server and waits for it to exit. Its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server (if running) and starts an empty one on the same port.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.spawn() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGSTOPs the server: connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONTs a paused server.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("redis-server is not running");
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill(1)");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// A plain synchronous connection, for inspecting what the guards wrote.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|client| client.get_connection())
            .expect("connect to the test redis-server")
    }

    /// Every key currently stored.
    pub fn keys(&self) -> Vec<String> {
        let mut conn = self.connection();
        let iter: redis::Iter<'_, String> = redis::cmd("SCAN")
            .cursor_arg(0)
            .arg("COUNT")
            .arg(1000)
            .clone()
            .iter(&mut conn)
            .expect("SCAN");
        iter.map(|key| key.expect("SCAN key")).collect()
    }

    /// Fails the test if any stored key has no TTL: every key a guard writes must expire.
    pub fn assert_every_key_has_ttl(&self) {
        let mut conn = self.connection();
        let forever: Vec<String> = self
            .keys()
            .into_iter()
            .filter(|key| {
                let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).expect("PTTL");
                ttl == -1
            })
            .collect();
        assert!(forever.is_empty(), "keys without a TTL: {forever:?}");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A paused process ignores SIGKILL until continued on some kernels' accounting
            // of waits; continue it first so `wait` returns.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .stderr(Stdio::null())
                .status();
        }
        self.kill();
    }
}

mod cluster;
pub mod sentinel;

pub use crate::cluster::RedisCluster;
pub use crate::sentinel::RedisSentinel;

/// Retries `attempt` every 100 ms while the store is unreachable (`Error::Backend`, as during
/// a failover), returning its first other outcome; fails the test if that takes 30 s from
/// `since`, or on any other error.
pub async fn after_failover<T, F, Fut>(since: std::time::Instant, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, redguard::Error>>,
{
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(redguard::Error::Backend(_)) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
        assert!(
            since.elapsed() < std::time::Duration::from_secs(30),
            "the replica was not promoted within 30 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Connects a handle with default settings to `server`.
pub async fn connect(server: &RedisServer) -> redguard::Redguard {
    redguard::Redguard::redis(server.url())
        .connect()
        .await
        .expect("connect to the test redis-server")
}

/// Runs each listed case (an `async fn(Redguard)` in the calling module) on a fresh
/// in-memory store (`memory::<case>`) and on its own `redis-server` (`redis::<case>`), whose
/// keys must all have a TTL afterwards: [`conformance!`] for cases that need no Cluster or
/// Sentinel run.
#[macro_export]
macro_rules! on_memory_and_redis {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(::redguard::Redguard::memory()).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let server = $crate::RedisServer::start();
                    let rg = $crate::connect(&server).await;
                    super::$case(rg).await;
                    server.assert_every_key_has_ttl();
                }
            )*
        }
    };
}

/// Runs each listed case (an `async fn(Redguard)` in the calling module) once per store:
/// `memory::<case>` on a fresh in-memory store, `redis::<case>` on its own `redis-server`,
/// `declared::<case>` there with every script checking it touches only keys in `KEYS`
/// ([`declared`]), `cluster::<case>` on its own 3-master, 3-replica Redis Cluster,
/// `sentinel::<case>` through a sentinel to its master; after the Redis runs every key the
/// case wrote must have a TTL.
#[macro_export]
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(::redguard::Redguard::memory()).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let server = $crate::RedisServer::start();
                    let rg = $crate::connect(&server).await;
                    super::$case(rg).await;
                    server.assert_every_key_has_ttl();
                }
            )*
        }
        mod declared {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let server = $crate::RedisServer::start();
                    let rg = $crate::declared::connect(&server).await;
                    super::$case(rg).await;
                    $crate::declared::assert_none_undeclared(&server);
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let cluster = $crate::RedisCluster::start();
                    let rg = cluster.connect().await;
                    super::$case(rg).await;
                    cluster.assert_every_key_has_ttl();
                }
            )*
        }
        mod sentinel {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let sentinel = $crate::RedisSentinel::start_small();
                    let rg = sentinel.connect().await;
                    super::$case(rg).await;
                    sentinel.assert_every_key_has_ttl();
                }
            )*
        }
    };
}

/// A CA and a server certificate for `localhost`/127.0.0.1, written into `dir`.
pub(crate) fn make_test_certificates(dir: &std::path::Path) {
    let run = |args: &[&str]| {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl (install the `openssl` package)");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .expect("write ext.cnf");
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=redguard-test-ca",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("find a free port")
}
