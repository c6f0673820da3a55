//! Replica-safe writes (`.replicas(n, timeout)`): `WAIT` behind a lock acquisition, an
//! idempotency record's begin and outcome, and a token issue.
//!
//! Redis replicates asynchronously, so a master killed right after acknowledging a write can
//! be replaced by a replica that never received it. On loopback the replica almost always has
//! it already, so the loss is made deterministic by cutting the replica off first (SIGSTOP,
//! then `CLIENT KILL TYPE replica` on the master: what the master writes from then on reaches
//! no replica, not even a socket buffer). With the option off, the writes are acknowledged and
//! the failover loses them; with it on, they are refused (`WAIT` times out: the `FailMode`).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use redguard::{
    BackendError, Error, FailMode, GuardKind, Idempotency, KeyBuilder, LockGuard, LockKind,
    Redguard,
};
use redguard_tests::{RedisCluster, RedisSentinel, RedisServer, after_failover, connect};

const WAIT: Duration = Duration::from_millis(50);

fn unconfirmed(err: &Error) -> bool {
    matches!(
        err,
        Error::Backend(BackendError::Unconfirmed {
            wanted: 1,
            confirmed: 0,
            ..
        })
    )
}

/// An idempotent call of intent `id` in scope `replicas` that counts its executions.
async fn idempotent(
    rg: &Redguard,
    id: &str,
    replicas: bool,
    runs: &Arc<AtomicU32>,
) -> Result<u32, Error> {
    let key = KeyBuilder::new().text(id).finish()?;
    let mut guard = Idempotency::new("replicas", key).expire(Duration::from_secs(600));
    if replicas {
        guard = guard.replicas(1, WAIT);
    }
    let runs = runs.clone();
    rg.scope(guard.run(async move { Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) + 1) }))
        .await
}

/// Waits until the lock `name` answers again (after a failover) and says whether someone else
/// could take it: `true` means it was lost.
async fn lock_was_lost(rg: &Redguard, name: &str, since: Instant) -> bool {
    after_failover(since, || rg.lock(name).try_acquire())
        .await
        .is_some()
}

/// Runs the idempotent call `id` again once the store answers; the executions it counted.
async fn rerun(rg: &Redguard, id: &str, runs: &Arc<AtomicU32>, since: Instant) -> u32 {
    after_failover(since, || async {
        match idempotent(rg, id, false, runs).await {
            Err(Error::InProgress) => Ok(0),
            other => other,
        }
    })
    .await;
    runs.load(Ordering::SeqCst)
}

/// One round of confirmed writes: the acquisitions and first executions acknowledged (the
/// locks still held), and how many were refused (not confirmed in time on a loaded machine:
/// only acknowledged writes must survive).
struct Acknowledged {
    locks: Vec<String>,
    ids: Vec<String>,
    guards: Vec<LockGuard>,
    refused: usize,
    runs: Arc<AtomicU32>,
}

impl Acknowledged {
    /// Takes every lock of `locks` (60 s leases) and runs a first execution of every intent of
    /// `ids`, all at once, each write confirmed by one replica.
    async fn write(rg: &Redguard, locks: Vec<String>, ids: Vec<String>) -> Acknowledged {
        let runs = Arc::new(AtomicU32::new(0));
        let acquisitions = locks.iter().map(|lock| {
            rg.lock(lock.as_str())
                .lease(Duration::from_secs(60))
                .replicas(1, WAIT)
                .acquire()
        });
        let executions = ids.iter().map(|id| idempotent(rg, id, true, &runs));
        let (guards, results) = tokio::join!(
            futures_util::future::join_all(acquisitions),
            futures_util::future::join_all(executions)
        );
        let mut round = Acknowledged {
            locks: Vec::new(),
            ids: Vec::new(),
            guards: Vec::new(),
            refused: 0,
            runs,
        };
        for (lock, guard) in locks.into_iter().zip(guards) {
            if let Some(guard) = round.acknowledge(guard) {
                round.guards.push(guard);
                round.locks.push(lock);
            }
        }
        for (id, result) in ids.into_iter().zip(results) {
            if round.acknowledge(result).is_some() {
                round.ids.push(id);
            }
        }
        round
    }

