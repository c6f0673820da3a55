//! A duplicate that waits for the first execution (issue 29, part 1): woken when the first
//! ends, it replays its result, or runs the retry a business failure allows (one waiter wins
//! it), or is refused as in progress once its `wait` runs out; on Redis in O(1) calls per
//! duplicate, and still working by polling under an ACL without `PSUBSCRIBE`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use http_body_util::BodyExt as _;
use redguard::http::IdempotencyLayer;
use redguard::idempotency::track_replay;
use redguard::{Classify, Error, ErrorClass, Redguard, idempotent};
use redguard_tests::RedisServer;
use redguard_tests::on_memory_and_redis;
use tower::ServiceExt as _;

on_memory_and_redis!(
    sixty_four_duplicates_run_once_and_replay_the_first,
    after_a_business_failure_one_waiter_runs_the_retry,
    past_its_wait_a_duplicate_is_in_progress,
    the_attribute_waits,
    the_layer_replays_the_first_response_to_a_waiting_duplicate,
);

/// Generous: waiting is bounded by this, and every case ends long before it.
const WAIT: Duration = Duration::from_secs(30);

#[derive(Debug)]
enum Failure {
    /// The body declined: a business failure, so a retry may run.
    Declined,
    Guard(Error),
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Failure::Guard(err)
    }
}

impl Classify for Failure {
    fn class(&self) -> ErrorClass {
        match self {
            Failure::Declined => ErrorClass::Business,
            Failure::Guard(err) => err.class(),
        }
    }
}

/// What each of `n` concurrent callers of one intent got: its result and whether it was a
/// replay, from `body(i)` run under `wait`. The first caller (0) begins alone; the others
/// start once it runs, and it ends `hold` after they have all been started.
struct Crowd {
    runs: Arc<AtomicUsize>,
    results: Vec<(Result<u64, Failure>, bool)>,
    /// How long after the first caller returned the last duplicate did.
    lag: Duration,
}

async fn crowd(
    rg: &Redguard,
    key: &'static str,
    n: usize,
    hold: Duration,
    first_fails: bool,
) -> Crowd {
    let runs = Arc::new(AtomicUsize::new(0));
    let arrived = Arc::new(AtomicUsize::new(0));
    let running = Arc::new(tokio::sync::Notify::new());
    let call = |i: usize| {
        let (rg, runs, arrived, running) =
            (rg.clone(), runs.clone(), arrived.clone(), running.clone());
        async move {
            let body = async move {
                let run = runs.fetch_add(1, Ordering::SeqCst);
                if i == 0 {
                    running.notify_one();
                    while arrived.load(Ordering::SeqCst) < n - 1 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    tokio::time::sleep(hold).await;
                    if first_fails {
                        return Err(Failure::Declined);
                    }
                }
                // Each execution's own value: a replay can only have it from the record.
                Ok(1000 * (run as u64 + 1) + i as u64)
            };
            let result = rg
                .scope(track_replay(
                    rg.idempotency(key)
                        .scope("wait")
                        .expire(Duration::from_secs(60))
                        .wait(WAIT)
                        .run(body),
                ))
                .await;
            (result, Instant::now())
        }
    };
    let first = tokio::spawn(call(0));
    running.notified().await;
    let mut others = Vec::new();
    for i in 1..n {
        let duplicate = call(i);
        let arrived = arrived.clone();
        others.push(tokio::spawn(async move {
            arrived.fetch_add(1, Ordering::SeqCst);
            duplicate.await
        }));
    }
    let (first, first_at) = first.await.unwrap();
    let mut results = vec![first];
    let mut last = first_at;
    for other in others {
        let (result, at) = other.await.unwrap();
        results.push(result);
        last = last.max(at);
    }
    Crowd {
        runs,
        results,
        lag: last - first_at,
    }
}

/// 64 duplicates arriving together: one execution; the 63 that arrived while it ran wait
/// and replay its result, none refused as in progress.
async fn sixty_four_duplicates_run_once_and_replay_the_first(rg: Redguard) {
    let Crowd { runs, results, .. } =
        crowd(&rg, "crowd", 64, Duration::from_millis(300), false).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body ran more than once"
    );
    let first = match &results[0] {
        (Ok(value), false) => *value,
        other => panic!("the first: {other:?}"),
    };
    for (i, result) in results.iter().enumerate().skip(1) {
        assert!(
            matches!(result, (Ok(value), true) if *value == first),
            "duplicate {i}: {result:?}, not the replay of {first}"
        );
    }
}

