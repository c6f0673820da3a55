//! The fault suite's harness (`tests/it/faults.rs`): a mixed workload of idempotent calls
//! (executions counted outside the guard), locked read-modify-writes of a counter and rate
//! checks, run in several tasks on two handles (two instances) and tallied per phase; the
//! `fault_worker` process driver; and the checks every fault case shares.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redguard::{
    Error, Redguard, handle::FailMode, idempotency::track_replay, key::GuardKind, key::KeyBuilder,
};

use crate::RedisServer;

/// The per-call bound given to the handles.
pub const TIMEOUT: Duration = Duration::from_millis(200);
/// Scheduling noise allowed on top of a bound on a loaded 2-core machine.
pub const SLACK: Duration = Duration::from_millis(400);
pub const TASKS: usize = 4;
pub const LEASE: Duration = Duration::from_secs(1);
pub const LOCK_WAIT: Duration = Duration::from_millis(300);
pub const IDEM_EXPIRE: Duration = Duration::from_secs(30);
/// How long the same handles may take to work normally again once the fault is gone.
pub const RECOVERY_BOUND: Duration = Duration::from_secs(10);

pub async fn handle(server: &RedisServer, modes: &[(GuardKind, FailMode)]) -> Redguard {
    let mut builder = Redguard::redis(server.url()).timeout(TIMEOUT);
    for (guard, mode) in modes {
        builder = builder.fail_mode(*guard, *mode);
    }
    builder
        .connect()
        .await
        .expect("connect to the test redis-server")
}

/// Two handles with the same policies: two instances of a service.
pub async fn instances(server: &RedisServer, modes: &[(GuardKind, FailMode)]) -> Vec<Redguard> {
    vec![handle(server, modes).await, handle(server, modes).await]
}

/// What the workload did, counted outside the guards.
#[derive(Debug, Default)]
pub struct Shared {
    /// Executions of each idempotent intent's body.
    pub executions: Mutex<HashMap<u64, u32>>,
    pub next_intent: AtomicU64,
    /// Read-modify-written (non-atomically) inside the lock: loses updates without exclusion.
    pub counter: AtomicU64,
    pub sections: AtomicU64,
    pub inside: AtomicU64,
    pub overlaps: AtomicU64,
}

impl Shared {
    pub fn executions(&self, intent: u64) -> u32 {
        let map = self.executions.lock().expect("executions");
        map.get(&intent).copied().unwrap_or(0)
    }
}

/// Outcomes of one phase of the workload.
#[derive(Debug, Default)]
pub struct Tally {
    pub intents: Vec<u64>,
    pub idem_ok: u64,
    pub idem_replayed: u64,
    pub idem_in_progress: u64,
    pub idem_backend: u64,
    pub lock_ok: u64,
    pub lock_unprotected: u64,
    pub lock_backend: u64,
    pub lock_timeout: u64,
    pub rate_allowed: u64,
    pub rate_backend: u64,
    pub backend_messages: Vec<String>,
    pub max_idem: Duration,
    pub max_lock: Duration,
    pub max_rate: Duration,
}

impl Tally {
    /// The counts, without the intents.
    pub fn summary(&self) -> String {
        format!(
            "{} rounds; idempotent ok {} (replayed {}), in progress {}, backend {}; lock ok {}, \
             unprotected {}, backend {}, timeout {}; rate allowed {}, backend {}; errors {:?}",
            self.intents.len(),
            self.idem_ok,
            self.idem_replayed,
            self.idem_in_progress,
            self.idem_backend,
            self.lock_ok,
            self.lock_unprotected,
            self.lock_backend,
            self.lock_timeout,
            self.rate_allowed,
            self.rate_backend,
            self.backend_messages
        )
    }