    fn acknowledge<T>(&mut self, result: Result<T, Error>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(Error::Backend(err)) => {
                if self.refused == 0 {
                    println!("first refusal: {err}");
                }
                self.refused += 1;
                None
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
    }

    fn count(&self) -> usize {
        self.locks.len() + self.ids.len()
    }

    /// Once the store answers again after the master was killed at `killed`: how many
    /// acknowledged writes are gone (a lock someone else could take, an intent that ran again).
    async fn lost(&self, rg: &Redguard, killed: Instant) -> usize {
        let mut lost = 0;
        for lock in &self.locks {
            if lock_was_lost(rg, lock, killed).await {
                lost += 1;
            }
        }
        for id in &self.ids {
            let before = self.runs.load(Ordering::SeqCst);
            if rerun(rg, id, &self.runs, killed).await > before {
                lost += 1;
            }
        }
        lost
    }
}

/// A name under `prefix` whose key (`key(name)`) lives on master `master`.
fn name_on(cluster: &RedisCluster, master: usize, prefix: &str, key: fn(&str) -> String) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|name| cluster.master_of(&key(name)) == master)
        .expect("some name hashes to every master")
}

fn lock_key(name: &str) -> String {
    format!("redguard:lock:{{lock:{name}}}")
}

fn idem_key(id: &str) -> String {
    format!("redguard:idem:{{replicas:{id}}}")
}

/// Cuts master `master` off its replica: paused, and its link killed, so nothing the master
/// writes from now on reaches it.
fn cut_off_replica(cluster: &mut RedisCluster, master: usize) -> usize {
    let replica = cluster.replica_of(master);
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut cluster.node(master).connection())
        .unwrap();
    assert_eq!(acked, 1, "the replica did not catch up");
    cluster.node(replica).pause();
    let _: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut cluster.node(master).connection())
        .unwrap();
    replica
}

/// The replica is cut off, then the master dies: with `.replicas(1, ..)` the acquisition and
/// the idempotent call are refused (`WAIT` confirms nothing: fail closed, undone, the body
/// does not run); without it they are acknowledged, and the promoted replica has neither: a
/// second owner takes the held lock, and the retry runs the body a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replicas_a_failover_loses_acknowledged_writes_with_them_they_are_refused() {
    let mut cluster = RedisCluster::start();
    let rg = Redguard::redis_cluster(cluster.urls())
        .timeout(Duration::from_millis(250))
        .connect()
        .await
        .unwrap();
    let lock = "stall:k";
    let master = cluster.master_of(&lock_key(lock));
    let id = name_on(&cluster, master, "stall:i", idem_key);
    let replica = cut_off_replica(&mut cluster, master);

    let refused = rg.lock(lock).replicas(1, WAIT).acquire().await.unwrap_err();
    assert!(
        unconfirmed(&refused),
        "expected Unconfirmed, got {refused:?}"
    );
    let runs = Arc::new(AtomicU32::new(0));
    let refused = idempotent(&rg, &id, true, &runs).await.unwrap_err();
    assert!(
        unconfirmed(&refused),
        "expected Unconfirmed, got {refused:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "an unconfirmed begin ran the body"
    );
    // A token's key is random, so its slot is any master's: those issued on the cut-off
    // master are refused, the others confirmed (30 issues all missing it: (2/3)^30).
    let tokens = rg.tokens().replicas(1, WAIT);
    let (mut issued, mut refused) = (0, 0);
    for _ in 0..30 {
        match tokens.issue("signup", Duration::from_secs(60)).await {
            Ok(_) => issued += 1,
            Err(err) if unconfirmed(&err) => refused += 1,
            Err(other) => panic!("expected Unconfirmed, got {other:?}"),
        }
    }
    assert!(
        issued > 0 && refused > 0,
        "{issued} issued, {refused} refused"
    );

    // The same writes without the option are acknowledged...
    let held = rg
        .lock(lock)
        .lease(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    assert_eq!(idempotent(&rg, &id, false, &runs).await.unwrap(), 1);
    cluster.node(master).kill();
    cluster.node(replica).resume();
    let killed = Instant::now();
    // ... and lost: the lock is still held by `held` (lease 60 s), yet free on the new master.
    assert!(
        lock_was_lost(&rg, lock, killed).await,
        "the acquisition survived: the replica was not cut off"
    );
    assert_eq!(
        rerun(&rg, &id, &runs, killed).await,
        2,
        "the SUCCESS record survived: the replica was not cut off"
    );
    println!(
        "lost after the failover: the lock acquired with fence {} and the SUCCESS record",
        held.fence()
    );
}