/// The first fails with a business error while 16 wait: exactly one of them wins the retry
/// and runs; the other 15 wait on and replay the retry's result.
async fn after_a_business_failure_one_waiter_runs_the_retry(rg: Redguard) {
    let Crowd { runs, results, .. } =
        crowd(&rg, "retry", 16, Duration::from_millis(300), true).await;
    assert!(
        matches!(results[0], (Err(Failure::Declined), false)),
        "{:?}",
        results[0]
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the first and one retry run"
    );
    let ran: Vec<_> = results
        .iter()
        .skip(1)
        .filter(|(_, replayed)| !replayed)
        .collect();
    assert_eq!(ran.len(), 1, "one waiter runs the retry: {results:?}");
    let retry = match ran[0] {
        (Ok(value), false) => *value,
        other => panic!("the retry: {other:?}"),
    };
    // The retry is the second execution (1000 * 2 + its caller).
    assert_eq!(retry / 1000, 2);
    for result in results.iter().skip(1) {
        assert!(
            matches!(result, (Ok(value), _) if *value == retry),
            "{result:?}: not the retry's {retry}"
        );
    }
}

/// A duplicate waits its `wait` out, and only then is refused as in progress; the body it
/// brought never runs.
async fn past_its_wait_a_duplicate_is_in_progress(rg: Redguard) {
    let (started, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let first = {
        let (rg, started, release) = (rg.clone(), started.clone(), release.clone());
        tokio::spawn(async move {
            rg.idempotency("slow")
                .scope("wait")
                .run(async move {
                    started.notify_one();
                    release.notified().await;
                    Ok::<_, Error>(1)
                })
                .await
        })
    };
    started.notified().await;
    let wait = Duration::from_millis(400);
    let begun = Instant::now();
    let duplicate = rg
        .idempotency("slow")
        .scope("wait")
        .wait(wait)
        .run(async { Ok::<_, Error>(2) })
        .await;
    let waited = begun.elapsed();
    assert!(matches!(duplicate, Err(Error::InProgress)), "{duplicate:?}");
    assert!(
        waited >= wait,
        "refused after {waited:?}, before its wait of {wait:?}"
    );
    assert!(waited < wait + Duration::from_secs(10), "waited {waited:?}");
    release.notify_one();
    assert_eq!(first.await.unwrap().unwrap(), 1);
}

#[idempotent(key = "order:{id}", expire = "1m", scope = "wait-attr", wait = "30s")]
async fn place(id: u64, runs: Arc<AtomicUsize>, hold: Duration) -> Result<u64, Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(hold).await;
    Ok(id * 10)
}

