//! A process of the fault suite (`tests/tests/faults.rs`), driven by its stdin.
//!
//! ```text
//! fault_worker <redis-url> hang <intent> <expire-ms>
//!     enters the idempotent body of `faults:<intent>` (record expiring after <expire-ms>),
//!     prints `RUNNING` from inside it and sleeps until killed.
//! fault_worker <redis-url> workload <seed>
//!     reads commands from stdin, one a line, answering each with lines ending in `END`:
//!     `run <first> <count>`: 4 tasks take the intents first..first+count in a shuffled order;
//!         per intent an idempotent call (printing `ran <intent>` from the body; InProgress
//!         retried for up to 2 s), a locked non-atomic read-modify-write of the Redis key
//!         `faults:counter`, a rate-limit check; then `TALLY <name>=<n> ...`.
//!     `probe`: until a lock is taken through Redis (10 s at most): `RECOVERED <ms>`.
//! ```

use std::fmt::Write as _;
use std::io::BufRead as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redguard::{Error, Idempotency, KeyBuilder, Redguard, track_replay};
use redis::AsyncCommands as _;
use redis::aio::ConnectionManager;

const TIMEOUT: Duration = Duration::from_millis(200);
const TASKS: usize = 4;

#[derive(Debug, Default)]
struct Tally {
    idem_ok: u64,
    idem_replayed: u64,
    idem_in_progress: u64,
    idem_backend: u64,
    lock_ok: u64,
    lock_backend: u64,
    lock_timeout: u64,
    rate_allowed: u64,
    rate_backend: u64,
    max_ms: u64,
}

fn backend(op: &'static str) -> impl Fn(redis::RedisError) -> Error {
    move |source| {
        let source = redguard::StoreFailure::new(source);
        redguard::BackendError::Failed { op, source }.into()
    }
}

/// The locked section: GET, yield, SET of one counter; loses updates unless exclusive.
async fn section(conn: &mut ConnectionManager) -> Result<(), Error> {
    let value: Option<u64> = conn.get("faults:counter").await.map_err(backend("get"))?;
    tokio::task::yield_now().await;
    conn.set_ex::<_, _, ()>("faults:counter", value.unwrap_or(0) + 1, 600)
        .await
        .map_err(backend("set"))
}

async fn one(
    rg: &Redguard,
    conn: &mut ConnectionManager,
    intent: u64,
    out: &Mutex<String>,
    tally: &mut Tally,
) {
    let started = Instant::now();
    let retry_until = started + Duration::from_secs(2);
    loop {
        let key = KeyBuilder::new()
            .part("intent", &intent.to_string())
            .finish()
            .expect("key");
        let call = Idempotency::new("faults-mp", key)
            .expire(Duration::from_secs(30))
            .run(async {
                writeln!(out.lock().expect("out"), "ran {intent}").expect("write");
                Ok::<u64, Error>(intent * 3)
            });
        match rg.scope(track_replay(call)).await {
            (Ok(value), replayed) => {
                assert_eq!(value, intent * 3);
                tally.idem_ok += 1;
                tally.idem_replayed += u64::from(replayed);
                break;
            }
            (Err(Error::InProgress), _) if Instant::now() < retry_until => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (Err(Error::InProgress), _) => {
                tally.idem_in_progress += 1;
                break;
            }
            (Err(Error::Backend(_)), _) => {
                tally.idem_backend += 1;
                break;
            }
            (Err(other), _) => panic!("idempotent call: {other:?}"),
        }
    }
    let mut conn = conn.clone();
    let locked = rg
        .lock("counter")
        .scope("faults-mp")
        .lease(Duration::from_secs(1))
        .wait(Duration::from_millis(500))
        .run(async move {
            tokio::time::timeout(TIMEOUT, section(&mut conn))
                .await
                .map_err(|_| Error::Timeout { after: TIMEOUT })?
        })
        .await;
    match locked {
        Ok(()) => tally.lock_ok += 1,
        Err(Error::Backend(_)) => tally.lock_backend += 1,
        Err(Error::LockTimeout { .. }) => tally.lock_timeout += 1,
        Err(other) => panic!("lock: {other:?}"),
    }
    match redguard::limiter("api")
        .scope("faults-mp")
        .on(rg)
        .rate("100000/s")
        .decide()
        .await
    {
        Ok(decision) => {
            assert!(decision.allowed);
            tally.rate_allowed += 1;
        }
        Err(Error::Backend(_)) => tally.rate_backend += 1,
        Err(other) => panic!("rate: {other:?}"),
    }
}

