//! Redis Sentinel: the harness itself, and guards on a handle that follows the master
//! through failovers (a SIGKILLed master, a planned `SENTINEL FAILOVER`) under load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redguard::__private::store::{Acquire, LockAcquire, LockRelease, Release};
use redguard::{Error, FailMode, GuardKind, Idempotency, KeyBuilder, Redguard};
use redguard_tests::RedisSentinel;
use redguard_tests::sentinel::role;

/// The harness does what the other Sentinel tests count on: a SIGKILLed master is replaced
/// by a replica within a few seconds, and a planned failover moves the master while the old
/// one keeps running (and becomes a replica).
#[test]
fn harness_promotes_a_replica_after_a_kill_and_on_request() {
    let mut sentinel = RedisSentinel::start();
    let first = sentinel.master();
    let killed = Instant::now();
    assert_eq!(sentinel.kill_master(), first);
    let second = sentinel.wait_for_promotion(first);
    assert_ne!(second, first);
    let took = killed.elapsed();
    println!("kill -> promotion seen: {took:?}");
    assert!(took < Duration::from_secs(10), "promotion took {took:?}");

    // The remaining replica follows the new master; then a planned switch.
    sentinel.node(first).restart();
    sentinel.wait_until_ready(Duration::from_secs(30));
    let before = sentinel.master();
    sentinel.failover();
    let after = sentinel.wait_for_promotion(before);
    assert_ne!(after, before);
    assert_eq!(role(sentinel.node(after)), "master");
}

/// The per-call bound of the handles below.
const TIMEOUT: Duration = Duration::from_millis(250);
/// Scheduling slack on a loaded 2-core machine, on top of a call's bound.
const SLACK: Duration = Duration::from_millis(250);

/// One finished guard call of the load.
#[derive(Debug, Clone, Copy)]
struct Call {
    op: &'static str,
    started: Duration,
    took: Duration,
    ok: bool,
}

impl Call {
    fn ended(&self) -> Duration {
        self.started + self.took
    }
}

/// Several tasks doing locks (try-acquire, hold, release), idempotent calls (each intent
/// retried until it completes) and rate checks against one handle, every guard failing
/// closed so the failover window shows as errors.
struct Load {
    t0: Instant,
    stop: Arc<AtomicBool>,
    calls: Arc<Mutex<Vec<Call>>>,
    /// Per lock key, the fences in the order their holders got them.
    fences: Arc<Mutex<HashMap<usize, Vec<u64>>>>,
    /// Per intent, how often its body ran.
    runs: Arc<Mutex<HashMap<u64, u32>>>,
    /// Per intent, when its body last started.
    ran_at: Arc<Mutex<HashMap<u64, Instant>>>,
    /// Per lock key, how many tasks are inside its section now; and how often one entered
    /// while another was inside.
    inside: Arc<[AtomicU64; 2]>,
    overlaps: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn handle(sentinel: &RedisSentinel) -> Redguard {
    sentinel
        .builder()
        .timeout(TIMEOUT)
        .fail_mode(GuardKind::Idempotency, FailMode::Closed)
        .fail_mode(GuardKind::Lock, FailMode::Closed)
        .fail_mode(GuardKind::RateLimit, FailMode::Closed)
        .connect()
        .await
        .expect("connect through the sentinels")
}

impl Load {
    fn start(rg: &Redguard) -> Load {
        let mut load = Load {
            t0: Instant::now(),
            stop: Arc::default(),
            calls: Arc::default(),
            fences: Arc::default(),
            runs: Arc::default(),
            ran_at: Arc::default(),
            inside: Arc::default(),
            overlaps: Arc::default(),
            tasks: Vec::new(),
        };
        for task in 0..4 {
            load.spawn_locker(rg.clone(), task % 2);
        }
        for task in 0..2 {
            load.spawn_idempotent(rg.clone(), task);
        }
        load.spawn_rate(rg.clone());
        load
    }