/// `#[idempotent(wait = "30s")]`: a duplicate called while the first runs gets its result.
async fn the_attribute_waits(rg: Redguard) {
    let runs = Arc::new(AtomicUsize::new(0));
    let first = tokio::spawn(rg.scope(place(4, runs.clone(), Duration::from_millis(300))));
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let duplicate = rg
        .scope(track_replay(place(4, runs.clone(), Duration::ZERO)))
        .await;
    assert!(matches!(duplicate, (Ok(40), true)), "{duplicate:?}");
    assert_eq!(first.await.unwrap().unwrap(), 40);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// `IdempotencyLayer::wait`: a duplicate request sent while the first is handled gets the
/// first's response, marked replayed, instead of `409`.
async fn the_layer_replays_the_first_response_to_a_waiting_duplicate(rg: Redguard) {
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = runs.clone();
        move || {
            let runs = runs.clone();
            async move {
                let run = runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                (StatusCode::CREATED, format!("order {run}"))
            }
        }
    };
    let layer = IdempotencyLayer::builder()
        .on(&rg)
        .wait(WAIT)
        .build()
        .unwrap();
    let app = Router::new().route("/orders", post(handler)).layer(layer);
    let request = || {
        Request::post("/orders")
            .header("idempotency-key", "k-1")
            .body(Body::from("{}"))
            .unwrap()
    };
    let first = tokio::spawn(app.clone().oneshot(request()));
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let duplicate = app.oneshot(request()).await.unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(duplicate.status(), StatusCode::CREATED);
    assert_eq!(duplicate.headers()["idempotent-replayed"], "true");
    let body = |response: axum::response::Response| async move {
        response.into_body().collect().await.unwrap().to_bytes()
    };
    assert_eq!(body(duplicate).await, body(first).await);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// No polling storm: 64 duplicates cost Redis one begin each, one more for each waiter
/// woken by the first's end, and the first's finish: about 2 script calls per duplicate
/// (asserted: at most 3 on average), where waiters polling every 100 ms through the
/// first's 1.5 s would make 15, and the 500 ms safety poll of lock waiters 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_duplicates_cost_redis_o1_calls_each() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let before = redguard_tests::faults::script_calls(&server);
    let Crowd { runs, results, lag } =
        crowd(&rg, "calls", 64, Duration::from_millis(1500), false).await;
    let calls = redguard_tests::faults::script_calls(&server) - before;
    // Woken by the notification, not by the 5 s safety poll (which also makes 2 calls).
    assert!(
        lag < Duration::from_millis(2500),
        "the last duplicate returned {lag:?} after the first"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(results.iter().filter(|(_, replayed)| *replayed).count(), 63);
    println!(
        "64 duplicates: {calls} script calls, {:.2} per duplicate",
        calls as f64 / 64.0
    );
    assert!(
        calls <= 3 * 64,
        "{calls} script calls for 64 duplicates: a polling storm"
    );
    server.assert_every_key_has_ttl();
}

/// Under an ACL that allows the scripts (and their `PUBLISH`) but not `PSUBSCRIBE`, the
/// subscription is refused, and waiting duplicates still get the replay, by polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_psubscribe_waiting_duplicates_poll() {
    let server = RedisServer::start();
    // The guide's ACL (`runtime/docs/servers.md`) without the pattern subscription.
    let acl = "on >secret ~redguard:* resetchannels &redguard:* -@all \
        +evalsha +eval +script|load +time +ping +hello \
        +set +get +del +exists +type +hget +hset +hmget +hdel +hgetall +pexpire \
        +pexpiretime +pttl +publish +unlink +zadd +zcard +zcount +zrange +zrem +zremrangebyrank \
        +zremrangebyscore +zscore +wait";
    let mut setuser = ::redis::cmd("ACL");
    setuser.arg("SETUSER").arg("redguard");
    for rule in acl.split_whitespace() {
        setuser.arg(rule);
    }
    let _: () = setuser.query(&mut server.connection()).unwrap();
    let url = format!("redis://redguard:secret@127.0.0.1:{}/", server.port());
    let rg = Redguard::redis(url)
        .connect()
        .await
        .expect("connect as the restricted user");
    let Crowd { runs, results, .. } = crowd(&rg, "acl", 8, Duration::from_millis(300), false).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    for (i, result) in results.iter().enumerate().skip(1) {
        assert!(matches!(result, (Ok(_), true)), "duplicate {i}: {result:?}");
    }
    server.assert_every_key_has_ttl();
}

/// On a Redis Cluster (the record on one master, the subscription on one node, `PUBLISH`
/// carried between them by the cluster bus): one execution, 63 replays, woken promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_duplicates_wait_and_replay() {
    let cluster = redguard_tests::RedisCluster::start();
    let rg = cluster.connect().await;
    let Crowd { runs, results, lag } =
        crowd(&rg, "cluster", 64, Duration::from_millis(300), false).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        results
            .iter()
            .filter(|(r, replayed)| r.is_ok() && *replayed)
            .count(),
        63
    );
    assert!(
        lag < Duration::from_millis(2500),
        "the last duplicate returned {lag:?} after the first"
    );
}

/// An end nobody announces (a crashed first execution's PROCESSING record expiring): a
/// waiter with a live subscription still finds it, by its 5 s safety poll, and runs the
/// intent itself, long before its 30 s `wait` runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_expired_record_is_found_by_the_safety_poll() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    // What a crashed execution leaves: PROCESSING, no longer renewed, expiring on its own.
    let record = "redguard:idem:{wait:crashed}";
    let _: () = ::redis::cmd("HSET")
        .arg(record)
        .arg(&["status", "P", "owner", "gone", "fp", "", "started", "0"])
        .query(&mut server.connection())
        .unwrap();
    let _: () = ::redis::cmd("PEXPIRE")
        .arg(record)
        .arg(1000)
        .query(&mut server.connection())
        .unwrap();
    let begun = Instant::now();
    let ran = rg
        .idempotency("crashed")
        .scope("wait")
        .wait(WAIT)
        .run(async { Ok::<_, Error>(3) })
        .await;
    let took = begun.elapsed();
    assert!(matches!(ran, Ok(3)), "{ran:?}");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(15),
        "ran after {took:?}: not by the safety poll"
    );
    server.assert_every_key_has_ttl();
}
