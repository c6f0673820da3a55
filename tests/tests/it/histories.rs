//! Fault histories, checked (issue 13, part 3): 4 `history_worker` processes × 16 tasks run
//! lock-protected read-modify-writes of fenced registers, idempotent calls and rate checks
//! while the test injects faults, records when, and hands every worker's history to the
//! checker (`redguard_tests::history`), which must find no violation.
//!
//! - `single_node_*`: one Redis, reached through the harness's TCP proxy; faults: SIGSTOP /
//!   SIGCONT, kill and restart empty, `CLIENT KILL`, `CLIENT PAUSE`, and through the proxy
//!   added latency, a partition (blackhole), a half-open connection (replies held) and
//!   connection resets.
//! - `cluster_*`: a 3-master Redis Cluster, reached directly (a Cluster client learns node
//!   addresses from the cluster itself, so a proxy would need every node to announce the
//!   proxy's address; the network faults run on the single node instead); faults: `CLIENT
//!   KILL`, `CLIENT PAUSE` of a master, a master stalled past the node timeout (its replica
//!   takes over), a manual failover, a master killed, and a failover that loses the last
//!   writes (the replica cut off first), each on the master of a lock key.
//!
//! - `sentinel_*`: a master, two replicas and three sentinels, reached through the sentinels;
//!   faults: `CLIENT KILL`, `CLIENT PAUSE` of the master, a planned `SENTINEL FAILOVER`, the
//!   master killed, and the master stalled past `down-after-milliseconds` (a replica takes
//!   over while it is frozen).
//!
//! Each runs `REDGUARD_HISTORY_SECS` seconds (default 30; `REDGUARD_HISTORY_SECS=600` for the
//! long run, see TESTING.md); `REDGUARD_HISTORY_SEED` fixes the schedule's random choices
//! (printed on every run).

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use redguard::key::GuardKind;
use redguard_tests::history::{self, FaultSpan, History, LOCK_KEYS, Loss, now_us};
use redguard_tests::proxy::{Fault, Proxy};
use redguard_tests::{RedisCluster, RedisSentinel, RedisServer};

const PROCESSES: u64 = 4;
/// No fault starts this close to the end, so the last operations meet a healed Redis.
const QUIET_END: Duration = Duration::from_secs(2);

fn run_length() -> Duration {
    let secs = std::env::var("REDGUARD_HISTORY_SECS")
        .ok()
        .map(|secs| secs.parse().expect("REDGUARD_HISTORY_SECS: whole seconds"))
        .unwrap_or(30);
    Duration::from_secs(secs)
}

fn seed() -> u64 {
    std::env::var("REDGUARD_HISTORY_SEED")
        .ok()
        .map(|seed| seed.parse().expect("REDGUARD_HISTORY_SEED: an integer"))
        .unwrap_or_else(now_us)
}

/// The worker processes of one run; killed if the test fails before they finish.
struct Workers {
    children: Vec<(Child, ChildStdin, BufReader<ChildStdout>)>,
    files: Vec<PathBuf>,
}

impl Workers {
    /// Starts the workers on `target` and waits until each is connected.
    fn spawn(target: &str, register: &RedisServer, dir: &Path, seed: u64) -> Workers {
        let mut workers = Workers {
            children: Vec::new(),
            files: Vec::new(),
        };
        for process in 0..PROCESSES {
            let file = dir.join(format!("history-{process}.log"));
            let mut child = Command::new(env!("CARGO_BIN_EXE_history_worker"))
                .arg(target)
                .arg(register.url())
                .arg(&file)
                .arg(process.to_string())
                .arg(seed.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn history_worker");
            let stdin = child.stdin.take().expect("worker stdin");
            let stdout = BufReader::new(child.stdout.take().expect("worker stdout"));
            workers.children.push((child, stdin, stdout));
            workers.files.push(file);
        }
        for (_, _, stdout) in &mut workers.children {
            assert_eq!(read_line(stdout), "READY");
        }
        workers
    }

    /// Lets every worker run until `end` (µs, [`now_us`]).
    fn go(&mut self, end: u64) {
        for (_, stdin, _) in &mut self.children {
            writeln!(stdin, "GO {end}").expect("start a worker");
        }
    }

    /// Waits for every worker to finish; the operations they report.
    fn finish(&mut self) -> u64 {
        let mut ops = 0;
        for (mut child, _, mut stdout) in self.children.drain(..) {
            let done = read_line(&mut stdout);
            let status = child.wait().expect("reap a worker");
            assert!(status.success(), "a worker failed: {status}");
            ops += done
                .strip_prefix("DONE ")
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("worker said {done:?}"));
        }
        ops
    }