    fn record(&self) -> impl Fn(&'static str, Instant, bool) + Send + Sync + 'static {
        let (t0, calls) = (self.t0, Arc::clone(&self.calls));
        move |op, started, ok| {
            calls.lock().unwrap().push(Call {
                op,
                started: started - t0,
                took: started.elapsed(),
                ok,
            });
        }
    }

    fn spawn_locker(&mut self, rg: Redguard, key: usize) {
        let (stop, fences, record) = (
            Arc::clone(&self.stop),
            Arc::clone(&self.fences),
            self.record(),
        );
        let (inside, overlaps) = (Arc::clone(&self.inside), Arc::clone(&self.overlaps));
        self.tasks.push(tokio::spawn(async move {
            let name = format!("sentinel:{key}");
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                match rg.lock(name.as_str()).try_acquire().await {
                    Ok(Some(guard)) => {
                        record("lock_acquire", started, true);
                        // Recorded before the release: the next holder's fence comes after.
                        fences
                            .lock()
                            .unwrap()
                            .entry(key)
                            .or_default()
                            .push(guard.fence());
                        if inside[key].fetch_add(1, Ordering::SeqCst) > 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        inside[key].fetch_sub(1, Ordering::SeqCst);
                        let started = Instant::now();
                        let released = guard.release().await;
                        record("lock_release", started, released.is_ok());
                    }
                    Ok(None) => record("lock_acquire", started, true),
                    Err(Error::Backend(_)) => record("lock_acquire", started, false),
                    Err(other) => panic!("lock: unexpected {other:?}"),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }));
    }

    fn spawn_idempotent(&mut self, rg: Redguard, task: u64) {
        let (stop, runs, ran_at, record) = (
            Arc::clone(&self.stop),
            Arc::clone(&self.runs),
            Arc::clone(&self.ran_at),
            self.record(),
        );
        self.tasks.push(tokio::spawn(async move {
            let next = AtomicU64::new(0);
            'intents: while !stop.load(Ordering::Relaxed) {
                let intent = task * 1_000_000 + next.fetch_add(1, Ordering::Relaxed);
                // Retried until it completes: a client retrying through the failover.
                while !stop.load(Ordering::Relaxed) {
                    let key = KeyBuilder::new()
                        .text("order:")
                        .part("id", &intent)
                        .finish()
                        .unwrap();
                    let (runs, ran_at) = (Arc::clone(&runs), Arc::clone(&ran_at));
                    let started = Instant::now();
                    let outcome = rg
                        .scope(
                            Idempotency::new("sentinel", key)
                                .expire(Duration::from_secs(60))
                                .run(async move {
                                    *runs.lock().unwrap().entry(intent).or_default() += 1;
                                    ran_at.lock().unwrap().insert(intent, Instant::now());
                                    Ok::<_, Error>(intent)
                                }),
                        )
                        .await;
                    match outcome {
                        Ok(value) => {
                            assert_eq!(value, intent);
                            record("idempotent", started, true);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue 'intents;
                        }
                        Err(Error::Backend(_)) => record("idempotent", started, false),
                        // A retry that finds the record of an execution whose outcome was
                        // lost with the connection: a documented outcome, not an outage.
                        Err(_) => {
                            record("idempotent", started, true);
                            continue 'intents;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }

    fn spawn_rate(&mut self, rg: Redguard) {
        let (stop, record) = (Arc::clone(&self.stop), self.record());
        self.tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let checked = redguard::limiter("sentinel:")
                    .part("user", &1u64)
                    .scope("sentinel")
                    .rate("100000/s")
                    .on(&rg)
                    .check()
                    .await;
                match checked {
                    Ok(_) => record("rate_check", started, true),
                    Err(Error::Backend(_)) => record("rate_check", started, false),
                    Err(other) => panic!("rate: unexpected {other:?}"),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }));
    }

    async fn finish(mut self) -> Report {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks.drain(..) {
            task.await.expect("a load task panicked");
        }
        let calls = self.calls.lock().unwrap().clone();
        let fences = self.fences.lock().unwrap().clone();
        let runs = self.runs.lock().unwrap().clone();
        let ran_at = self.ran_at.lock().unwrap().clone();
        Report {
            t0: self.t0,
            calls,
            fences,
            runs,
            ran_at,
            overlaps: self.overlaps.load(Ordering::SeqCst),
        }
    }
}

struct Report {
    t0: Instant,
    calls: Vec<Call>,
    fences: HashMap<usize, Vec<u64>>,
    runs: HashMap<u64, u32>,
    ran_at: HashMap<u64, Instant>,
    overlaps: u64,
}

impl Report {
    /// Every call within its bound: one store call per operation, two for an idempotent call
    /// (begin, finish).
    fn assert_bounded(&self) {
        for call in &self.calls {
            let bound = match call.op {
                "idempotent" => TIMEOUT * 2,
                _ => TIMEOUT,
            } + SLACK;
            assert!(call.took <= bound, "{call:?} took longer than {bound:?}");
        }
    }

    /// Fencing tokens strictly increase per key, failover included.
    fn assert_fences_increase(&self) {
        for (key, fences) in &self.fences {
            assert!(
                fences.len() > 10,
                "key {key}: only {} acquisitions",
                fences.len()
            );
            for pair in fences.windows(2) {
                assert!(
                    pair[0] < pair[1],
                    "key {key}: fence {} then {}",
                    pair[0],
                    pair[1]
                );
            }
        }
    }

    fn failures_after(&self, at: Instant) -> Vec<Call> {
        let at = at - self.t0;
        self.calls
            .iter()
            .filter(|call| !call.ok && call.ended() >= at)
            .copied()
            .collect()
    }

    /// The end of the last failed call after `at`, measured from `at` (zero: none failed).
    fn window_after(&self, at: Instant) -> Duration {
        let at = at - self.t0;
        self.failures_after(self.t0 + at)
            .iter()
            .map(|call| call.ended().saturating_sub(at))
            .max()
            .unwrap_or_default()
    }

    fn successes_after(&self, after: Duration) -> usize {
        self.calls
            .iter()
            .filter(|call| call.ok && call.started > after)
            .count()
    }

    fn twice_run_intents(&self) -> usize {
        self.runs.values().filter(|&&n| n > 1).count()
    }

    /// When the body of each intent whose record the (new) master does not have started:
    /// writes the failover lost.
    fn lost_records(&self, sentinel: &RedisSentinel) -> Vec<Instant> {
        let mut conn = sentinel.master_connection();
        self.runs
            .keys()
            .filter(|intent| {
                let key = format!("redguard:idem:{{sentinel:order:{intent}}}");
                let exists: bool = redis::cmd("EXISTS").arg(&key).query(&mut conn).unwrap();
                !exists
            })
            .map(|intent| self.ran_at[intent])
            .collect()
    }

    fn slowest_after(&self, at: Instant) -> Duration {
        let at = at - self.t0;
        self.calls
            .iter()
            .filter(|call| call.ended() >= at)
            .map(|call| call.took)
            .max()
            .unwrap_or_default()
    }
}

/// SIGKILL the master under load: calls fail (as backend errors, each within its bound) until
/// the sentinels promote a replica, then succeed again on the new master by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_recover_after_the_master_is_killed() {
    let mut sentinel = RedisSentinel::start();
    let rg = handle(&sentinel).await;
    let load = Load::start(&rg);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        load.calls.lock().unwrap().iter().all(|call| call.ok),
        "calls failed before the kill"
    );

    let old = sentinel.kill_master();
    let killed = Instant::now();
    let sentinel = sentinel.promoted(old).await;
    let promoted = killed.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let report = load.finish().await;

    let failures = report.failures_after(killed);
    let window = report.window_after(killed);
    let mut fail_times: Vec<Duration> = failures.iter().map(|call| call.took).collect();
    fail_times.sort();
    let median_failure = fail_times
        .get(fail_times.len() / 2)
        .copied()
        .unwrap_or_default();
    println!(
        "master killed: promotion seen by the harness after {promoted:?}; {} failed calls \
         (median {median_failure:?}), the last ending {window:?} after the kill; {} of {} \
         intents ran twice, {} records lost, {} overlapping lock sections; slowest call {:?}",
        failures.len(),
        report.twice_run_intents(),
        report.runs.len(),
        report.lost_records(&sentinel).len(),
        report.overlaps,
        report.slowest_after(killed),
    );
    // While no master answers, calls fail at once instead of waiting out their timeout.
    assert!(
        median_failure < Duration::from_millis(50),
        "failed calls took {median_failure:?} (median)"
    );
    assert!(!failures.is_empty(), "the kill was not noticed");
    assert!(
        window < Duration::from_secs(5),
        "calls failed for {window:?} after the kill"
    );
    assert!(
        report.successes_after((killed - report.t0) + window) > 50,
        "calls did not succeed again after the failover"
    );
    report.assert_bounded();
    report.assert_fences_increase();
    sentinel.assert_every_key_has_ttl();
}

/// A planned `SENTINEL FAILOVER` under load: the handle stops sending to the old master when
/// the replica is selected and moves once it is promoted; calls at most wait, within their
/// bound, and no write the old master acknowledged after the promotion is lost (the handle
/// once went back to it while the sentinels still named it: Redis 6.2 and 8.2.3 name the
/// promoted replica about a second after its promotion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_failover_under_load_fails_no_call() {
    let mut sentinel = RedisSentinel::start();
    let rg = handle(&sentinel).await;
    let load = Load::start(&rg);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let old = sentinel.master();
    let candidates = (0..3)
        .filter(|&node| node != old)
        .map(|node| sentinel.node(node).url())
        .collect();
    let promotion = first_to_say_master(candidates);
    let asked = Instant::now();
    sentinel.failover();
    let sentinel = sentinel.promoted(old).await;
    let promoted = asked.elapsed();
    let said_master = promotion.await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = load.finish().await;

    let failures = report.failures_after(asked);
    println!(
        "planned failover: the replica said master {:?} after the ask, all sentinels named \
         it after {promoted:?}; {} failed calls ({:?}); slowest call {:?}",
        said_master.duration_since(asked),
        failures.len(),
        failures,
        report.slowest_after(asked),
    );
    report.assert_bounded();
    report.assert_fences_increase();
    // Writes stop going to the old master once the replica is selected, before it is
    // promoted; a write the old master acknowledged before the handle heard of that, and that
    // had not reached the replica yet, is lost (the guide: at most the writes in flight at the
    // switch). An intent begun well before the failover was asked for had replicated, and one
    // begun after the promotion went to the new master: neither may be lost.
    let lost = report.lost_records(&sentinel);
    let (from, to) = (asked - SLACK, said_master + SLACK);
    let outside: Vec<_> = lost
        .iter()
        .filter(|&&ran| ran < from || ran > to)
        .map(|&ran| ran.saturating_duration_since(said_master))
        .collect();
    println!(
        "planned failover: {} records lost, {} of them begun outside the switch",
        lost.len(),
        outside.len()
    );
    assert!(
        outside.is_empty(),
        "records lost that were begun outside the switch (this long after the promotion: \
         {outside:?})"
    );
    assert_eq!(report.twice_run_intents(), 0);
    assert_eq!(report.overlaps, 0, "lock sections overlapped");
    assert!(
        failures.len() <= 8,
        "{} calls failed in a planned failover",
        failures.len()
    );
    assert!(
        report.window_after(asked) < Duration::from_secs(2),
        "calls failed for {:?}",
        report.window_after(asked)
    );
    sentinel.assert_every_key_has_ttl();
}

/// When the first of the nodes at `urls` says `ROLE` master (polled every 5 ms, for at most
/// 30 s). A connection is opened for every question: the sentinels close the promoted node's
/// client connections.
fn first_to_say_master(urls: Vec<String>) -> tokio::task::JoinHandle<Instant> {
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            for url in &urls {
                let client = redis::Client::open(url.as_str()).unwrap();
                let Ok(mut conn) = client.get_connection_with_timeout(TIMEOUT) else {
                    continue;
                };
                let role: redis::Value = redis::cmd("ROLE")
                    .query(&mut conn)
                    .unwrap_or(redis::Value::Nil);
                if let redis::Value::Array(fields) = role
                    && matches!(fields.first(), Some(redis::Value::BulkString(role)) if role == b"master")
                {
                    return Instant::now();
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("no replica said master within 30 s");
    })
}

fn lock_key(rg: &Redguard, body: &str) -> redguard::Key {
    let body = KeyBuilder::new().text(body).finish().unwrap();
    rg.key(GuardKind::Lock, "sentinel", &body).unwrap()
}

/// Waits until the handle works on the new master again.
async fn until_served(rg: &Redguard) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while redguard::__private::store::of(rg).time().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "no master served the handle in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Release notifications come from the new master after a failover: a waiter's watch is
/// live again and wakes on a release made there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notifications_follow_the_new_master() {
    let mut sentinel = RedisSentinel::start();
    let rg = sentinel.connect().await;
    let store = redguard::__private::store::of(&rg);
    // Subscribed on the first master.
    let before = lock_key(&rg, "before");
    assert!(store.lock_watch(&before).await.is_live());

    for round in 0..2 {
        let old = sentinel.master();
        if round == 0 {
            sentinel.kill_master();
        } else {
            sentinel.failover();
        }
        sentinel = sentinel.promoted(old).await;
        until_served(&rg).await;
        let key = lock_key(&rg, &format!("after:{round}"));
        assert!(matches!(
            store
                .lock_acquire(Acquire {
                    key: &key,
                    owner: "alice",
                    lease: Duration::from_secs(30),
                    level: 1,
                    waiting: false,
                    replicas: None,
                })
                .await
                .unwrap(),
            LockAcquire::Acquired { .. }
        ));
        // The bus resubscribes on the new master by itself; on a loaded machine that can take
        // longer than one watch's bound (the handle's call timeout), so it is given 5 s.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut watch = store.lock_watch(&key).await;
        while !watch.is_live() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            watch = store.lock_watch(&key).await;
        }
        assert!(
            watch.is_live(),
            "round {round}: the subscription is not back within 5 s"
        );
        // A waiter's attempt finds it held, which asks for the release to be announced.
        assert!(matches!(
            store
                .lock_acquire(Acquire {
                    key: &key,
                    owner: "bob",
                    lease: Duration::from_secs(30),
                    level: 1,
                    waiting: true,
                    replicas: None,
                })
                .await
                .unwrap(),
            LockAcquire::Held { .. }
        ));
        let release = Release {
            key: &key,
            owner: "alice",
            level: 1,
            keep: Duration::ZERO,
        };
        assert_eq!(
            store.lock_release(release).await.unwrap(),
            LockRelease::Released
        );
        tokio::time::timeout(Duration::from_secs(2), watch.changed())
            .await
            .unwrap_or_else(|_| panic!("round {round}: no release notification"));
        if round == 0 {
            // Back to three nodes before the planned switch.
            sentinel.node(old).restart();
            let s = sentinel;
            sentinel = tokio::task::spawn_blocking(move || {
                s.wait_until_ready(Duration::from_secs(30));
                s
            })
            .await
            .unwrap();
        }
    }
}

/// A hung sentinel (SIGSTOPped: connections open, no answer) costs one capped question, not
/// a stalled handle: connecting and following a failover work through the other two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_sentinel_does_not_stall_the_handle() {
    let mut sentinel = RedisSentinel::start();
    sentinel.pause_sentinel(0);
    let started = Instant::now();
    let rg = handle(&sentinel).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "connect took {:?}",
        started.elapsed()
    );
    sentinel.kill_master();
    let killed = Instant::now();
    until_served(&rg).await;
    println!(
        "one sentinel hung: served again {:?} after the kill",
        killed.elapsed()
    );
    assert!(killed.elapsed() < Duration::from_secs(5));
    sentinel.resume_sentinel(0);
}

/// TLS to the sentinels and the data nodes (`sentinel_tls`, a private CA): the handle finds
/// the master, follows a kill, and its release subscription is live on the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_follows_a_killed_master() {
    let mut sentinel = RedisSentinel::start_tls();
    let rg = sentinel
        .builder()
        .sentinel_tls()
        .tls_root_ca(sentinel.ca_pem())
        .connect()
        .await
        .expect("connect over TLS");
    let guard = rg.lock("tls").acquire().await.unwrap();
    guard.release().await.unwrap();
    sentinel.kill_master();
    let killed = Instant::now();
    until_served(&rg).await;
    println!(
        "over TLS: served again {:?} after the kill",
        killed.elapsed()
    );
    let guard = rg.lock("tls").acquire().await.unwrap();
    guard.release().await.unwrap();
    assert!(
        redguard::__private::store::of(&rg)
            .lock_watch(&lock_key(&rg, "tls:watch"))
            .await
            .is_live(),
        "no release subscription on the new master"
    );
}