/// xorshift: enough to shuffle, no dependency.
fn shuffled(first: u64, count: u64, seed: u64) -> Vec<u64> {
    let mut state = seed | 1;
    let mut intents: Vec<u64> = (first..first + count).collect();
    for i in (1..intents.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let j = (state % (i as u64 + 1)) as usize;
        intents.swap(i, j);
    }
    intents
}

async fn run(rg: &Redguard, conn: &ConnectionManager, intents: Vec<u64>) -> String {
    let queue = Arc::new(Mutex::new(intents));
    let out = Arc::new(Mutex::new(String::new()));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (rg, mut conn) = (rg.clone(), conn.clone());
            let (queue, out) = (queue.clone(), out.clone());
            tokio::spawn(async move {
                let mut tally = Tally::default();
                loop {
                    let Some(intent) = queue.lock().expect("queue").pop() else {
                        return tally;
                    };
                    let started = Instant::now();
                    one(&rg, &mut conn, intent, &out, &mut tally).await;
                    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    tally.max_ms = tally.max_ms.max(ms);
                }
            })
        })
        .collect();
    let mut total = Tally::default();
    for task in tasks {
        let t = task.await.expect("a workload task panicked");
        total.idem_ok += t.idem_ok;
        total.idem_replayed += t.idem_replayed;
        total.idem_in_progress += t.idem_in_progress;
        total.idem_backend += t.idem_backend;
        total.lock_ok += t.lock_ok;
        total.lock_backend += t.lock_backend;
        total.lock_timeout += t.lock_timeout;
        total.rate_allowed += t.rate_allowed;
        total.rate_backend += t.rate_backend;
        total.max_ms = total.max_ms.max(t.max_ms);
    }
    let mut out = std::mem::take(&mut *out.lock().expect("out"));
    let t = total;
    writeln!(
        out,
        "TALLY idem_ok={} idem_replayed={} idem_in_progress={} idem_backend={} lock_ok={} \
         lock_backend={} lock_timeout={} rate_allowed={} rate_backend={} max_ms={}",
        t.idem_ok,
        t.idem_replayed,
        t.idem_in_progress,
        t.idem_backend,
        t.lock_ok,
        t.lock_backend,
        t.lock_timeout,
        t.rate_allowed,
        t.rate_backend,
        t.max_ms
    )
    .expect("write");
    out
}

async fn probe(rg: &Redguard, conn: &ConnectionManager) -> String {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let taken = rg
            .lock("probe")
            .scope("faults-mp")
            .lease(Duration::from_secs(1))
            .try_acquire()
            .await;
        if let Ok(Some(guard)) = taken {
            let _ = guard.release().await;
            // The counter's own connection (not redguard's) must be back too, or the next
            // sections fail on it.
            let mut conn = conn.clone();
            let counter =
                tokio::time::timeout(TIMEOUT, conn.get::<_, Option<u64>>("faults:counter")).await;
            if matches!(counter, Ok(Ok(_))) {
                return format!("RECOVERED {}\n", started.elapsed().as_millis());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    "NOT RECOVERED\n".to_owned()
}

async fn workload(url: String, seed: u64) -> Result<(), Box<dyn std::error::Error>> {
    let rg = Redguard::redis(url.clone())
        .timeout(TIMEOUT)
        .connect()
        .await?;
    let conn = redis::Client::open(url)?.get_connection_manager().await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    while let Some(line) = rx.recv().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["run", first, count] => {
                let intents = shuffled(first.parse()?, count.parse()?, seed);
                run(&rg, &conn, intents).await
            }
            ["probe"] => probe(&rg, &conn).await,
            other => return Err(format!("unknown command {other:?}").into()),
        };
        println!("{reply}END");
    }
    Ok(())
}

async fn hang(url: String, intent: String, expire: u64) -> Result<(), Box<dyn std::error::Error>> {
    let rg = Redguard::redis(url).connect().await?;
    let key = KeyBuilder::new().part("intent", intent.as_str()).finish()?;
    let idem = Idempotency::new("faults", key).expire(Duration::from_millis(expire));
    rg.scope(idem.run(async {
        println!("RUNNING");
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok::<u64, Error>(0)
    }))
    .await?;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [url, mode, intent, expire] if mode == "hang" => {
            hang(url.clone(), intent.clone(), expire.parse()?).await
        }
        [url, mode, seed] if mode == "workload" => workload(url.clone(), seed.parse()?).await,
        _ => Err(
            "usage: fault_worker <redis-url> (hang <intent> <expire-ms> | workload <seed>)".into(),
        ),
    }
}