/// The same loss and refusal on Redis Sentinel: both replicas cut off, a confirmed
/// acquisition and first execution are refused; the same writes without the option are
/// acknowledged, the master is killed, the sentinels promote a replica that never got them:
/// the lock is free and the intent runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replicas_a_sentinel_failover_loses_acknowledged_writes() {
    let mut sentinel = RedisSentinel::start();
    let rg = sentinel
        .builder()
        .timeout(Duration::from_millis(250))
        .connect()
        .await
        .unwrap();
    let master = sentinel.master();
    let acked: i64 = redis::cmd("WAIT")
        .arg(2)
        .arg(5000)
        .query(&mut sentinel.master_connection())
        .unwrap();
    assert_eq!(acked, 2, "the replicas did not catch up");
    let replicas: Vec<usize> = (0..3).filter(|&node| node != master).collect();
    for &replica in &replicas {
        sentinel.node(replica).pause();
    }
    let _: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut sentinel.master_connection())
        .unwrap();

    let refused = rg
        .lock("cut:k")
        .replicas(1, WAIT)
        .acquire()
        .await
        .unwrap_err();
    assert!(
        unconfirmed(&refused),
        "expected Unconfirmed, got {refused:?}"
    );
    let runs = Arc::new(AtomicU32::new(0));
    let refused = idempotent(&rg, "cut:i", true, &runs).await.unwrap_err();
    assert!(
        unconfirmed(&refused),
        "expected Unconfirmed, got {refused:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "an unconfirmed begin ran the body"
    );

    let held = rg
        .lock("cut:k")
        .lease(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    assert_eq!(idempotent(&rg, "cut:i", false, &runs).await.unwrap(), 1);
    let old = sentinel.kill_master();
    for &replica in &replicas {
        sentinel.node(replica).resume();
    }
    let killed = Instant::now();
    let sentinel = sentinel.promoted(old).await;
    assert!(
        lock_was_lost(&rg, "cut:k", killed).await,
        "the acquisition survived: the replicas were not cut off"
    );
    assert_eq!(
        rerun(&rg, "cut:i", &runs, killed).await,
        2,
        "the SUCCESS record survived: the replicas were not cut off"
    );
    println!(
        "lost after the Sentinel failover: the lock acquired with fence {} and the SUCCESS \
         record ({:?} after the kill)",
        held.fence(),
        killed.elapsed()
    );
    drop(held);
    sentinel.assert_every_key_has_ttl();
}

/// With `.replicas(1, ..)`, a master killed right after acknowledging writes never loses
/// them: on each of the three masters in turn, many concurrent lock acquisitions and
/// idempotent first executions, then SIGKILL as soon as the last one answered; after the
/// promotion every acknowledged acquisition is still held and every acknowledged intent
/// replays (a write not confirmed in time on a loaded machine is refused, which is allowed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_writes_survive_killing_the_master_right_after() {
    const WRITES: usize = 40;
    let mut cluster = RedisCluster::start();
    let rg = Redguard::redis_cluster(cluster.urls())
        .timeout(Duration::from_millis(250))
        .connect()
        .await
        .unwrap();
    let mut masters = Vec::new();
    for tag in 0.. {
        let master = cluster.master_of(&format!("{{m{tag}}}"));
        if !masters.contains(&master) {
            masters.push(master);
        }
        if masters.len() == 3 {
            break;
        }
    }
    let (mut acknowledged, mut refused, mut lost) = (0, 0, 0);
    for (round, master) in masters.into_iter().enumerate() {
        let mut locks = Vec::new();
        let mut ids = Vec::new();
        let mut taken = HashSet::new();
        for i in 0..WRITES {
            let lock = name_on(&cluster, master, &format!("r{round}:k{i}:"), lock_key);
            let id = name_on(&cluster, master, &format!("r{round}:i{i}:"), idem_key);
            assert!(taken.insert(lock.clone()) && taken.insert(id.clone()));
            locks.push(lock);
            ids.push(id);
        }
        let writes = Acknowledged::write(&rg, locks, ids).await;
        // Right after the last reply.
        cluster.node(master).kill();
        let killed = Instant::now();
        acknowledged += writes.count();
        refused += writes.refused;
        lost += writes.lost(&rg, killed).await;
        println!(
            "round {round}: master killed, promoted within {:?}",
            killed.elapsed()
        );
        drop(writes);
        cluster.wait_until_ok(Duration::from_secs(20));
    }
    println!(
        "{acknowledged} confirmed writes, {lost} lost across 3 failovers ({refused} refused: \
         not confirmed in time)"
    );
    assert_eq!(
        lost, 0,
        "{lost} of {acknowledged} confirmed writes were lost"
    );
    assert!(
        acknowledged >= 3 * WRITES,
        "only {acknowledged} writes confirmed: too few to show anything"
    );
}