    pub fn merge(&mut self, other: Tally) {
        self.intents.extend(other.intents);
        self.idem_ok += other.idem_ok;
        self.idem_replayed += other.idem_replayed;
        self.idem_in_progress += other.idem_in_progress;
        self.idem_backend += other.idem_backend;
        self.lock_ok += other.lock_ok;
        self.lock_unprotected += other.lock_unprotected;
        self.lock_backend += other.lock_backend;
        self.lock_timeout += other.lock_timeout;
        self.rate_allowed += other.rate_allowed;
        self.rate_backend += other.rate_backend;
        for message in other.backend_messages {
            if self.backend_messages.len() < 3 {
                self.backend_messages.push(message);
            }
        }
        self.max_idem = self.max_idem.max(other.max_idem);
        self.max_lock = self.max_lock.max(other.max_lock);
        self.max_rate = self.max_rate.max(other.max_rate);
    }

    pub fn backend(&mut self, err: &Error) {
        if self.backend_messages.len() < 3 {
            self.backend_messages.push(err.to_string());
        }
    }

    /// Every call came back within its bound: one store call for a rate check and for a
    /// failing lock attempt (or the lock's wait), two for an idempotent call.
    pub fn assert_bounded(&self, what: &str) {
        println!(
            "{what}: max latency idempotent {:?}, lock {:?}, rate {:?}",
            self.max_idem, self.max_lock, self.max_rate
        );
        assert!(
            self.max_rate <= TIMEOUT + SLACK,
            "{what}: rate {:?}",
            self.max_rate
        );
        assert!(
            self.max_lock <= LOCK_WAIT.max(TIMEOUT) + TIMEOUT + SLACK,
            "{what}: lock {:?}",
            self.max_lock
        );
        assert!(
            self.max_idem <= 2 * TIMEOUT + SLACK,
            "{what}: idempotent {:?}",
            self.max_idem
        );
    }

    /// Redis up the whole phase: every intent ran exactly once (the second call replayed),
    /// every section was exclusive, every check decided by Redis.
    pub fn assert_up(&self, shared: &Shared, what: &str) {
        assert!(!self.intents.is_empty(), "{what}: no work done");
        for intent in &self.intents {
            assert_eq!(shared.executions(*intent), 1, "{what}: intent {intent}");
        }
        assert_eq!(
            self.idem_ok,
            2 * self.intents.len() as u64,
            "{what}: {}",
            self.summary()
        );
        assert_eq!(
            self.idem_replayed,
            self.intents.len() as u64,
            "{what}: {}",
            self.summary()
        );
        assert_eq!(
            self.lock_ok,
            self.intents.len() as u64,
            "{what}: {}",
            self.summary()
        );
        assert_eq!(self.lock_unprotected, 0, "{what}: {}", self.summary());
        assert_eq!(
            self.rate_allowed,
            self.intents.len() as u64,
            "{what}: {}",
            self.summary()
        );
        assert_no_lost_update(shared, what);
    }
}

/// Records written before a fault that kept Redis's data still answer: each intent replays,
/// none runs again.
pub async fn assert_replayed(rg: &Redguard, shared: &Arc<Shared>, intents: &[u64], what: &str) {
    for intent in intents {
        let (value, replayed) = idempotent_call(rg, shared, *intent).await;
        assert_eq!(value.ok(), Some(intent * 3), "{what}: intent {intent}");
        assert!(replayed, "{what}: intent {intent} was not replayed");
        assert_eq!(
            shared.executions(*intent),
            1,
            "{what}: intent {intent} ran again"
        );
    }
}

pub fn assert_no_lost_update(shared: &Shared, what: &str) {
    assert_eq!(
        shared.overlaps.load(Ordering::SeqCst),
        0,
        "{what}: overlapping sections"
    );
    assert_eq!(
        shared.counter.load(Ordering::SeqCst),
        shared.sections.load(Ordering::SeqCst),
        "{what}: lost updates in the locked read-modify-write"
    );
}

