//! One process of the fault-history workload (`tests/tests/histories.rs`): 16 tasks mixing
//! lock-protected read-modify-writes of fenced registers, idempotent calls and rate checks,
//! each operation written to a history file as one [`Event`] line when it completes.
//!
//! ```text
//! history_worker <target> <register-url> <history-file> <process> <seed>
//!     target: redis://host:port/ (a single node, e.g. through the test's proxy) or
//!     cluster:redis://a/,redis://b/,… (seed nodes of a Cluster) or
//!     sentinel:host:port,host:port,… (sentinels monitoring `mymaster`).
//!     Connects, prints `READY`, reads `GO <end µs>` from stdin, runs until that wall-clock
//!     time, finishes the operations under way, writes the history and prints `DONE <ops>`.
//! ```

use std::io::{BufRead as _, BufWriter, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use redguard::__private::store::{RateCheck, RateMode};
use redguard::{Error, GuardKind, Idempotency, Key, Limit, LockKind, Redguard, track_replay};
use redguard_tests::history::{
    Event, IdemOutcome, LEASE, LOCK_KEYS, LockStyle, Outcome, REGISTER_SCRIPT, RateOutcome, SCOPE,
    WAIT, intent_body, limits, lock_body, now_us, rate_body, register_key,
};

const TASKS: u64 = 16;
/// Longest pause between two operations of a task: paces the load to what two cores shared
/// with Redis, the other workers and the test can serve without starving anyone.
const MAX_THINK_MS: u64 = 60;
/// Intents live in 250 ms generations of 4, so calls from every process meet on the same
/// intent at the same time (a few each); some calls retry an intent up to 12 s old, across
/// faults.
const INTENT_GENERATION_MS: u64 = 250;
const INTENTS_PER_GENERATION: u64 = 4;
/// Longer than any run: no record expires while it lasts, so nothing but a fault that
/// loses Redis's data may let an intent run twice.
const IDEM_EXPIRE: Duration = Duration::from_secs(6 * 3600);
/// The register's Redis is never faulted; a call to it that does not answer within this is
/// a broken harness.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// What every task of the process shares.
struct Worker {
    rg: Redguard,
    register: redis::aio::MultiplexedConnection,
    script: redis::Script,
    limits: Vec<(Key, Limit)>,
    process: u64,
    calls: AtomicU64,
    history: mpsc::Sender<String>,
}

impl Worker {
    fn record(&self, event: &Event) {
        // The writer thread outlives every task; a send fails only if it died, which the
        // join at the end reports.
        let _ = self.history.send(event.to_string());
    }

    /// A name for one call, unique in the run.
    fn call_id(&self, task: u64) -> String {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        format!("p{}t{task}n{n}", self.process)
    }

    /// Reads (`write: None`) or writes the register of `key` with `fence`, in a task of its
    /// own: a section cancelled meanwhile cannot stop a call already sent, and its outcome
    /// is recorded all the same.
    async fn register(
        self: &Arc<Self>,
        key: &'static str,
        owner: &str,
        fence: u64,
        write: Option<u64>,
    ) -> (bool, u64) {
        let worker = Arc::clone(self);
        let owner = owner.to_owned();
        let call = tokio::spawn(async move {
            let invoke = now_us();
            let mut conn = worker.register.clone();
            let mut invocation = worker.script.key(register_key(key));
            invocation
                .arg(if write.is_some() { "w" } else { "r" })
                .arg(fence)
                .arg(write.unwrap_or(0));
            let reply: (u64, u64) =
                tokio::time::timeout(REGISTER_TIMEOUT, invocation.invoke_async(&mut conn))
                    .await
                    .expect("the register's Redis answers")
                    .expect("the register script runs");
            let accepted = reply.0 == 1;
            worker.record(&Event::Register {
                key: key.to_owned(),
                owner,
                fence,
                write: write.is_some(),
                invoke,
                complete: now_us(),
                accepted,
                value: reply.1,
            });
            (accepted, reply.1)
        });
        call.await.expect("a register call panicked")
    }
}

/// The section as its holder saw it: entered with a token, left when the body ended
/// (finished or dropped on cancellation).
#[derive(Debug, Default)]
struct Seen {
    entered: Option<u64>,
    left: Option<u64>,
    fence: u64,
}

/// Marks the section left when dropped, whichever way the body ends.
struct Inside(Arc<Mutex<Seen>>);

impl Inside {
    fn enter(seen: &Arc<Mutex<Seen>>, fence: u64) -> Inside {
        let mut s = seen.lock().expect("seen");
        s.entered = Some(now_us());
        s.fence = fence;
        Inside(Arc::clone(seen))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.lock().expect("seen").left = Some(now_us());
    }
}

/// The read-modify-write under the lock: read the register, think, write it plus one.
async fn read_modify_write(
    worker: &Arc<Worker>,
    key: &'static str,
    owner: &str,
    fence: u64,
    think: Duration,
) {
    let (accepted, value) = worker.register(key, owner, fence, None).await;
    if !accepted {
        return;
    }
    tokio::time::sleep(think).await;
    worker.register(key, owner, fence, Some(value + 1)).await;
}

async fn lock_op(worker: &Arc<Worker>, task: u64, rng: &mut fastrand::Rng) {
    let (key, style) = LOCK_KEYS[rng.usize(..LOCK_KEYS.len())];
    let owner = worker.call_id(task);
    // Mostly quick sections; now and then one long enough that faults land inside it; and,
    // rarely, a holder that is not cancelled (a bare guard) thinks past its lease: if Redis
    // stalls meanwhile its key expires, the next holder comes in, and only fencing keeps
    // the stale write out.
    let think = if style == LockStyle::Guard && rng.u32(..150) == 0 {
        LEASE + Duration::from_millis(500)
    } else if rng.u32(..20) == 0 {
        Duration::from_millis(rng.u64(100..=400))
    } else {
        Duration::from_millis(rng.u64(..=3))
    };
    let seen = Arc::new(Mutex::new(Seen::default()));
    let builder = worker
        .rg
        .lock(lock_body(key))
        .scope(SCOPE)
        .lease(LEASE)
        .wait(WAIT);
    let invoke = now_us();
    let result = match style {
        LockStyle::Run | LockStyle::FairRun => {
            let kind = if style == LockStyle::FairRun {
                LockKind::Fair
            } else {
                LockKind::Exclusive
            };
            builder
                .kind(kind)
                .run(async {
                    let fence = redguard::fence().expect("a held lock has a token");
                    let _inside = Inside::enter(&seen, fence);
                    read_modify_write(worker, key, &owner, fence, think).await;
                    Ok::<(), Error>(())
                })
                .await
        }
        LockStyle::Guard => match builder.acquire().await {
            Ok(guard) => {
                let inside = Inside::enter(&seen, guard.fence());
                read_modify_write(worker, key, &owner, guard.fence(), think).await;
                drop(inside);
                guard.release().await
            }
            Err(err) => Err(err),
        },
    };
    let outcome = match result {
        Ok(()) => Outcome::Ok,
        Err(Error::LockTimeout { .. }) => Outcome::Timeout,
        Err(Error::Backend(_)) => Outcome::Backend,
        Err(Error::LockLost { .. }) => Outcome::Lost,
        Err(other) => Outcome::Unexpected(other.to_string()),
    };
    let seen = seen.lock().expect("seen");
    worker.record(&Event::Lock {
        key: key.to_owned(),
        owner,
        invoke,
        entered: seen.entered,
        left: seen.left,
        fence: seen.fence,
        lease_ms: u64::try_from(LEASE.as_millis()).expect("lease in ms"),
        outcome,
    });
}

async fn idem_op(worker: &Arc<Worker>, task: u64, rng: &mut fastrand::Rng) {
    let generation = now_us() / 1000 / INTENT_GENERATION_MS;
    let generation = if rng.u32(..5) == 0 {
        generation.saturating_sub(rng.u64(1..=50))
    } else {
        generation
    };
    let intent = generation * INTENTS_PER_GENERATION + rng.u64(..INTENTS_PER_GENERATION);
    let call = worker.call_id(task);
    // Some bodies are slow, so that other calls find them in progress.
    let work = if rng.u32(..8) == 0 {
        Duration::from_millis(rng.u64(100..=500))
    } else {
        Duration::from_millis(rng.u64(..=20))
    };
    let key = intent_body(intent);
    let invoke = now_us();
    let body = async {
        worker.record(&Event::Exec {
            intent,
            call: call.clone(),
            invoke,
            start: now_us(),
        });
        tokio::time::sleep(work).await;
        Ok::<u64, Error>(intent * 7)
    };
    let guarded = Idempotency::new(SCOPE, key).expire(IDEM_EXPIRE).run(body);
    let (result, replayed) = worker.rg.scope(track_replay(guarded)).await;
    let outcome = match result {
        Ok(value) if replayed => IdemOutcome::Replayed(value),
        Ok(value) => IdemOutcome::Ran(value),
        Err(Error::InProgress) => IdemOutcome::InProgress,
        Err(Error::Backend(_)) => IdemOutcome::Backend,
        Err(other) => IdemOutcome::Unexpected(other.to_string()),
    };
    worker.record(&Event::Idem {
        intent,
        call,
        invoke,
        complete: now_us(),
        outcome,
    });
}

async fn rate_op(worker: &Arc<Worker>, rng: &mut fastrand::Rng) {
    let (key, limit) = &worker.limits[rng.usize(..worker.limits.len())];
    let checks = [RateCheck { key, limit }];
    let invoke = now_us();
    // The store's own answer, with the Redis time it decided at (the limiter API would fail
    // open on an error, admitting what Redis never counted).
    let outcome = match redguard::__private::store::of(&worker.rg)
        .rate_check(&checks, RateMode::Consume)
        .await
    {
        Ok(outcome) if outcome.allowed() => {
            RateOutcome::Admitted(u64::try_from(outcome.now.as_micros()).expect("Redis time in µs"))
        }
        Ok(_) => RateOutcome::Rejected,
        Err(_) => RateOutcome::Error,
    };
    worker.record(&Event::Rate {
        algorithm: limit.algorithm(),
        invoke,
        complete: now_us(),
        outcome,
    });
}

async fn task(worker: Arc<Worker>, task: u64, seed: u64, end: u64) -> u64 {
    let mut rng = fastrand::Rng::with_seed(seed ^ (task << 32) ^ worker.process);
    let mut ops = 0;
    while now_us() < end {
        match rng.u32(..10) {
            0..=3 => lock_op(&worker, task, &mut rng).await,
            4..=6 => idem_op(&worker, task, &mut rng).await,
            _ => rate_op(&worker, &mut rng).await,
        }
        ops += 1;
        tokio::time::sleep(Duration::from_millis(rng.u64(..=MAX_THINK_MS))).await;
    }
    ops
}

async fn connect(target: &str) -> Redguard {
    let builder = if let Some(nodes) = target.strip_prefix("cluster:") {
        Redguard::redis_cluster(nodes.split(','))
    } else if let Some(sentinels) = target.strip_prefix("sentinel:") {
        Redguard::redis_sentinel(sentinels.split(','), redguard_tests::sentinel::MASTER_NAME).into()
    } else {
        Redguard::redis(target)
    };
    builder.connect().await.expect("connect to Redis")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [target, register_url, path, process, seed] = args.as_slice() else {
        panic!("usage: history_worker <target> <register-url> <history-file> <process> <seed>");
    };
    let process: u64 = process.parse().expect("process number");
    let seed: u64 = seed.parse().expect("seed");
    let rg = connect(target).await;
    // The client's own bounds too: its default 500 ms reply timeout is shorter than what a
    // loaded machine can take, and a write whose outcome is unknown would blur the effects.
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(REGISTER_TIMEOUT))
        .set_response_timeout(Some(REGISTER_TIMEOUT));
    let register = redis::Client::open(register_url.as_str())
        .expect("register url")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect to the register's Redis");
    let limits = limits()
        .into_iter()
        .map(|limit| {
            let key = rg
                .key(GuardKind::RateLimit, SCOPE, &rate_body(limit.algorithm()))
                .expect("a rate key");
            (key, limit)
        })
        .collect();
    let (history, lines) = mpsc::channel::<String>();
    let file = std::fs::File::create(path).expect("create the history file");
    // One thread writes the file, so no task ever blocks on it.
    let writer = std::thread::spawn(move || {
        let mut out = BufWriter::new(file);
        for line in lines {
            writeln!(out, "{line}").expect("write the history");
        }
        out.flush().expect("flush the history");
    });
    let worker = Arc::new(Worker {
        rg,
        register,
        script: redis::Script::new(REGISTER_SCRIPT),
        limits,
        process,
        calls: AtomicU64::new(0),
        history,
    });
    println!("READY");
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .expect("read GO");
    let end: u64 = line
        .strip_prefix("GO ")
        .and_then(|end| end.trim().parse().ok())
        .expect("GO <end µs>");
    let tasks: Vec<_> = (0..TASKS)
        .map(|n| tokio::spawn(task(Arc::clone(&worker), n, seed, end)))
        .collect();
    let mut ops = 0;
    for task in tasks {
        ops += task.await.expect("a workload task panicked");
    }
    // Register calls spawned by cancelled sections still hold the worker; give them their
    // bound to finish, then close the history.
    let deadline = tokio::time::Instant::now() + REGISTER_TIMEOUT;
    let mut shared = worker;
    let worker = loop {
        match Arc::try_unwrap(shared) {
            Ok(worker) => break worker,
            Err(again) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "register calls still running {REGISTER_TIMEOUT:?} after the end"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
                shared = again;
            }
        }
    };
    drop(worker);
    writer.join().expect("the history writer panicked");
    println!("DONE {ops}");
}