/// The same on Redis Sentinel (one master, two replicas, three sentinels): confirmed writes,
/// the master SIGKILLed right after the last reply, the sentinels promote a replica, and
/// every acknowledged acquisition and first execution is there on the new master. Twice,
/// so the second round runs on a promoted replica with one replica left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_writes_survive_a_sentinel_failover() {
    const WRITES: usize = 40;
    let mut sentinel = RedisSentinel::start();
    let rg = sentinel
        .builder()
        .timeout(Duration::from_millis(250))
        .connect()
        .await
        .unwrap();
    let (mut acknowledged, mut refused, mut lost) = (0, 0, 0);
    for round in 0..2 {
        // After a promotion the other replica must first attach to the new master.
        let attached = Instant::now();
        while let Err(err) = rg
            .lock(format!("s{round}:probe").as_str())
            .replicas(1, WAIT)
            .acquire()
            .await
        {
            assert!(
                attached.elapsed() < Duration::from_secs(30),
                "no replica confirms writes on the new master: {err:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let locks = (0..WRITES).map(|i| format!("s{round}:k{i}")).collect();
        let ids = (0..WRITES).map(|i| format!("s{round}:i{i}")).collect();
        let writes = Acknowledged::write(&rg, locks, ids).await;
        let old = sentinel.kill_master();
        let killed = Instant::now();
        acknowledged += writes.count();
        refused += writes.refused;
        sentinel = sentinel.promoted(old).await;
        lost += writes.lost(&rg, killed).await;
    }
    println!(
        "{acknowledged} confirmed writes, {lost} lost across 2 Sentinel failovers ({refused} \
         refused: not confirmed in time)"
    );
    assert_eq!(
        lost, 0,
        "{lost} of {acknowledged} confirmed writes were lost"
    );
    assert!(
        acknowledged >= 2 * WRITES,
        "only {acknowledged} writes confirmed: too few to show anything"
    );
    sentinel.assert_every_key_has_ttl();
}

/// A planned `SENTINEL FAILOVER` while confirmed writes go on: every acquisition and first
/// execution acknowledged with `.replicas(1, ..)` before, during and after the switch is on
/// the new master. The handle stops writing to the old master when the replica is selected;
/// it once went back to it while the sentinels still named it (by its 1 s check, or when that
/// check's `ROLE` waited behind the calls' `WAIT`s), and what the old master acknowledged
/// then was confirmed by the replica not yet moved to the new master, and lost (10 and 100
/// writes in 2 of 5 runs on Redis 6.2.5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmed_writes_survive_a_planned_sentinel_failover() {
    let sentinel = RedisSentinel::start();
    let rg = sentinel
        .builder()
        .timeout(Duration::from_millis(250))
        .connect()
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let (rg, stop) = (rg.clone(), Arc::clone(&stop));
        async move {
            let mut rounds = Vec::new();
            for round in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let locks = (0..5).map(|i| format!("p{round}:k{i}")).collect();
                let ids = (0..5).map(|i| format!("p{round}:i{i}")).collect();
                rounds.push(Acknowledged::write(&rg, locks, ids).await);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            rounds
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let old = sentinel.master();
    let asked = Instant::now();
    sentinel.failover();
    let sentinel = sentinel.promoted(old).await;
    // Past the sentinels' naming of the new master, when the old one is made its replica.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.await.unwrap();
    let (mut acknowledged, mut refused, mut lost) = (0, 0, 0);
    for round in &rounds {
        acknowledged += round.count();
        refused += round.refused;
        lost += round.lost(&rg, asked).await;
    }
    println!(
        "planned failover: {acknowledged} confirmed writes in {} rounds, {lost} lost \
         ({refused} refused: not confirmed in time)",
        rounds.len()
    );
    assert_eq!(
        lost, 0,
        "{lost} of {acknowledged} confirmed writes were lost"
    );
    // Hundreds on an idle machine; a loaded one refuses most (`WAIT` out of time).
    assert!(
        acknowledged >= 40,
        "only {acknowledged} writes confirmed: too few to show anything"
    );
    sentinel.assert_every_key_has_ttl();
}

/// A single node has no replica: `WAIT 1` confirms nothing, so with `.replicas(1, ..)` every
/// guarded write fails as the guard's `FailMode` says — closed (the default): `Unconfirmed`,
/// undone before it returns (the lock free again, the intent runnable, no token left); open: the lock
/// guard is degraded. A `WAIT` timeout that does not fit in the call timeout is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_confirms_nothing() {
    let server = RedisServer::start();
    let rg = connect(&server).await;
    let started = Instant::now();
    let err = rg
        .lock("solo")
        .replicas(1, WAIT)
        .acquire()
        .await
        .unwrap_err();
    assert!(unconfirmed(&err), "expected Unconfirmed, got {err:?}");
    assert!(started.elapsed() >= WAIT, "WAIT did not wait");
    // The acquisition was undone before the refusal returned.
    assert!(
        rg.lock("solo").try_acquire().await.unwrap().is_some(),
        "the unconfirmed lock was not released"
    );

    let runs = Arc::new(AtomicU32::new(0));
    let err = idempotent(&rg, "solo:1", true, &runs).await.unwrap_err();
    assert!(unconfirmed(&err), "expected Unconfirmed, got {err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The begin was undone: the retry without the option runs, once.
    match idempotent(&rg, "solo:1", false, &runs).await {
        Ok(run) => assert_eq!(run, 1),
        Err(other) => panic!("the unconfirmed begin was not undone: {other:?}"),
    }

    let err = rg
        .tokens()
        .replicas(1, WAIT)
        .issue("signup", Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(unconfirmed(&err), "expected Unconfirmed, got {err:?}");
    assert!(
        !server
            .keys()
            .iter()
            .any(|key| key.starts_with("redguard:token:")),
        "the unconfirmed token was not deleted"
    );

    // WAIT must end within the call's own bound (250 ms by default): at most half of it.
    let err = rg
        .lock("solo")
        .replicas(1, Duration::from_millis(200))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "got {err:?}");
    let err = rg
        .lock("solo")
        .replicas(0, WAIT)
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "got {err:?}");

    let open = Redguard::redis(server.url())
        .fail_mode(GuardKind::Lock, FailMode::Open)
        .connect()
        .await
        .unwrap();
    let guard = open
        .lock("solo:open")
        .replicas(1, WAIT)
        .acquire()
        .await
        .unwrap();
    assert!(guard.is_degraded());
}