pub async fn idempotent_call(
    rg: &Redguard,
    shared: &Arc<Shared>,
    intent: u64,
) -> (Result<u64, Error>, bool) {
    let key = match KeyBuilder::new()
        .part("intent", &intent.to_string())
        .finish()
    {
        Ok(key) => key,
        Err(err) => return (Err(err), false),
    };
    let shared = shared.clone();
    let body = async move {
        *shared
            .executions
            .lock()
            .expect("executions")
            .entry(intent)
            .or_default() += 1;
        Ok::<u64, Error>(intent * 3)
    };
    rg.scope(track_replay(
        redguard::idempotency(key)
            .scope("faults")
            .expire(IDEM_EXPIRE)
            .run(body),
    ))
    .await
}

/// The locked section: a read-modify-write that loses updates unless exclusive. Returns the
/// fence (`None`: ran unprotected, fail-open; such runs may overlap by policy, so they leave
/// the counter alone).
pub async fn locked_section(rg: &Redguard, shared: &Arc<Shared>) -> Result<Option<u64>, Error> {
    let shared = shared.clone();
    rg.lock("counter")
        .scope("faults")
        .lease(LEASE)
        .wait(LOCK_WAIT)
        .run(async move {
            let fence = redguard::lock::fence();
            if fence.is_none() {
                return Ok(None);
            }
            if shared.inside.fetch_add(1, Ordering::SeqCst) != 0 {
                shared.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            let value = shared.counter.load(Ordering::SeqCst);
            tokio::task::yield_now().await;
            shared.counter.store(value + 1, Ordering::SeqCst);
            shared.sections.fetch_add(1, Ordering::SeqCst);
            shared.inside.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, Error>(fence)
        })
        .await
}

/// One round of the workload on `rg`, the intent sent again through `other`.
pub async fn round(rg: &Redguard, other: &Redguard, shared: &Arc<Shared>, tally: &mut Tally) {
    let intent = shared.next_intent.fetch_add(1, Ordering::SeqCst);
    tally.intents.push(intent);
    for handle in [rg, other] {
        let started = Instant::now();
        let (result, replayed) = idempotent_call(handle, shared, intent).await;
        tally.max_idem = tally.max_idem.max(started.elapsed());
        match result {
            Ok(value) => {
                assert_eq!(value, intent * 3);
                tally.idem_ok += 1;
                tally.idem_replayed += u64::from(replayed);
            }
            Err(Error::InProgress) => tally.idem_in_progress += 1,
            Err(err @ Error::Backend(_)) => {
                tally.idem_backend += 1;
                tally.backend(&err);
            }
            Err(other) => panic!("idempotent call: unexpected {other:?}"),
        }
    }

    let started = Instant::now();
    let locked = locked_section(rg, shared).await;
    tally.max_lock = tally.max_lock.max(started.elapsed());
    match locked {
        Ok(Some(_)) => tally.lock_ok += 1,
        Ok(None) => tally.lock_unprotected += 1,
        Err(err @ Error::Backend(_)) => {
            tally.lock_backend += 1;
            tally.backend(&err);
        }
        Err(Error::LockTimeout { .. }) => tally.lock_timeout += 1,
        Err(other) => panic!("lock: unexpected {other:?}"),
    }

    let started = Instant::now();
    let checked = redguard::limiter("api")
        .scope("faults")
        .on(rg)
        .rate("100000/s")
        .decide()
        .await;
    tally.max_rate = tally.max_rate.max(started.elapsed());
    match checked {
        Ok(decision) => {
            assert!(decision.allowed, "{decision:?}");
            tally.rate_allowed += 1;
        }
        Err(err @ Error::Backend(_)) => {
            tally.rate_backend += 1;
            tally.backend(&err);
        }
        Err(other) => panic!("rate: unexpected {other:?}"),
    }
}

/// Runs the workload in `TASKS` tasks over `handles` for `duration` (at least one round per
/// task). A panicking task fails the test here.
pub async fn run_phase(handles: &[Redguard], shared: &Arc<Shared>, duration: Duration) -> Tally {
    let deadline = Instant::now() + duration;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let rg = handles[t % handles.len()].clone();
            let other = handles[(t + 1) % handles.len()].clone();
            let shared = shared.clone();
            tokio::spawn(async move {
                let mut tally = Tally::default();
                loop {
                    round(&rg, &other, &shared, &mut tally).await;
                    if Instant::now() >= deadline {
                        return tally;
                    }
                }
            })
        })
        .collect();
    let mut total = Tally::default();
    for task in tasks {
        total.merge(task.await.expect("a workload task panicked"));
    }
    total
}

