//! Fault injection against a single Redis, one fault per test: a mixed workload (idempotent
//! calls whose executions are counted outside the guard, lock sections doing a non-atomic
//! read-modify-write of a counter, rate-limit checks) runs in several tasks on two handles
//! (two clients, as two instances would have) while Redis is killed, paused, flushed, cut
//! off or out of memory (and, for kill/restart, in two `fault_worker` processes too); holder
//! processes are SIGKILLed; guard keys hold garbage.
//!
//! Every case checks: the degradation policy while Redis cannot answer, no double execution
//! and no lost update while it can, no panic (a panicking task fails the test), every call
//! back within its bound, and the time the same handles take to recover (printed).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redguard::{Error, FailMode, GuardKind, Idempotency, KeyBuilder, Redguard, track_replay};
use redguard_tests::RedisServer;

/// The per-call bound given to the handles.
const TIMEOUT: Duration = Duration::from_millis(200);
/// Scheduling noise allowed on top of a bound on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(400);
const TASKS: usize = 4;
const LEASE: Duration = Duration::from_secs(1);
const LOCK_WAIT: Duration = Duration::from_millis(300);
const IDEM_EXPIRE: Duration = Duration::from_secs(30);
/// How long the same handles may take to work normally again once the fault is gone.
const RECOVERY_BOUND: Duration = Duration::from_secs(10);