/// A refused write is undone before the refusal returns (issue 25, finding 10): a retry sent
/// right after it, on another connection, finds the lock free, the intent runnable and no
/// token left behind. The undo used to be spawned as the refusal returned, so the retry raced
/// it (7 of 35 rounds found the lock still held, 4 of 35 got `InProgress`). Every lock kind,
/// many rounds; the replica is cut off, so `WAIT` confirms nothing. On one thread, so a
/// spawned undo cannot run ahead of the retry by luck.
#[tokio::test(flavor = "current_thread")]
async fn an_unconfirmed_write_is_undone_before_its_refusal_returns() {
    let (master, replica) = master_and_replica();
    let rg = connect(&master).await;
    replica.pause();
    let _: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut master.connection())
        .unwrap();
    const ROUNDS: usize = 40;
    let kinds = [
        LockKind::Exclusive,
        LockKind::Fair,
        LockKind::Semaphore { permits: 1 },
        LockKind::Read,
        LockKind::Write,
    ];
    let (mut held, mut in_progress, mut tokens_left) = (Vec::new(), Vec::new(), 0);
    let runs = Arc::new(AtomicU32::new(0));
    for round in 0..ROUNDS {
        let kind = kinds[round % kinds.len()];
        let name = format!("undone:{round}");
        let err = rg
            .lock(&name)
            .kind(kind)
            .replicas(1, WAIT)
            .acquire()
            .await
            .unwrap_err();
        assert!(unconfirmed(&err), "expected Unconfirmed, got {err:?}");
        // A reader would share the lock with a reader left behind: ask as a writer.
        let retry = if kind == LockKind::Read {
            LockKind::Write
        } else {
            kind
        };
        match rg.lock(&name).kind(retry).try_acquire().await.unwrap() {
            Some(guard) => guard.release().await.unwrap(),
            None => held.push(format!("{kind:?} {name}")),
        }

        let id = format!("undone:{round}");
        let err = idempotent(&rg, &id, true, &runs).await.unwrap_err();
        assert!(unconfirmed(&err), "expected Unconfirmed, got {err:?}");
        match idempotent(&rg, &id, false, &runs).await {
            Ok(_) => {}
            Err(Error::InProgress) => in_progress.push(id),
            Err(other) => panic!("the retry of {id} failed: {other:?}"),
        }

        let err = rg
            .tokens()
            .replicas(1, WAIT)
            .issue("signup", Duration::from_secs(60))
            .await
            .unwrap_err();
        assert!(unconfirmed(&err), "expected Unconfirmed, got {err:?}");
        tokens_left = master
            .keys()
            .iter()
            .filter(|key| key.starts_with("redguard:token:"))
            .count();
    }
    println!(
        "{ROUNDS} rounds: lock still held after its refusal {}, InProgress after a refused \
         begin {}, tokens left {tokens_left}",
        held.len(),
        in_progress.len()
    );
    assert!(
        held.is_empty(),
        "still held right after the refusal: {held:?}"
    );
    assert!(
        in_progress.is_empty(),
        "InProgress right after the refused begin: {in_progress:?}"
    );
    assert_eq!(
        tokens_left, 0,
        "refused token issues left their tokens stored"
    );
    assert_eq!(runs.load(Ordering::SeqCst), ROUNDS as u32);
}