/// Runs single rounds until one is fully decided by Redis on every handle; returns how long
/// that took.
pub async fn recover(handles: &[Redguard], shared: &Arc<Shared>, what: &str) -> Duration {
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < RECOVERY_BOUND,
            "{what}: no recovery within {RECOVERY_BOUND:?}"
        );
        let mut tally = Tally::default();
        for (i, rg) in handles.iter().enumerate() {
            round(rg, &handles[(i + 1) % handles.len()], shared, &mut tally).await;
        }
        let n = handles.len() as u64;
        if tally.idem_replayed == n && tally.lock_ok == n && tally.rate_backend == 0 {
            let took = started.elapsed();
            println!("{what}: recovered in {took:?}");
            return took;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn used_memory(server: &RedisServer) -> u64 {
    let info: String = redis_cmd(server, &["INFO", "memory"]);
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO")
}

/// Redis's count of script calls (`EVALSHA`, and `EVAL` should a script be sent whole).
pub fn script_calls(server: &RedisServer) -> u64 {
    let info: String = redis_cmd(server, &["INFO", "commandstats"]);
    info.lines()
        .filter_map(|line| {
            line.strip_prefix("cmdstat_evalsha:calls=")
                .or_else(|| line.strip_prefix("cmdstat_eval:calls="))
        })
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// How many times scripts were loaded (`SCRIPT LOAD`, what the client sends on `NOSCRIPT`).
pub fn script_loads(server: &RedisServer) -> u64 {
    let info: String = redis_cmd(server, &["INFO", "commandstats"]);
    // Redis 6.2 counts `SCRIPT` as a whole: redguard sends no other subcommand.
    info.lines()
        .find_map(|line| {
            line.strip_prefix("cmdstat_script|load:calls=")
                .or_else(|| line.strip_prefix("cmdstat_script:calls="))
        })
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub fn redis_cmd<T: redis::FromRedisValue>(server: &RedisServer, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut server.connection())
        .unwrap_or_else(|err| panic!("{args:?}: {err}"))
}

/// A `fault_worker workload` process: commands on its stdin, answers on its stdout.
#[derive(Debug)]
pub struct Worker {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Worker {
    pub fn spawn(exe: &str, server: &RedisServer, seed: u64) -> Worker {
        let mut child = Command::new(exe)
            .args([server.url(), "workload".into(), seed.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn fault_worker");
        let stdout = child.stdout.take().expect("worker stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Worker { child, lines }
    }

    pub fn send(&mut self, command: &str) {
        let stdin = self.child.stdin.as_mut().expect("worker stdin");
        writeln!(stdin, "{command}").expect("write to the worker");
    }

    /// The answer to the last command, up to `END` (the worker failing fails the test).
    pub fn answer(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            match self.lines.recv_timeout(Duration::from_secs(30)) {
                Ok(line) if line == "END" => return lines,
                Ok(line) => lines.push(line),
                Err(err) => panic!(
                    "the worker stopped answering ({err}): {:?}",
                    self.child.try_wait()
                ),
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `run <first> <count>` to every worker; returns executions per intent and the summed
/// `TALLY` fields.
pub fn run_workers(
    workers: &mut [Worker],
    first: u64,
    count: u64,
) -> (HashMap<u64, u32>, HashMap<String, u64>) {
    for worker in workers.iter_mut() {
        worker.send(&format!("run {first} {count}"));
    }
    let mut ran: HashMap<u64, u32> = HashMap::new();
    let mut tally: HashMap<String, u64> = HashMap::new();
    for worker in workers.iter_mut() {
        for line in worker.answer() {
            if let Some(intent) = line.strip_prefix("ran ") {
                *ran.entry(intent.parse().expect("intent")).or_default() += 1;
            } else if let Some(fields) = line.strip_prefix("TALLY ") {
                for field in fields.split(' ') {
                    let (name, n) = field.split_once('=').expect("name=n");
                    let n: u64 = n.parse().expect("n");
                    let entry = tally.entry(name.to_owned()).or_default();
                    *entry = if name == "max_ms" {
                        (*entry).max(n)
                    } else {
                        *entry + n
                    };
                }
            } else {
                panic!("unexpected worker line {line:?}");
            }
        }
    }
    (ran, tally)
}

/// Redis up for a whole run of two processes: each intent ran exactly once in total, every
/// section was exclusive (the Redis counter counts them all), nothing degraded.
pub fn assert_up_across(
    server: &RedisServer,
    workers: &mut [Worker],
    first: u64,
    count: u64,
    what: &str,
) {
    let before: Option<u64> = redis_cmd(server, &["GET", "faults:counter"]);
    let (ran, tally) = run_workers(workers, first, count);
    println!("{what}: {tally:?}");
    for intent in first..first + count {
        assert_eq!(
            ran.get(&intent).copied().unwrap_or(0),
            1,
            "{what}: intent {intent}"
        );
    }
    let n = count * workers.len() as u64;
    assert_eq!(tally["idem_ok"], n, "{what}: {tally:?}");
    assert_eq!(tally["idem_replayed"], n - count, "{what}: {tally:?}");
    assert_eq!(tally["lock_ok"], n, "{what}: {tally:?}");
    assert_eq!(tally["rate_allowed"], n, "{what}: {tally:?}");
    let after: Option<u64> = redis_cmd(server, &["GET", "faults:counter"]);
    assert_eq!(
        after.unwrap_or(0) - before.unwrap_or(0),
        n,
        "{what}: lost updates across processes"
    );
}

/// Spawns a worker and waits (bounded) for `ready` on its stdout.
pub fn spawn_until(command: &mut Command, ready: &str) -> Child {
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn a worker");
    let stdout = child.stdout.take().expect("worker stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.starts_with(ready) => return child,
            Ok(_) => {}
            Err(err) => {
                let _ = child.kill();
                panic!("worker never printed {ready:?}: {err}");
            }
        }
    }
}

/// Writes `key` with `commands` (each given a TTL by the caller), runs `check` with a handle
/// whose guards all fail open (the case most tempted to let a call through), and requires
/// `Error::Corrupt` naming `blamed`. The key is cleared before and after.
pub async fn assert_corrupt<T: std::fmt::Debug>(
    server: &RedisServer,
    what: &str,
    blamed: &str,
    commands: &[&[&str]],
    check: impl AsyncFnOnce() -> Result<T, Error>,
) {
    let _: () = redis_cmd(server, &["FLUSHALL"]);
    for command in commands {
        let _: redis::Value = redis_cmd(server, command);
    }
    let started = Instant::now();
    match check().await {
        Err(Error::Corrupt { key, detail }) => {
            assert_eq!(key, blamed, "{what}: {detail}");
            println!("{what}: {}", Error::Corrupt { key, detail });
        }
        other => panic!("{what}: expected Error::Corrupt naming {blamed}, got {other:?}"),
    }
    assert!(
        started.elapsed() < TIMEOUT + SLACK,
        "{what}: {:?}",
        started.elapsed()
    );
    let _: () = redis_cmd(server, &["FLUSHALL"]);
}