async fn handle(server: &RedisServer, modes: &[(GuardKind, FailMode)]) -> Redguard {
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
async fn instances(server: &RedisServer, modes: &[(GuardKind, FailMode)]) -> Vec<Redguard> {
    vec![handle(server, modes).await, handle(server, modes).await]
}

/// What the workload did, counted outside the guards.
#[derive(Debug, Default)]
struct Shared {
    /// Executions of each idempotent intent's body.
    executions: Mutex<HashMap<u64, u32>>,
    next_intent: AtomicU64,
    /// Read-modify-written (non-atomically) inside the lock: loses updates without exclusion.
    counter: AtomicU64,
    sections: AtomicU64,
    inside: AtomicU64,
    overlaps: AtomicU64,
}

impl Shared {
    fn executions(&self, intent: u64) -> u32 {
        let map = self.executions.lock().expect("executions");
        map.get(&intent).copied().unwrap_or(0)
    }
}

/// Outcomes of one phase of the workload.
#[derive(Debug, Default)]
struct Tally {
    intents: Vec<u64>,
    idem_ok: u64,
    idem_replayed: u64,
    idem_in_progress: u64,
    idem_backend: u64,
    lock_ok: u64,
    lock_unprotected: u64,
    lock_backend: u64,
    lock_timeout: u64,
    rate_allowed: u64,
    rate_backend: u64,
    backend_messages: Vec<String>,
    max_idem: Duration,
    max_lock: Duration,
    max_rate: Duration,
}

impl Tally {
    /// The counts, without the intents.
    fn summary(&self) -> String {
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

    fn merge(&mut self, other: Tally) {
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

    fn backend(&mut self, err: &Error) {
        if self.backend_messages.len() < 3 {
            self.backend_messages.push(err.to_string());
        }
    }

    /// Every call came back within its bound: one store call for a rate check and for a
    /// failing lock attempt (or the lock's wait), two for an idempotent call.
    fn assert_bounded(&self, what: &str) {
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
    fn assert_up(&self, shared: &Shared, what: &str) {
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
async fn assert_replayed(rg: &Redguard, shared: &Arc<Shared>, intents: &[u64], what: &str) {
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

fn assert_no_lost_update(shared: &Shared, what: &str) {
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

async fn idempotent_call(
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
        Idempotency::new("faults", key)
            .expire(IDEM_EXPIRE)
            .run(body),
    ))
    .await
}

/// The locked section: a read-modify-write that loses updates unless exclusive. Returns the
/// fence (`None`: ran unprotected, fail-open; such runs may overlap by policy, so they leave
/// the counter alone).
async fn locked_section(rg: &Redguard, shared: &Arc<Shared>) -> Result<Option<u64>, Error> {
    let shared = shared.clone();
    rg.lock("counter")
        .scope("faults")
        .lease(LEASE)
        .wait(LOCK_WAIT)
        .run(async move {
            let fence = redguard::fence();
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
async fn round(rg: &Redguard, other: &Redguard, shared: &Arc<Shared>, tally: &mut Tally) {
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
        .check()
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
async fn run_phase(handles: &[Redguard], shared: &Arc<Shared>, duration: Duration) -> Tally {
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
async fn recover(handles: &[Redguard], shared: &Arc<Shared>, what: &str) -> Duration {
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

fn used_memory(server: &RedisServer) -> u64 {
    let info: String = redis_cmd(server, &["INFO", "memory"]);
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO")
}

/// How many times scripts were loaded (`SCRIPT LOAD`, what the client sends on `NOSCRIPT`).
fn script_loads(server: &RedisServer) -> u64 {
    let info: String = redis_cmd(server, &["INFO", "commandstats"]);
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_script|load:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn redis_cmd<T: redis::FromRedisValue>(server: &RedisServer, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut server.connection())
        .unwrap_or_else(|err| panic!("{args:?}: {err}"))
}

// ---------------------------------------------------------------------------------------
// Redis killed and restarted empty.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_restarted_empty() {
    let mut server = RedisServer::start();
    let handles = instances(&server, &[]).await;
    let shared = Arc::new(Shared::default());
    run_phase(&handles, &shared, Duration::from_millis(300))
        .await
        .assert_up(&shared, "before");

    server.kill();
    let down = run_phase(&handles, &shared, Duration::from_millis(600)).await;
    down.assert_bounded("killed");
    println!("killed: {}", down.summary());
    // Idempotency fails closed: refused, the body never ran. Rate limits fail open: every
    // call was admitted.
    assert_eq!(down.idem_ok, 0, "{}", down.summary());
    assert_eq!(down.idem_backend, 2 * down.intents.len() as u64);
    for intent in &down.intents {
        assert_eq!(shared.executions(*intent), 0);
    }
    assert_eq!(down.rate_allowed, down.intents.len() as u64);
    // Locks fail closed: no section ran. (A waiter queued behind another task of its process
    // may run out of `wait` before its own attempt fails: LockTimeout, also a refusal.)
    assert_eq!(
        down.lock_ok + down.lock_unprotected,
        0,
        "{}",
        down.summary()
    );
    assert!(down.lock_backend > 0, "{}", down.summary());
    assert_eq!(
        down.lock_backend + down.lock_timeout,
        down.intents.len() as u64
    );
    // Alone (no other task of the process queued ahead of it), a refused lock costs one
    // attempt: no wait for the release subscription, which is down too.
    let started = Instant::now();
    let alone = locked_section(&handles[0], &shared).await;
    println!(
        "killed: a lone lock call refused after {:?}",
        started.elapsed()
    );
    assert!(matches!(alone, Err(Error::Backend(_))), "{alone:?}");
    assert!(
        started.elapsed() <= TIMEOUT + SLACK,
        "{:?}",
        started.elapsed()
    );

    // Back, empty (no scripts, no records), on the same port; the same handles.
    server.restart();
    let took = recover(&handles, &shared, "killed").await;
    assert!(took < RECOVERY_BOUND);
    // The empty server knew none of the scripts: the handles loaded them on NOSCRIPT.
    assert!(
        script_loads(&server) >= 3,
        "scripts loaded: {}",
        script_loads(&server)
    );
    run_phase(&handles, &shared, Duration::from_millis(300))
        .await
        .assert_up(&shared, "after restart");
    assert_no_lost_update(&shared, "killed");
    server.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_with_the_policies_reversed() {
    let mut server = RedisServer::start();
    let modes = [
        (GuardKind::Idempotency, FailMode::Open),
        (GuardKind::RateLimit, FailMode::Closed),
        (GuardKind::Lock, FailMode::Open),
    ];
    let handles = instances(&server, &modes).await;
    let shared = Arc::new(Shared::default());
    run_phase(&handles, &shared, Duration::from_millis(200))
        .await
        .assert_up(&shared, "before");

    server.kill();
    let down = run_phase(&handles, &shared, Duration::from_millis(500)).await;
    down.assert_bounded("killed, reversed");
    // Idempotency fails open: every call ran, unrecorded. Rate limits fail closed.
    assert_eq!(
        down.idem_backend + down.idem_in_progress,
        0,
        "{}",
        down.summary()
    );
    assert_eq!(down.idem_ok, 2 * down.intents.len() as u64);
    assert_eq!(
        down.rate_backend,
        down.intents.len() as u64,
        "{}",
        down.summary()
    );
    // Locks fail open: the section ran, unprotected (no fence), unless its turn in the
    // process's local queue came after `wait`.
    assert_eq!(down.lock_ok, 0, "{}", down.summary());
    assert!(down.lock_unprotected > 0, "{}", down.summary());
    assert_eq!(
        down.lock_unprotected + down.lock_timeout,
        down.intents.len() as u64
    );

    server.restart();
    recover(&handles, &shared, "killed, reversed").await;
    run_phase(&handles, &shared, Duration::from_millis(200))
        .await
        .assert_up(&shared, "after restart");
    server.assert_every_key_has_ttl();
}

/// A `fault_worker workload` process: commands on its stdin, answers on its stdout.
struct Worker {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Worker {
    fn spawn(server: &RedisServer, seed: u64) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fault_worker"))
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

    fn send(&mut self, command: &str) {
        let stdin = self.child.stdin.as_mut().expect("worker stdin");
        writeln!(stdin, "{command}").expect("write to the worker");
    }

    /// The answer to the last command, up to `END` (the worker failing fails the test).
    fn answer(&mut self) -> Vec<String> {
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
fn run_workers(
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
fn assert_up_across(
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

#[test]
fn killed_and_restarted_under_two_processes() {
    let mut server = RedisServer::start();
    let mut workers = [Worker::spawn(&server, 7), Worker::spawn(&server, 7919)];
    assert_up_across(&server, &mut workers, 0, 100, "two processes, before");

    server.kill();
    let (ran, tally) = run_workers(&mut workers, 1000, 8);
    println!("two processes, killed: {tally:?}");
    // Idempotency fails closed: no intent ran; rate limits admitted; locks refused every
    // section.
    for intent in 1000..1008 {
        assert_eq!(ran.get(&intent).copied(), None, "intent {intent}");
    }
    assert_eq!(tally["idem_backend"], 16, "{tally:?}");
    assert_eq!(tally["rate_allowed"], 16, "{tally:?}");
    assert_eq!(tally["lock_ok"], 0, "{tally:?}");
    assert_eq!(
        tally["lock_backend"] + tally["lock_timeout"],
        16,
        "{tally:?}"
    );
    // One round: idempotent call (≤ 2 store calls), lock (its wait at most, plus one
    // attempt), rate check.
    let round = 2 * TIMEOUT + Duration::from_millis(500) + 2 * TIMEOUT + SLACK;
    assert!(
        Duration::from_millis(tally["max_ms"]) <= round,
        "slowest round {} ms",
        tally["max_ms"]
    );

    server.restart();
    for worker in workers.iter_mut() {
        worker.send("probe");
    }
    for (i, worker) in workers.iter_mut().enumerate() {
        let answer = worker.answer();
        println!("two processes: process {i}: {answer:?} ms after the restart");
        assert!(
            answer[0].starts_with("RECOVERED"),
            "process {i}: {answer:?}"
        );
    }
    assert_up_across(
        &server,
        &mut workers,
        2000,
        100,
        "two processes, after restart",
    );
    server.assert_every_key_has_ttl();
}

// ---------------------------------------------------------------------------------------
// Redis paused (SIGSTOP) for twice the call timeout.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_for_twice_the_timeout() {
    let server = RedisServer::start();
    let handles = instances(&server, &[]).await;
    let shared = Arc::new(Shared::default());
    let before = run_phase(&handles, &shared, Duration::from_millis(200)).await;
    before.assert_up(&shared, "before");

    let workload = {
        let handles = handles.clone();
        let shared = shared.clone();
        tokio::spawn(async move { run_phase(&handles, &shared, Duration::from_millis(900)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.pause();
    // A probe of our own, so the pause is seen even if a loaded machine keeps the workload's
    // tasks away from their lock calls for the whole pause.
    let probe_started = std::time::Instant::now();
    let probe = handles[0].lock("faults:probe").acquire().await;
    let probe_took = probe_started.elapsed();
    tokio::time::sleep((2 * TIMEOUT).saturating_sub(probe_took)).await;
    server.resume();
    assert!(
        matches!(
            probe,
            Err(Error::Backend(_)) | Err(Error::LockTimeout { .. })
        ),
        "a lock call on a paused Redis: {probe:?}"
    );
    assert!(
        probe_took < TIMEOUT + Duration::from_millis(300),
        "probe took {probe_took:?}"
    );
    let during = workload.await.expect("workload panicked");
    println!("paused: {}", during.summary());
    during.assert_bounded("paused");
    // The pause was seen, and handled by policy: rate limits let calls through, idempotency
    // refused them; no section ran without the lock.
    assert_eq!(during.rate_backend, 0, "rate limits fail open: {during:?}");
    assert!(
        during.idem_backend > 0,
        "idempotency fails closed: {during:?}"
    );
    assert_eq!(during.lock_unprotected, 0);
    // A timed-out begin may still write its record when Redis wakes up; it is undone, and no
    // intent ever runs twice.
    for intent in &during.intents {
        assert!(shared.executions(*intent) <= 1, "intent {intent}");
    }
    assert_no_lost_update(&shared, "paused");

    recover(&handles, &shared, "paused").await;
    assert_replayed(&handles[1], &shared, &before.intents, "paused").await;
    run_phase(&handles, &shared, Duration::from_millis(200))
        .await
        .assert_up(&shared, "after resume");
    server.assert_every_key_has_ttl();
}

// ---------------------------------------------------------------------------------------
// SCRIPT FLUSH, CLIENT KILL, out of memory.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_invisible() {
    let server = RedisServer::start();
    let handles = instances(&server, &[]).await;
    let shared = Arc::new(Shared::default());
    let workload = {
        let handles = handles.clone();
        let shared = shared.clone();
        tokio::spawn(async move { run_phase(&handles, &shared, Duration::from_millis(600)).await })
    };
    let loads = script_loads(&server);
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _: () = redis_cmd(&server, &["SCRIPT", "FLUSH"]);
    }
    let during = workload.await.expect("workload panicked");
    let reloads = script_loads(&server) - loads;
    println!("script flush: {reloads} scripts re-loaded on NOSCRIPT");
    assert!(
        reloads >= 5,
        "NOSCRIPT was never answered by a reload: {reloads}"
    );
    during.assert_bounded("script flush");
    // NOSCRIPT is answered by loading the script and retrying: no call even noticed.
    during.assert_up(&shared, "script flush");
    assert_replayed(&handles[0], &shared, &during.intents, "script flush").await;
    server.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_reconnects() {
    let server = RedisServer::start();
    let handles = instances(&server, &[]).await;
    let shared = Arc::new(Shared::default());
    let before = run_phase(&handles, &shared, Duration::from_millis(200)).await;
    before.assert_up(&shared, "before");
    let workload = {
        let handles = handles.clone();
        let shared = shared.clone();
        tokio::spawn(async move { run_phase(&handles, &shared, Duration::from_millis(600)).await })
    };
    let mut killed = 0;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        killed += redis_cmd::<u64>(&server, &["CLIENT", "KILL", "TYPE", "normal"]);
    }
    let during = workload.await.expect("workload panicked");
    println!(
        "client kill: {killed} connections killed; {}",
        during.summary()
    );
    assert!(killed >= 2, "the handles' connections were not killed");
    during.assert_bounded("client kill");
    // A call cut off is a backend error under its guard's policy: rate limits let it
    // through, idempotency and locks refuse; nothing else, and no intent runs twice.
    assert_eq!(during.rate_backend, 0, "{}", during.summary());
    assert_eq!(during.lock_unprotected, 0, "{}", during.summary());
    assert_no_lost_update(&shared, "client kill");
    for intent in &during.intents {
        assert!(shared.executions(*intent) <= 1, "intent {intent}");
    }

    recover(&handles, &shared, "client kill").await;
    assert_replayed(&handles[1], &shared, &before.intents, "client kill").await;
    run_phase(&handles, &shared, Duration::from_millis(200))
        .await
        .assert_up(&shared, "after client kill");
    server.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_is_a_clear_error() {
    let server = RedisServer::start();
    let handles = instances(&server, &[]).await;
    // A fail-closed rate limit shows the error too.
    let closed = handle(&server, &[(GuardKind::RateLimit, FailMode::Closed)]).await;
    let shared = Arc::new(Shared::default());
    let before = run_phase(&handles, &shared, Duration::from_millis(200)).await;
    before.assert_up(&shared, "before");

    let _: () = redis_cmd(
        &server,
        &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
    );
    // A little above what Redis uses now, so the junk fills it.
    let limit = (used_memory(&server) + 512 * 1024).to_string();
    let _: () = redis_cmd(&server, &["CONFIG", "SET", "maxmemory", &limit]);
    let mut conn = server.connection();
    let junk = "x".repeat(16 * 1024);
    let mut filled = 0;
    let oom = loop {
        let set: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("junk:{filled}"))
            .arg(&junk)
            .arg("EX")
            .arg(600)
            .query(&mut conn);
        match set {
            Ok(()) => filled += 1,
            Err(err) => break err,
        }
        assert!(filled < 1000, "maxmemory 1mb never refused a write");
    };
    assert_eq!(oom.code(), Some("OOM"), "{oom}");
    // Used memory dips under the limit again when a client's query buffer is freed; pin the
    // limit just under what the junk now takes so every write is refused while it lasts.
    let limit = (used_memory(&server) - 64 * 1024).to_string();
    let _: () = redis_cmd(&server, &["CONFIG", "SET", "maxmemory", &limit]);

    let down = run_phase(&handles, &shared, Duration::from_millis(300)).await;
    println!("out of memory after {filled} junk keys: {}", down.summary());
    down.assert_bounded("out of memory");
    assert_eq!(down.idem_ok, 0, "{}", down.summary());
    assert_eq!(down.idem_backend, 2 * down.intents.len() as u64);
    assert_eq!(down.rate_backend, 0, "{}", down.summary());
    assert_eq!(
        down.lock_ok + down.lock_unprotected,
        0,
        "{}",
        down.summary()
    );
    assert!(down.lock_backend > 0, "{}", down.summary());
    assert!(
        down.backend_messages.iter().all(|m| m.contains("OOM")),
        "{:?}",
        down.backend_messages
    );
    // What the error says, through each guard that fails closed.
    let (refused, _) = idempotent_call(&closed, &shared, u64::MAX).await;
    match refused {
        Err(Error::Backend(err)) => assert!(err.to_string().contains("OOM"), "{err}"),
        other => panic!("idempotency, fail-closed, out of memory: {other:?}"),
    }
    assert_eq!(shared.executions(u64::MAX), 0);
    match redguard::limiter("api")
        .scope("faults")
        .on(&closed)
        .rate("100000/s")
        .check()
        .await
    {
        Err(Error::Backend(err)) => assert!(err.to_string().contains("OOM"), "{err}"),
        other => panic!("rate limit, fail-closed, out of memory: {other:?}"),
    }
    match locked_section(&handles[0], &shared).await {
        Err(Error::Backend(err)) => {
            println!("lock, out of memory: {err}");
            assert!(err.to_string().contains("OOM"), "{err}");
        }
        other => panic!("lock, out of memory: {other:?}"),
    }

    let _: () = redis_cmd(&server, &["CONFIG", "SET", "maxmemory", "0"]);

    recover(&handles, &shared, "out of memory").await;
    assert_replayed(&handles[1], &shared, &before.intents, "out of memory").await;
    run_phase(&handles, &shared, Duration::from_millis(200))
        .await
        .assert_up(&shared, "after maxmemory reverted");
    assert_no_lost_update(&shared, "out of memory");
    server.assert_every_key_has_ttl();
}

// ---------------------------------------------------------------------------------------
// Processes SIGKILLed while holding a lock, while inside an idempotent body.

/// Spawns a worker and waits (bounded) for `ready` on its stdout.
fn spawn_until(command: &mut Command, ready: &str) -> Child {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_holder_killed() {
    let server = RedisServer::start();
    let rg = handle(&server, &[]).await;
    let lease = Duration::from_millis(1500);
    let mut holder = spawn_until(
        Command::new(env!("CARGO_BIN_EXE_lock_worker")).args([
            server.url(),
            "hold".into(),
            "crash".into(),
            lease.as_millis().to_string(),
        ]),
        "ACQUIRED",
    );
    // Held by the other process (its watchdog renews it past the lease).
    tokio::time::sleep(lease).await;
    let try_take = || {
        rg.lock("hold:crash")
            .scope("worker")
            .lease(LEASE)
            .try_acquire()
    };
    assert!(
        try_take().await.unwrap().is_none(),
        "the live holder's lock was taken"
    );

    holder.kill().expect("SIGKILL the holder");
    let killed = Instant::now();
    let _ = holder.wait();
    let guard = loop {
        if let Some(guard) = try_take().await.unwrap() {
            break guard;
        }
        assert!(
            killed.elapsed() < lease + Duration::from_secs(1),
            "the dead holder's lock was not free within its lease + 1 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let free_after = killed.elapsed();
    println!("lock of a SIGKILLed holder free after {free_after:?} (lease {lease:?})");
    guard.release().await.unwrap();
    server.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_body_killed() {
    let server = RedisServer::start();
    let rg = handle(&server, &[]).await;
    let expire = Duration::from_secs(2);
    let mut worker = spawn_until(
        Command::new(env!("CARGO_BIN_EXE_fault_worker")).args([
            server.url(),
            "hang".into(),
            "crash".into(),
            expire.as_millis().to_string(),
        ]),
        "RUNNING",
    );
    worker.kill().expect("SIGKILL the worker");
    let killed = Instant::now();
    let _ = worker.wait();

    let key = "redguard:idem:{faults:crash}";
    let runs = Arc::new(AtomicU64::new(0));
    let retry = || {
        let runs = runs.clone();
        let body = KeyBuilder::new().part("intent", "crash").finish().unwrap();
        rg.scope(track_replay(
            Idempotency::new("faults", body)
                .expire(expire)
                .run(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Error>(7)
                }),
        ))
    };
    // Until the record expires: PROCESSING, never SUCCESS; every retry is refused.
    let mut refused = 0;
    loop {
        let status: Option<String> = redis_cmd(&server, &["HGET", key, "status"]);
        match status.as_deref() {
            Some("P") => {}
            None => break,
            other => panic!("the crashed execution's record became {other:?}"),
        }
        match retry().await {
            (Err(Error::InProgress), _) => refused += 1,
            // The record may expire between the HGET and the retry.
            (Ok(7), false) if killed.elapsed() >= expire - Duration::from_millis(100) => break,
            other => panic!("retry while PROCESSING: {other:?}"),
        }
        assert!(
            killed.elapsed() < expire + Duration::from_secs(1),
            "record never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused >= 5, "retries refused while PROCESSING: {refused}");
    println!(
        "record of a SIGKILLed body: {refused} retries refused, expired after {:?}",
        killed.elapsed()
    );
    // Expired: a retry runs exactly once, later ones replay.
    let mut replays = 0;
    for _ in 0..5 {
        let (value, replayed) = retry().await;
        assert_eq!(value.unwrap(), 7);
        replays += u32::from(replayed);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "executions after expiry");
    assert!(replays >= 4, "replays {replays}");
    server.assert_every_key_has_ttl();
}

// ---------------------------------------------------------------------------------------
// Garbage where redguard expects its own data. (Tokens and idempotency records: see
// redis_store.rs and idempotent_redis.rs.)

/// Writes `key` with `commands` (each given a TTL by the caller), runs `check` with a handle
/// whose guards all fail open (the case most tempted to let a call through), and requires
/// `Error::Corrupt` naming `blamed`. The key is cleared before and after.
async fn assert_corrupt<T: std::fmt::Debug>(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_at_lock_keys() {
    let server = RedisServer::start();
    let modes = [(GuardKind::Lock, FailMode::Open)];
    let rg = handle(&server, &modes).await;
    let ran = AtomicU64::new(0);
    let key = "redguard:lock:{faults:counter}";
    let fence = "redguard:lock:{faults:counter}:fence";
    let take = async || {
        rg.lock("counter")
            .scope("faults")
            .lease(LEASE)
            .wait(Duration::from_millis(100))
            .run(async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(())
            })
            .await
    };
    let cases: &[(&str, &str, &[&[&str]])] = &[
        (
            "a string at the lock key",
            key,
            &[&["SET", key, "locked", "EX", "60"]],
        ),
        (
            "a list at the lock key",
            key,
            &[&["RPUSH", key, "a"], &["EXPIRE", key, "60"]],
        ),
        (
            "a hash without an owner at the lock key",
            key,
            &[&["HSET", key, "holder", "me"], &["EXPIRE", key, "60"]],
        ),
        (
            "a lock hash with a nonsense depth",
            key,
            &[
                &[
                    "HSET", key, "owner", "someone", "depth", "lots", "fence", "7",
                ],
                &["EXPIRE", key, "60"],
            ],
        ),
        (
            "a lock hash with a nonsense fence",
            key,
            &[
                &["HSET", key, "owner", "", "depth", "0", "fence", "-"],
                &["EXPIRE", key, "60"],
            ],
        ),
        (
            "a lock hash without a TTL",
            key,
            &[&["HSET", key, "owner", "someone", "depth", "1", "fence", "7"]],
        ),
        (
            "a fencing counter that is not a number",
            fence,
            &[&["SET", fence, "twelve", "EX", "60"]],
        ),
    ];
    for (what, blamed, commands) in cases {
        assert_corrupt(&server, what, blamed, commands, take).await;
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a section ran over garbage");
    // And the key works again once the garbage is gone.
    take().await.unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    server.assert_every_key_has_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_at_rate_keys() {
    let server = RedisServer::start();
    let rg = handle(&server, &[]).await; // rate limits fail open by default
    let key = "redguard:rate:{faults:api}";
    let block = "redguard:rate:{faults:api}:block";
    let cases: &[(&str, &str, &[&[&str]], redguard::Algorithm)] = &[
        (
            "a list at the rate key",
            key,
            &[&["RPUSH", key, "a"], &["EXPIRE", key, "60"]],
            redguard::Algorithm::Gcra,
        ),
        (
            "a set at the rate key",
            key,
            &[&["SADD", key, "a"], &["EXPIRE", key, "60"]],
            redguard::Algorithm::FixedWindow,
        ),
        (
            "a gcra state that is not <tat>:<T>",
            key,
            &[&["SET", key, "soon", "EX", "60"]],
            redguard::Algorithm::Gcra,
        ),
        (
            "a gcra-looking string under another algorithm",
            key,
            &[&["SET", key, "12:ab", "EX", "60"]],
            redguard::Algorithm::SlidingWindow,
        ),
        (
            "a fixed-window count that is not a number",
            key,
            &[
                &["HSET", key, "a", "fw", "w", "1", "n", "many"],
                &["EXPIRE", key, "60"],
            ],
            redguard::Algorithm::FixedWindow,
        ),
        (
            "a token-bucket level that is not a number",
            key,
            &[
                &["HSET", key, "a", "tb", "v", "", "u", "1"],
                &["EXPIRE", key, "60"],
            ],
            redguard::Algorithm::TokenBucket,
        ),
        (
            "a hash with an unknown algorithm tag",
            key,
            &[&["HSET", key, "a", "zz", "n", "1"], &["EXPIRE", key, "60"]],
            redguard::Algorithm::SlidingCounter,
        ),
        (
            "a block deadline that is not a number",
            block,
            &[&["SET", block, "later", "EX", "60"]],
            redguard::Algorithm::Gcra,
        ),
        (
            "a hash at the block key",
            block,
            &[&["HSET", block, "until", "1"], &["EXPIRE", block, "60"]],
            redguard::Algorithm::LeakyBucket,
        ),
    ];
    for (what, blamed, commands, algorithm) in cases {
        // With a penalty, so that the block key is read too (a limit without one never does).
        let limiter = redguard::limiter("api")
            .scope("faults")
            .on(&rg)
            .algorithm(*algorithm)
            .rate("1000/s")
            .block(Duration::from_secs(60));
        assert_corrupt(&server, what, blamed, commands, async || {
            limiter.check().await
        })
        .await;
        // Peeking reads the same state: the same error.
        let _: redis::Value = redis_cmd(&server, commands[0]);
        let peeked = limiter.peek().await;
        assert!(
            matches!(peeked, Err(Error::Corrupt { .. })),
            "{what}: peek {peeked:?}"
        );
        let _: () = redis_cmd(&server, &["FLUSHALL"]);
    }
    // A refusal writes nothing: a limit that rejects with a penalty, decided together with a
    // limit whose key holds garbage, leaves no penalty behind.
    let strict = redguard::limiter("strict")
        .scope("faults")
        .on(&rg)
        .rate("1/h")
        .block(Duration::from_secs(60));
    assert!(strict.check().await.unwrap().allowed);
    let garbage = "redguard:rate:{faults:api}";
    let _: () = redis_cmd(&server, &["SET", garbage, "soon", "EX", "60"]);
    let both = strict.clone().and(
        redguard::limiter("api")
            .scope("faults")
            .on(&rg)
            .rate("1000/s"),
    );
    let refused = both.check().await;
    assert!(matches!(refused, Err(Error::Corrupt { .. })), "{refused:?}");
    let penalty: bool = redis_cmd(&server, &["EXISTS", "redguard:rate:{faults:strict}:block"]);
    assert!(!penalty, "a refused decision wrote a penalty");
    let _: () = redis_cmd(&server, &["FLUSHALL"]);
    // Redguard's own states of every algorithm are still accepted, switching algorithms too.
    for algorithm in redguard::Algorithm::ALL {
        let limiter = redguard::limiter("api")
            .scope("faults")
            .on(&rg)
            .algorithm(algorithm)
            .rate("1000/s");
        assert!(limiter.check().await.unwrap().allowed, "{algorithm}");
        assert!(limiter.check().await.unwrap().allowed, "{algorithm}");
    }
    server.assert_every_key_has_ttl();
}