/// One master and one replica: every write is confirmed, and the replica has it when the
/// guard returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_confirms_every_write() {
    let (master, replica) = master_and_replica();
    let rg = connect(&master).await;
    let guard = rg.lock("pair").replicas(1, WAIT).acquire().await.unwrap();
    let on_replica: bool = redis::cmd("EXISTS")
        .arg(lock_key("pair"))
        .query(&mut replica.connection())
        .unwrap();
    assert!(
        on_replica,
        "the confirmed acquisition is not on the replica"
    );
    guard.release().await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    assert_eq!(idempotent(&rg, "pair:1", true, &runs).await.unwrap(), 1);
    let status: Option<String> = redis::cmd("HGET")
        .arg(idem_key("pair:1"))
        .arg("status")
        .query(&mut replica.connection())
        .unwrap();
    assert!(
        status.is_some(),
        "the confirmed record is not on the replica"
    );
    let token = rg
        .tokens()
        .replicas(1, WAIT)
        .issue("signup", Duration::from_secs(60))
        .await
        .unwrap();
    rg.tokens().consume("signup", &token).await.unwrap();
}

/// A lock with `.replicas` runs on the handle's twin connection, and its watchdog counts
/// in the handle's `live_watchdogs()` like any other (it lived on the twin's own state, which
/// nobody can ask: the count said 0 while the lock was being renewed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdogs_of_confirmed_locks_are_counted() {
    let (master, _replica) = master_and_replica();
    let rg = connect(&master).await;
    let guards = futures_util::future::try_join_all(
        (0..3).map(|i| rg.lock(format!("counted:{i}")).replicas(1, WAIT).acquire()),
    )
    .await
    .unwrap();
    assert_eq!(rg.live_watchdogs(), 3);
    let plain = rg.lock("counted:plain").acquire().await.unwrap();
    assert_eq!(rg.live_watchdogs(), 4);
    for guard in guards {
        guard.release().await.unwrap();
    }
    plain.release().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while rg.live_watchdogs() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} watchdogs outlived their guards",
            rg.live_watchdogs()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A master and a replica of it, synced.
