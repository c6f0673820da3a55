//! Batches for queue consumers (`Redguard::idempotency_batch`) on memory, Redis and a
//! Cluster: per-message outcomes of a mixed batch, racing consumers on overlapping batches,
//! a batch dropped mid-way and a consumer process killed mid-batch, then redelivered; and
//! the claim's store calls counted on the server.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redguard::idempotency::{BatchOutcome, MAX_BATCH};
use redguard::{Error, ErrorClass, Redguard};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Each case once per store: memory, one `redis-server`, a 3-master Cluster; every key the
/// case left on Redis must have a TTL.
macro_rules! stores {
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
                    let server = redguard_tests::RedisServer::start();
                    let rg = redguard_tests::connect(&server).await;
                    super::$case(rg).await;
                    server.assert_every_key_has_ttl();
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let cluster = redguard_tests::RedisCluster::start();
                    let rg = cluster.connect().await;
                    super::$case(rg).await;
                    cluster.assert_every_key_has_ttl();
                }
            )*
        }
    };
}

stores!(
    a_mixed_batch_reports_each_message,
    racing_consumers_run_each_id_once,
    a_dropped_batch_leaves_each_message_as_the_model_says,
    a_claim_that_expired_before_its_turn_does_not_run,
);

const SCOPE: &str = "batch-test";

fn single(rg: &Redguard, id: &str) -> redguard::idempotency::Idempotency {
    rg.idempotency(id)
        .scope(SCOPE)
        .expire(Duration::from_secs(60))
}

/// Fresh, done, failed, in progress, unknown, reused and invalid ids in one batch: each gets
/// its own outcome, and only the fresh and the failed one run.
async fn a_mixed_batch_reports_each_message(rg: Redguard) {
    let done: u64 = single(&rg, "done")
        .run(async { Ok::<_, Error>(7) })
        .await
        .unwrap();
    assert_eq!(done, 7);
    let failed = single(&rg, "failed")
        .run(async { Err::<u64, BoxError>(ErrorClass::Business.into()) })
        .await;
    assert!(failed.is_err());
    let unknown = single(&rg, "unknown")
        .run(async { Err::<u64, BoxError>(std::io::Error::other("reset").into()) })
        .await;
    assert!(unknown.is_err());
    single(&rg, "reused")
        .payload(&1u32)
        .run(async { Ok::<_, Error>(1u64) })
        .await
        .unwrap();
    // "busy" runs elsewhere until released.
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (release, release_rx) = tokio::sync::oneshot::channel::<()>();
    let busy = tokio::spawn({
        let rg = rg.clone();
        async move {
            single(&rg, "busy")
                .run(async move {
                    let _ = started_tx.send(());
                    let _ = release_rx.await;
                    Ok::<_, Error>(5u64)
                })
                .await
        }
    });
    started.await.unwrap();

    let ids = [
        "fresh", "done", "failed", "busy", "unknown", "reused", "bad id",
    ];
    let ran = Mutex::new(Vec::new());
    let mut batch = rg
        .idempotency_batch()
        .scope(SCOPE)
        .expire(Duration::from_secs(60));
    for id in ids {
        batch = if id == "reused" {
            batch.message_with_payload(id, &2u32)
        } else {
            batch.message(id)
        };
    }
    let outcomes = batch
        .run(|i| {
            ran.lock().unwrap().push(ids[i]);
            async move { Ok::<_, Error>(100 + i as u64) }
        })
        .await
        .unwrap();
    release.send(()).unwrap();
    assert_eq!(busy.await.unwrap().unwrap(), 5);

    assert_eq!(outcomes.len(), ids.len());
    assert!(
        matches!(outcomes[0], BatchOutcome::Ran(Ok(100))),
        "{:?}",
        outcomes[0]
    );
    assert!(
        matches!(outcomes[1], BatchOutcome::Replayed(7)),
        "{:?}",
        outcomes[1]
    );
    assert!(
        matches!(outcomes[2], BatchOutcome::Ran(Ok(102))),
        "{:?}",
        outcomes[2]
    );
    assert!(
        matches!(outcomes[3], BatchOutcome::InProgress),
        "{:?}",
        outcomes[3]
    );
    assert!(
        matches!(outcomes[4], BatchOutcome::Unknown),
        "{:?}",
        outcomes[4]
    );
    assert!(
        matches!(outcomes[5], BatchOutcome::Failed(Error::KeyReuse)),
        "{:?}",
        outcomes[5]
    );
    assert!(
        matches!(outcomes[6], BatchOutcome::Failed(Error::InvalidKey { .. })),
        "{:?}",
        outcomes[6]
    );
    assert_eq!(*ran.lock().unwrap(), ["fresh", "failed"]);
    let done: Vec<bool> = outcomes.iter().map(BatchOutcome::is_done).collect();
    assert_eq!(done, [true, true, true, false, false, false, false]);

    // Recorded: the single-call API replays what the batch ran.
    let again: u64 = single(&rg, "fresh")
        .run(async { Ok::<_, Error>(0) })
        .await
        .unwrap();
    assert_eq!(again, 100);
}