/// Sentinels given as URLs, the form redis-rs and most clients take (`redis://host:port/`),
/// are found as `host:port` ones are; a URL that is no sentinel address is a clear
/// configuration error at connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_given_as_urls_are_found() {
    let sentinel = RedisSentinel::start_small();
    let urls: Vec<String> = sentinel
        .sentinel_addrs()
        .iter()
        .map(|addr| format!("redis://{addr}/"))
        .collect();
    let rg = Redguard::redis_sentinel(urls, redguard_tests::sentinel::MASTER_NAME)
        .connect()
        .await
        .expect("connect through sentinels given as URLs");
    assert_eq!(rg.kind(), redguard::handle::StoreKind::Sentinel);
    let health = rg.health().await.unwrap();
    assert!(
        health
            .server
            .as_deref()
            .is_some_and(|s| s.starts_with("Redis ")),
        "{health:?}"
    );
    rg.lock("url")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for (bad, says) in [
        ("redis://127.0.0.1/", "no port"),
        ("redis://127.0.0.1:26379/2", "no database"),
    ] {
        let err = Redguard::redis_sentinel([bad], "mymaster")
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{bad}: {err:?}");
        assert!(err.to_string().contains(says), "{bad}: {err}");
    }
}

/// `rediss://` sentinel addresses ask for TLS to the sentinels and the data nodes, as
/// `sentinel_tls` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_sentinel_urls_connect_over_tls() {
    let sentinel = RedisSentinel::start_tls();
    let urls: Vec<String> = sentinel
        .sentinel_addrs()
        .iter()
        .map(|addr| format!("rediss://{addr}"))
        .collect();
    let rg = Redguard::redis_sentinel(urls.clone(), redguard_tests::sentinel::MASTER_NAME)
        .tls_root_ca(sentinel.ca_pem())
        .connect()
        .await
        .expect("connect over TLS through rediss:// sentinels");
    rg.lock("tls-url")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Without TLS to them, the TLS ports do not answer: the scheme was what made it TLS.
    let plain: Vec<String> = urls
        .iter()
        .map(|u| u.replace("rediss://", "redis://"))
        .collect();
    let err = Redguard::redis_sentinel(plain, redguard_tests::sentinel::MASTER_NAME)
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Backend(_) | Error::Config(_)),
        "{err:?}"
    );
}