pub(crate) fn master_and_replica() -> (RedisServer, RedisServer) {
    let master = RedisServer::start();
    let replica = RedisServer::start();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port())
        .query(&mut replica.connection())
        .unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(20_000)
        .query(&mut master.connection())
        .unwrap();
    assert_eq!(acked, 1, "the replica did not sync");
    (master, replica)
}

#[redguard::dist_lock(key = "attr:{sku}", replicas = 1, replicas_timeout = "20ms")]
async fn locked(sku: &str) -> Result<(), Error> {
    let _ = sku;
    Ok(())
}

#[redguard::idempotent(
    key = "attr:{id}",
    expire = 60,
    replicas = 1,
    replicas_timeout = "20ms"
)]
async fn refund(id: u64, runs: Arc<AtomicU32>) -> Result<u64, Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

/// The attribute arguments reach the guards: on a single node both fail closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attributes_confirm_too() {
    let server = RedisServer::start();
    let rg = connect(&server).await;
    let err = rg.scope(locked("SK-1")).await.unwrap_err();
    assert!(unconfirmed(&err), "expected Unconfirmed, got {err:?}");
    let runs = Arc::new(AtomicU32::new(0));
    let err = rg.scope(refund(7, runs.clone())).await.unwrap_err();
    assert!(unconfirmed(&err), "expected Unconfirmed, got {err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let (master, _replica) = master_and_replica();
    let rg = connect(&master).await;
    rg.scope(locked("SK-1")).await.unwrap();
    assert_eq!(rg.scope(refund(7, runs.clone())).await.unwrap(), 7);
    assert_eq!(rg.scope(refund(7, runs.clone())).await.unwrap(), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// `WAIT` blocks the connection that sent it until the replicas answer or it times out. A
/// replica that stalls must not hold up the calls that do not wait for it, on the same handle
/// or another: guards with `.replicas` run on a connection of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_replica_holds_up_only_the_writes_that_wait_for_it() {
    let (master, replica) = master_and_replica();
    let plain = connect(&master).await;
    let other = connect(&master).await;
    replica.pause();
    let _: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut master.connection())
        .unwrap();
    let shared = median_plain_call(&plain, &plain).await;
    let apart = median_plain_call(&plain, &other).await;
    println!(
        "median plain acquire+release: {shared:?} beside its own handle's confirmed writes, \
         {apart:?} beside another handle's"
    );
    for median in [shared, apart] {
        // Behind the `WAIT`s each call would take at least one.
        assert!(
            median < WAIT / 5,
            "a plain acquire+release took {median:?} while confirmed writes waited for a stalled replica"
        );
    }
}

/// For one second, 8 tasks take locks with `.replicas(1, ..)` on `confirming` (all refused:
/// the replica is cut off) while plain acquire+release run on `plain`: their median time (a
/// timeout counts as the call timeout). The median, not the slowest: on a machine busy with
/// other tests a call is now and then descheduled for longer than a `WAIT`.
async fn median_plain_call(plain: &Redguard, confirming: &Redguard) -> Duration {
    let until = Instant::now() + Duration::from_secs(1);
    let waiting = (0..8).map(|i| {
        let rg = confirming.clone();
        tokio::spawn(async move {
            for n in 0.. {
                if Instant::now() >= until {
                    break;
                }
                let err = rg
                    .lock(format!("stalled:{i}:{n}"))
                    .replicas(1, WAIT)
                    .acquire()
                    .await
                    .unwrap_err();
                assert!(matches!(err, Error::Backend(_)), "got {err:?}");
            }
        })
    });
    let waiting = futures_util::future::join_all(waiting);
    let calls = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut took = Vec::new();
        while Instant::now() < until {
            let call = Instant::now();
            match plain.lock("plain").acquire().await {
                Ok(guard) => drop(guard.release().await),
                Err(Error::Backend(_)) => {}
                Err(other) => panic!("unexpected {other:?}"),
            }
            took.push(call.elapsed());
        }
        took.sort();
        took[took.len() / 2]
    };
    let (waited, slowest) = tokio::join!(waiting, calls);
    for task in waited {
        task.unwrap();
    }
    slowest
}