/// 8 consumers take overlapping batches of 200 ids (each its own rotation, batches of 25,
/// redelivering what was in progress) until each has seen every id done: every id runs
/// exactly once in all.
async fn racing_consumers_run_each_id_once(rg: Redguard) {
    const IDS: usize = 200;
    let runs: Arc<Mutex<HashMap<usize, usize>>> = Arc::default();
    let consumers: Vec<_> = (0..8)
        .map(|c| {
            let (rg, runs) = (rg.clone(), runs.clone());
            tokio::spawn(async move {
                let mut queue: Vec<usize> = (0..IDS).map(|i| (i + c * 37) % IDS).collect();
                let deadline = std::time::Instant::now() + Duration::from_secs(120);
                while !queue.is_empty() {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "consumer {c} never finished"
                    );
                    let take: Vec<usize> = queue.drain(..queue.len().min(25)).collect();
                    let names: Vec<String> = take.iter().map(|i| format!("id-{i}")).collect();
                    let mut batch = rg
                        .idempotency_batch()
                        .scope(SCOPE)
                        .concurrency(1 + c % 4)
                        .expire(Duration::from_secs(60));
                    for name in &names {
                        batch = batch.message(name.as_str());
                    }
                    let outcomes = batch
                        .run(|i| {
                            let id = take[i];
                            let runs = runs.clone();
                            async move {
                                *runs.lock().unwrap().entry(id).or_default() += 1;
                                tokio::time::sleep(Duration::from_millis(1)).await;
                                Ok::<_, Error>(id as u64)
                            }
                        })
                        .await
                        .unwrap();
                    for (id, outcome) in take.into_iter().zip(outcomes) {
                        match outcome {
                            BatchOutcome::Ran(Ok(v)) | BatchOutcome::Replayed(v) => {
                                assert_eq!(v, id as u64);
                            }
                            // Another consumer holds it: redeliver later.
                            BatchOutcome::InProgress => queue.push(id),
                            other => panic!("id {id}: {other:?}"),
                        }
                    }
                    if !queue.is_empty() {
                        // As a broker's redelivery delay: let the holder finish.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            })
        })
        .collect();
    for consumer in consumers {
        consumer.await.unwrap();
    }
    let runs = runs.lock().unwrap();
    let violations: Vec<_> = (0..IDS)
        .filter(|id| runs.get(id).copied().unwrap_or(0) != 1)
        .map(|id| (id, runs.get(&id).copied().unwrap_or(0)))
        .collect();
    assert!(
        violations.is_empty(),
        "ids not run exactly once: {violations:?}"
    );
}

/// A batch whose future is dropped while message 2's body runs: 0 and 1 are recorded,
/// 2 is UNKNOWN (its body was cut off part-way), 3 and 4 never started and their claims are
/// undone, so the redelivery replays 0 and 1, refuses 2 and runs 3 and 4 at once.
async fn a_dropped_batch_leaves_each_message_as_the_model_says(rg: Redguard) {
    let ids = ["d-0", "d-1", "d-2", "d-3", "d-4"];
    let runs: Arc<Mutex<Vec<usize>>> = Arc::default();
    let batch = |rg: &Redguard| {
        let mut batch = rg
            .idempotency_batch()
            .scope(SCOPE)
            .expire(Duration::from_secs(60));
        for id in ids {
            batch = batch.message(id);
        }
        batch
    };
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let mut started_tx = Some(started_tx);
    let first = {
        let runs = runs.clone();
        batch(&rg).run(move |i| {
            let signal = if i == 2 { started_tx.take() } else { None };
            let runs = runs.clone();
            async move {
                if let Some(signal) = signal {
                    let _ = signal.send(());
                    std::future::pending::<()>().await;
                }
                runs.lock().unwrap().push(i);
                Ok::<_, Error>(i as u64)
            }
        })
    };
    tokio::select! {
        _ = first => panic!("the batch cannot finish: message 2 never returns"),
        _ = started => {}
    }
    // Dropped: the undo of 3 and 4 and the UNKNOWN of 2 are sent on the drop.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let outcomes = batch(&rg)
        .run(|i| {
            let runs = runs.clone();
            async move {
                runs.lock().unwrap().push(i);
                Ok::<_, Error>(i as u64 + 10)
            }
        })
        .await
        .unwrap();
    assert!(
        matches!(outcomes[0], BatchOutcome::Replayed(0)),
        "{:?}",
        outcomes[0]
    );
    assert!(
        matches!(outcomes[1], BatchOutcome::Replayed(1)),
        "{:?}",
        outcomes[1]
    );
    assert!(
        matches!(outcomes[2], BatchOutcome::Unknown),
        "{:?}",
        outcomes[2]
    );
    assert!(
        matches!(outcomes[3], BatchOutcome::Ran(Ok(13))),
        "{:?}",
        outcomes[3]
    );
    assert!(
        matches!(outcomes[4], BatchOutcome::Ran(Ok(14))),
        "{:?}",
        outcomes[4]
    );
    assert_eq!(*runs.lock().unwrap(), [0, 1, 3, 4]);
}

/// A batch whose first body outlasts the expire: the claims still waiting have lapsed (a
/// twin may hold them now), so their bodies do not run and they are reported as failed; a
/// redelivery then runs them.
async fn a_claim_that_expired_before_its_turn_does_not_run(rg: Redguard) {
    let ids = ["x-0", "x-1", "x-2"];
    let expire = Duration::from_secs(1);
    let runs = Mutex::new(Vec::new());
    let run = |rg: &Redguard| {
        let mut batch = rg.idempotency_batch().scope(SCOPE).expire(expire);
        for id in ids {
            batch = batch.message(id);
        }
        batch
    };
    let outcomes = run(&rg)
        .run(|i| {
            runs.lock().unwrap().push(i);
            async move {
                if i == 0 {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
                Ok::<_, Error>(i as u64)
            }
        })
        .await
        .unwrap();
    assert!(
        matches!(outcomes[0], BatchOutcome::Ran(Ok(0))),
        "{:?}",
        outcomes[0]
    );
    for outcome in &outcomes[1..] {
        assert!(
            matches!(outcome, BatchOutcome::Failed(Error::Backend(_))),
            "{outcome:?}"
        );
    }
    assert_eq!(*runs.lock().unwrap(), [0]);
    let again = run(&rg)
        .run(|i| async move { Ok::<_, Error>(i as u64 + 10) })
        .await
        .unwrap();
    assert!(
        matches!(again[1], BatchOutcome::Ran(Ok(11))),
        "{:?}",
        again[1]
    );
    assert!(
        matches!(again[2], BatchOutcome::Ran(Ok(12))),
        "{:?}",
        again[2]
    );
}

#[tokio::test]
async fn a_batch_above_the_bound_is_refused_before_the_store() {
    let rg = Redguard::memory();
    let names: Vec<String> = (0..=MAX_BATCH).map(|i| format!("m-{i}")).collect();
    let mut batch = rg.idempotency_batch().scope(SCOPE);
    for name in &names {
        batch = batch.message(name.as_str());
    }
    let ran = Mutex::new(0);
    let refused = batch
        .run(|_| {
            *ran.lock().unwrap() += 1;
            async { Ok::<_, Error>(()) }
        })
        .await;
    match refused {
        Err(Error::Config(message)) => assert!(message.contains("at most 1000"), "{message}"),
        other => panic!("expected a config error, got {other:?}"),
    }
    assert_eq!(*ran.lock().unwrap(), 0);
    let zero = rg
        .idempotency_batch()
        .message("m")
        .concurrency(0)
        .run(|_| async { Ok::<_, Error>(()) })
        .await;
    assert!(matches!(zero, Err(Error::Config(_))), "{zero:?}");
}

/// Script calls the servers counted (`INFO commandstats`), summed over `servers`.
fn evalsha_calls(servers: &[&redguard_tests::RedisServer]) -> u64 {
    servers
        .iter()
        .map(|server| redguard_tests::faults::script_calls(server))
        .sum()
}

async fn batch_of(rg: &Redguard, names: &[String]) -> Vec<BatchOutcome<u64, Error>> {
    let mut batch = rg
        .idempotency_batch()
        .scope(SCOPE)
        .expire(Duration::from_secs(60));
    for name in names {
        batch = batch.message(name.as_str());
    }
    batch
        .run(|i| async move { Ok::<_, Error>(i as u64) })
        .await
        .unwrap()
}

/// On one node a batch of 100 is one script call to claim, plus one finish per message run;
/// a redelivered batch (all done) is one call in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_script_call_claims_a_batch_on_one_node() {
    let server = redguard_tests::RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let names: Vec<String> = (0..100).map(|i| format!("c-{i}")).collect();
    let before = evalsha_calls(&[&server]);
    let first = batch_of(&rg, &names).await;
    assert!(first.iter().all(|o| matches!(o, BatchOutcome::Ran(Ok(_)))));
    let after_first = evalsha_calls(&[&server]);
    assert_eq!(after_first - before, 1 + 100, "one claim and 100 finishes");
    let again = batch_of(&rg, &names).await;
    assert!(again.iter().all(|o| matches!(o, BatchOutcome::Replayed(_))));
    assert_eq!(evalsha_calls(&[&server]) - after_first, 1, "one claim");
    server.assert_every_key_has_ttl();
}

/// On a Cluster the claim is one script per slot group: each message's key has its own
/// hash tag, so as many calls as distinct tags, and no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_script_call_per_slot_group_on_a_cluster() {
    let mut cluster = redguard_tests::RedisCluster::start();
    let rg = cluster.connect().await;
    let names: Vec<String> = (0..30).map(|i| format!("s-{i}")).collect();
    batch_of(&rg, &names).await;
    // Replicas count nothing here: a claim that only replays writes nothing to replicate.
    let count = |cluster: &mut redguard_tests::RedisCluster| -> u64 {
        (0..6).map(|i| evalsha_calls(&[cluster.node(i)])).sum()
    };
    let before = count(&mut cluster);
    let again = batch_of(&rg, &names).await;
    assert!(again.iter().all(|o| matches!(o, BatchOutcome::Replayed(_))));
    assert_eq!(count(&mut cluster) - before, names.len() as u64);
    cluster.assert_every_key_has_ttl();
}

/// A consumer process killed while message 3's body runs: 0 to 2 are recorded; 3 (mid-body)
/// and 4 to 9 (claimed, not started) stay PROCESSING until their expire, so a redelivery is
/// refused until then and runs them after it. Every message's body completes exactly once:
/// 0 to 2 in the child, 3 to 9 in the redelivery.
#[test]
fn a_consumer_killed_mid_batch_is_redelivered_after_the_expire() {
    let server = redguard_tests::RedisServer::start();
    let mut child = Command::new(env!("CARGO_BIN_EXE_batch_worker"))
        .arg(server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn batch_worker");
    let mut done_by_child = Vec::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let killed = loop {
        let line = lines.next().expect("batch_worker ended early").unwrap();
        match line.split_once(' ') {
            Some(("done", i)) => done_by_child.push(i.parse::<usize>().unwrap()),
            Some(("started", "3")) => break std::time::Instant::now(),
            _ => {}
        }
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(done_by_child, [0, 1, 2]);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let rg = &redguard_tests::connect(&server).await;
        let redeliver = |from: usize| async move {
            let mut batch = rg
                .idempotency_batch()
                .scope("worker")
                .expire(Duration::from_secs(5));
            for i in from..10 {
                batch = batch.message(redguard::key("m:{i}").part("i", &(i as u64)));
            }
            batch
                .run(|i| async move { Ok::<_, Error>((from + i) as u64) })
                .await
                .unwrap()
        };
        let early = redeliver(0).await;
        // Only meaningful inside the expire; a machine too loaded to get here in time
        // skips it (the late redelivery below still checks every message).
        let in_time = killed.elapsed() < Duration::from_secs(4);
        for (i, outcome) in early.iter().enumerate().filter(|_| in_time) {
            match (i, outcome) {
                (0..=2, BatchOutcome::Replayed(v)) => assert_eq!(*v, i as u64),
                (3..=9, BatchOutcome::InProgress) => {}
                other => panic!("early redelivery: {other:?}"),
            }
        }
        tokio::time::sleep_until((killed + Duration::from_millis(5500)).into()).await;
        // The broker redelivers what was never acked: 3 to 9 (0 to 2 were acked once done,
        // and their records, which also live 5 s, may be gone by now).
        let late = redeliver(3).await;
        for (i, outcome) in late.iter().enumerate() {
            match outcome {
                BatchOutcome::Ran(Ok(v)) => assert_eq!(*v, 3 + i as u64),
                other => panic!("late redelivery of {}: {other:?}", 3 + i),
            }
        }
    });
    server.assert_every_key_has_ttl();
}