    /// Every event of every worker.
    fn events(&self) -> Vec<history::Event> {
        let mut events = Vec::new();
        for file in &self.files {
            let text = std::fs::read_to_string(file).expect("read a history");
            for line in text.lines() {
                events.push(line.parse().unwrap_or_else(|err| panic!("{err}")));
            }
        }
        events
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for (child, _, _) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn read_line(stdout: &mut BufReader<ChildStdout>) -> String {
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read a worker's stdout");
    line.trim().to_owned()
}

/// The final value of every register (0 for one never written).
fn registers(register: &RedisServer) -> std::collections::BTreeMap<String, u64> {
    let mut conn = connection(register);
    LOCK_KEYS
        .iter()
        .map(|(key, _)| {
            let value: Option<u64> = redis::cmd("HGET")
                .arg(history::register_key(key))
                .arg("value")
                .query(&mut conn)
                .expect("HGET a register");
            ((*key).to_owned(), value.unwrap_or(0))
        })
        .collect()
}

/// A connection to `server` on which every call gives up after a few seconds: a Redis that
/// stopped answering must fail the test, not hang it.
fn connection(server: &RedisServer) -> redis::Connection {
    const BOUND: Duration = Duration::from_secs(5);
    let conn = redis::Client::open(server.url())
        .and_then(|client| client.get_connection_with_timeout(BOUND))
        .expect("connect to a test redis-server");
    conn.set_read_timeout(Some(BOUND)).expect("read timeout");
    conn.set_write_timeout(Some(BOUND)).expect("write timeout");
    conn
}

fn command(server: &RedisServer, args: &[&str]) {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query::<redis::Value>(&mut connection(server))
        .unwrap_or_else(|err| panic!("{args:?}: {err}"));
}

fn millis(rng: &mut fastrand::Rng, range: std::ops::RangeInclusive<u64>) -> Duration {
    Duration::from_millis(rng.u64(range))
}

/// Runs `inject` over and over (each call one fault, healed before it returns) until
/// [`QUIET_END`] before `end`, with a quiet gap after each.
fn schedule(
    end: u64,
    rng: &mut fastrand::Rng,
    mut inject: impl FnMut(&mut fastrand::Rng) -> FaultSpan,
) -> Vec<FaultSpan> {
    let mut faults = Vec::new();
    let stop = end - u64::try_from(QUIET_END.as_micros()).expect("µs");
    while now_us() < stop {
        let fault = inject(rng);
        println!(
            "fault {} at {} for {} ms{}",
            fault.kind,
            fault.start,
            (fault.end - fault.start) / 1000,
            if fault.loss == Loss::Nothing {
                ""
            } else {
                " (data may be lost)"
            }
        );
        faults.push(fault);
        std::thread::sleep(millis(rng, 200..=1000));
    }
    faults
}

/// A fault that lasts while `during` runs.
fn span(kind: &str, loss: Loss, during: impl FnOnce()) -> FaultSpan {
    let start = now_us();
    during();
    FaultSpan {
        kind: kind.to_owned(),
        start,
        end: now_us(),
        loss,
    }
}

/// One run of the workload: worker processes against `target`, their register server, and
/// the window they run in.
struct Run {
    register: RedisServer,
    dir: tempfile::TempDir,
    workers: Workers,
    started: Instant,
    window: (u64, u64),
}

impl Run {
    /// Starts the workers against `target` for [`run_length`] from now.
    fn start(target: &str, seed: u64) -> Run {
        let register = RedisServer::start();
        let dir = tempfile::tempdir().expect("temp dir");
        let mut workers = Workers::spawn(target, &register, dir.path(), seed);
        let started = Instant::now();
        let start = now_us();
        let end = start + u64::try_from(run_length().as_micros()).expect("µs");
        workers.go(end);
        Run {
            register,
            dir,
            workers,
            started,
            window: (start, end),
        }
    }

    /// Faults until the quiet end of the run: `inject(rng, kind)` injects and heals one of
    /// `kinds` kinds; each round injects every kind once, in a new order.
    fn faults(
        &self,
        rng: &mut fastrand::Rng,
        kinds: usize,
        mut inject: impl FnMut(&mut fastrand::Rng, usize) -> FaultSpan,
    ) -> Vec<FaultSpan> {
        let mut round: Vec<usize> = Vec::new();
        schedule(self.window.1, rng, |rng| {
            if round.is_empty() {
                round = (0..kinds).collect();
                rng.shuffle(&mut round);
            }
            inject(rng, round.pop().expect("a fault"))
        })
    }

    /// Collects, checks and prints the run; fails the test on any violation.
    fn check(mut self, name: &str, faults: Vec<FaultSpan>) {
        let ops = self.workers.finish();
        let history = History {
            run: self.window,
            events: self.workers.events(),
            faults,
            registers: registers(&self.register),
        };
        let report = history::check(&history);
        println!(
            "{name}: {PROCESSES} processes × 16 tasks, {ops} workload operations in {:?}\n{report}",
            self.started.elapsed()
        );
        if !report.violations.is_empty() {
            // Kept for reading: the lines of the operations the violations name.
            panic!(
                "{name}: {report}\nhistories kept in {}",
                self.dir.keep().display()
            );
        }
        self.register.assert_every_key_has_ttl();
    }
}

#[test]
fn single_node_through_process_and_network_faults() {
    let seed = seed();
    println!("REDGUARD_HISTORY_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let run = Run::start(&proxy.url(), seed);
    let faults = run.faults(&mut rng, 8, |rng, kind| {
        match kind {
            0 => span("sigstop", Loss::Nothing, || {
                server.pause();
                std::thread::sleep(millis(rng, 300..=2500));
                server.resume();
            }),
            1 => span("kill-restart", Loss::Everything, || {
                server.kill();
                std::thread::sleep(millis(rng, 0..=500));
                server.restart();
            }),
            2 => span("client-kill", Loss::Nothing, || {
                command(&server, &["CLIENT", "KILL", "TYPE", "normal"]);
                command(&server, &["CLIENT", "KILL", "TYPE", "pubsub"]);
            }),
            3 => span("client-pause", Loss::Nothing, || {
                let pause = millis(rng, 300..=1500);
                let ms = pause.as_millis().to_string();
                command(&server, &["CLIENT", "PAUSE", &ms, "ALL"]);
                std::thread::sleep(pause);
            }),
            4 => span("proxy-latency", Loss::Nothing, || {
                proxy.set(Fault::Latency(millis(rng, 20..=300)));
                std::thread::sleep(millis(rng, 500..=2000));
                proxy.set(Fault::Pass);
            }),
            5 => span("proxy-blackhole", Loss::Nothing, || {
                proxy.set(Fault::Blackhole);
                std::thread::sleep(millis(rng, 300..=2500));
                // A long partition ends with connections reset (TCP gave up) or not.
                if rng.bool() {
                    proxy.reset();
                }
                proxy.set(Fault::Pass);
            }),
            6 => span("proxy-half-open", Loss::Nothing, || {
                proxy.set(Fault::HalfOpen);
                std::thread::sleep(millis(rng, 300..=2500));
                if rng.bool() {
                    proxy.reset();
                }
                proxy.set(Fault::Pass);
            }),
            _ => span("proxy-reset", Loss::Nothing, || proxy.reset()),
        }
    });
    run.check("single node", faults);
    server.assert_every_key_has_ttl();
}

/// The hash slots master `index` serves, as ranges.
fn slots_of(cluster: &mut RedisCluster, index: usize) -> Vec<(u16, u16)> {
    let node = cluster.node(index);
    let port = i64::from(node.port());
    let reply: redis::Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut connection(node))
        .expect("CLUSTER SLOTS");
    let redis::Value::Array(ranges) = reply else {
        panic!("unexpected CLUSTER SLOTS reply {reply:?}");
    };
    // Each range: [first, last, [master host, master port, id], replicas...].
    ranges
        .iter()
        .filter_map(|range| match range {
            redis::Value::Array(fields) => match (&fields[0], &fields[1], &fields[2]) {
                (
                    redis::Value::Int(first),
                    redis::Value::Int(last),
                    redis::Value::Array(master),
                ) if master.get(1) == Some(&redis::Value::Int(port)) => Some((
                    u16::try_from(*first).expect("a slot"),
                    u16::try_from(*last).expect("a slot"),
                )),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Waits until `key` is served by a master other than `old`.
fn wait_for_new_master(cluster: &RedisCluster, key: &str, old: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster.master_of(key) == old {
        assert!(Instant::now() < deadline, "no failover within 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn cluster_through_failovers() {
    let seed = seed();
    println!("REDGUARD_HISTORY_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut cluster = RedisCluster::start();
    // The checker computes the slot of every key to know what a failover may have lost.
    for (name, _) in LOCK_KEYS {
        let key = history::store_key(GuardKind::Lock, &history::lock_body(name));
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query(&mut connection(cluster.node(0)))
            .expect("CLUSTER KEYSLOT");
        assert_eq!(history::slot(&key), slot, "{key}");
    }
    let run = Run::start(&format!("cluster:{}", cluster.urls().join(",")), seed);
    let faults = run.faults(&mut rng, 6, |rng, kind| {
        let name = LOCK_KEYS[rng.usize(..LOCK_KEYS.len())].0;
        let key = history::store_key(GuardKind::Lock, &history::lock_body(name));
        let master = cluster.master_of(&key);
        let slots = slots_of(&mut cluster, master);
        let fault = match kind {
            0 => span("client-kill", Loss::Nothing, || {
                for index in 0..6 {
                    let node = cluster.node(index);
                    if node.pid().is_some() {
                        command(node, &["CLIENT", "KILL", "TYPE", "normal"]);
                        command(node, &["CLIENT", "KILL", "TYPE", "pubsub"]);
                    }
                }
            }),
            1 => span("client-pause-master", Loss::Nothing, || {
                let pause = millis(rng, 300..=800);
                let ms = pause.as_millis().to_string();
                command(cluster.node(master), &["CLIENT", "PAUSE", &ms, "ALL"]);
                std::thread::sleep(pause);
            }),
            // Past the node timeout: the replica takes over while the old master is frozen,
            // with whatever it had replicated.
            2 => span(
                "sigstop-master-failover",
                Loss::Slots(slots.clone()),
                || {
                    cluster.node(master).pause();
                    std::thread::sleep(millis(rng, 2500..=3500));
                    cluster.node(master).resume();
                },
            ),
            3 => span("manual-failover", Loss::Nothing, || {
                let replica = cluster.replica_of(master);
                command(cluster.node(replica), &["CLUSTER", "FAILOVER"]);
                wait_for_new_master(&cluster, &key, master);
            }),
            4 => span("kill-master", Loss::Slots(slots.clone()), || {
                cluster.node(master).kill();
                wait_for_new_master(&cluster, &key, master);
                cluster.node(master).restart();
            }),
            // The replica misses the master's last writes, then the master dies.
            _ => span("lossy-failover", Loss::Slots(slots), || {
                let replica = cluster.replica_of(master);
                cluster.node(replica).pause();
                command(cluster.node(master), &["CLIENT", "KILL", "TYPE", "replica"]);
                std::thread::sleep(millis(rng, 300..=800));
                cluster.node(master).kill();
                cluster.node(replica).resume();
                wait_for_new_master(&cluster, &key, master);
                cluster.node(master).restart();
            }),
        };
        // Every node back and in sync before the next fault, so each starts from a whole
        // cluster (the heal time shows in the fault's span).
        cluster.wait_until_ok(Duration::from_secs(30));
        FaultSpan {
            end: now_us(),
            ..fault
        }
    });
    run.check("cluster", faults);
    cluster.assert_every_key_has_ttl();
}

#[test]
fn sentinel_through_failovers() {
    let seed = seed();
    println!("REDGUARD_HISTORY_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut sentinel = RedisSentinel::start();
    let target = format!("sentinel:{}", sentinel.sentinel_addrs().join(","));
    let run = Run::start(&target, seed);
    let faults = run.faults(&mut rng, 5, |rng, kind| {
        let master = sentinel.master();
        let fault = match kind {
            0 => span("client-kill", Loss::Nothing, || {
                let node = sentinel.node(master);
                command(node, &["CLIENT", "KILL", "TYPE", "normal"]);
                command(node, &["CLIENT", "KILL", "TYPE", "pubsub"]);
            }),
            1 => span("client-pause-master", Loss::Nothing, || {
                let pause = millis(rng, 300..=800);
                let ms = pause.as_millis().to_string();
                command(sentinel.node(master), &["CLIENT", "PAUSE", &ms, "ALL"]);
                std::thread::sleep(pause);
            }),
            // Writes stop going to the old master when the replica is selected; one in flight
            // at that instant may still be lost, so the checker is told so.
            2 => span("sentinel-failover", Loss::Everything, || {
                sentinel.failover();
                sentinel.wait_for_promotion(master);
            }),
            3 => span("kill-master", Loss::Everything, || {
                sentinel.kill_master();
                sentinel.wait_for_promotion(master);
                sentinel.node(master).restart();
            }),
            // Past down-after-milliseconds: a replica takes over while the master is frozen.
            _ => span("sigstop-master-failover", Loss::Everything, || {
                sentinel.node(master).pause();
                sentinel.wait_for_promotion(master);
                sentinel.node(master).resume();
            }),
        };
        // Every node back and in sync (the old master a replica of the new one) before the
        // next fault.
        sentinel.wait_until_ready(Duration::from_secs(30));
        FaultSpan {
            end: now_us(),
            ..fault
        }
    });
    run.check("sentinel", faults);
    sentinel.assert_every_key_has_ttl();
}
