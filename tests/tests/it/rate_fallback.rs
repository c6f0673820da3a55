//! The local fallback of rate limits (`FailMode::Local`, issue 28): while Redis cannot
//! answer, each instance admits its share of every limit (rate and burst ÷ instances), and
//! once Redis answers again (restarted empty: it has forgotten every admission) no stale
//! burst follows. Under `FailMode::Open` the same load would be admitted whole; under
//! `Closed`, not at all: each bound below is checked against the number of calls made, so
//! the test can tell the modes apart.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redguard::{Error, Redguard, handle::FailMode, key::GuardKind, rate::Rate};
use redguard_tests::RedisServer;
use redguard_tests::metrics;

const INSTANCES: u32 = 3;
const TASKS: usize = 6;
/// The limit shared by the instances: 30/s, a burst of 60 (its window: 2 s).
const RATE: u64 = 30;
const BURST: u64 = 60;
const WINDOW: Duration = Duration::from_secs(2);
/// Each instance's share while Redis is down.
const SHARE_RATE: f64 = (RATE / INSTANCES as u64) as f64;
const SHARE_BURST: u64 = BURST / INSTANCES as u64;

async fn instance(server: &RedisServer) -> Redguard {
    Redguard::redis(server.url())
        .timeout(Duration::from_millis(100))
        .fail_mode(GuardKind::RateLimit, FailMode::local(INSTANCES).unwrap())
        .connect()
        .await
        .expect("connect to the test redis-server")
}

fn limiter(rg: &Redguard, scope: &'static str) -> redguard::rate::Limiter {
    redguard::limiter(redguard::key("tenant:{t}").part("t", "acme"))
        .scope(scope)
        .rate(Rate::new(RATE, Duration::from_secs(1)).unwrap())
        .burst(BURST)
        .on(rg)
}

/// Every call of one instance: when it returned, and whether it was admitted.
type Calls = Arc<Mutex<Vec<(Instant, bool)>>>;

fn in_span(calls: &[(Instant, bool)], from: Instant, to: Instant) -> (u64, u64) {
    let span: Vec<_> = calls
        .iter()
        .filter(|(at, _)| *at >= from && *at <= to)
        .collect();
    let admitted = span.iter().filter(|(_, allowed)| *allowed).count();
    (span.len() as u64, admitted as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_instance_admits_its_share_while_redis_is_down_and_no_stale_burst_follows() {
    const SCOPE: &str = "it::fallback::fault";
    metrics::install();
    let mut server = RedisServer::start();
    let mut handles = Vec::new();
    for _ in 0..INSTANCES {
        handles.push(instance(&server).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut logs: Vec<Calls> = Vec::new();
    let mut tasks = Vec::new();
    for rg in &handles {
        let calls = Calls::default();
        logs.push(Arc::clone(&calls));
        for _ in 0..TASKS {
            let (limiter, calls, stop) = (limiter(rg, SCOPE), Arc::clone(&calls), stop.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let allowed = match limiter.decide().await {
                        Ok(d) => d.allowed,
                        Err(err) => panic!("the fallback must decide, not fail: {err:?}"),
                    };
                    calls.lock().unwrap().push((Instant::now(), allowed));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }));
        }
    }
    // Redis decides, and the load (well over 30/s) drains its burst.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.kill();
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let restarting = Instant::now();
    server.restart();
    let restarted = Instant::now();
    tokio::time::sleep(WINDOW + Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("a load task panicked");
    }

    // While Redis was down: each instance within its share, which a GCRA of the share's
    // rate and burst bounds by `burst + rate × time` (a call Redis decided may still have
    // been in flight at the kill: one per task).
    let outage = restarting - killed;
    let bound = SHARE_BURST as f64 + SHARE_RATE * outage.as_secs_f64() + TASKS as f64 + 1.0;
    for (i, calls) in logs.iter().enumerate() {
        let calls = calls.lock().unwrap();
        let (made, admitted) = in_span(&calls, killed, restarting);
        println!("instance {i}, Redis down {outage:?}: {admitted} of {made} calls admitted");
        assert!(
            made as f64 > bound,
            "the load must exceed the share (else FailMode::Open would pass): {made} calls"
        );
        assert!(
            admitted as f64 <= bound,
            "instance {i} admitted {admitted} > its share's bound {bound:.1}"
        );
        // Not closed: the share's burst at least (its bucket was full at the kill).
        assert!(
            admitted >= SHARE_BURST,
            "instance {i} admitted {admitted} < its share's burst {SHARE_BURST}"
        );
    }

    // Redis restarted empty would admit its whole burst again on top of the outage's
    // admissions: B + rate × W in the first window. An exact limiter under this load admits
    // rate × W (its burst was drained before the kill); half a burst of slack for the
    // instances' own buckets and the scheduling.
    let (mut made, mut admitted) = (0, 0);
    for calls in &logs {
        let (m, a) = in_span(&calls.lock().unwrap(), restarted, restarted + WINDOW);
        made += m;
        admitted += a;
    }
    let stale = BURST + RATE * WINDOW.as_secs();
    let bound = RATE * WINDOW.as_secs() + BURST / 2;
    println!("first window after the restart: {admitted} of {made} calls admitted");
    assert!(
        made > stale,
        "the load must be able to show a stale burst: {made} calls"
    );
    assert!(
        admitted <= bound,
        "{admitted} admitted in the first window after recovery > {bound} (a stale burst gives {stale})"
    );
    // And Redis decides again (each handle, once reconnected): the limit's state is in
    // Redis, with a TTL.
    assert!(
        local_decisions(SCOPE) > 0,
        "no decision was counted as mode=local"
    );
    let since = Instant::now();
    for rg in &handles {
        loop {
            let before = local_decisions(SCOPE);
            limiter(rg, SCOPE).decide().await.unwrap();
            if local_decisions(SCOPE) == before {
                break;
            }
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "still decided locally 10 s after the restart"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(!server.keys().is_empty());
    server.assert_every_key_has_ttl();
}

fn local_decisions(scope: &str) -> u64 {
    metrics::counter(
        "redguard_rate_decisions_total",
        &[("scope", scope), ("mode", "local")],
    )
}

/// Deciding exactly the share, for stacked limits and the attribute alike: with Redis gone,
/// a limit of 8/h over 4 instances admits 2 per instance (no refill within the test), a
/// stack of 4/h per user and 40/h in all admits 1, all-or-nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiters_stacks_and_the_attribute_fall_back_to_exactly_the_share() {
    const SCOPE: &str = "it::fallback::share";
    metrics::install();
    let mut server = RedisServer::start();
    let rg = Redguard::redis(server.url())
        .timeout(Duration::from_millis(100))
        .fail_mode(GuardKind::RateLimit, FailMode::local(4).unwrap())
        .connect()
        .await
        .unwrap();
    server.kill();

    let one = || {
        redguard::limiter(redguard::key("user:{u}").part("u", "7"))
            .scope(SCOPE)
            .rate("8/h")
            .on(&rg)
    };
    let admitted = count(5, || async { one().decide().await.map(|d| d.allowed) }).await;
    assert_eq!(admitted, 2, "a share of 8/h over 4 instances is 2");

    let stack = || {
        redguard::limiter(redguard::key("user:{u}").part("u", "8"))
            .scope(SCOPE)
            .rate("4/h")
            .on(&rg)
            .and(redguard::limiter("all").scope(SCOPE).rate("40/h").on(&rg))
    };
    let admitted = count(3, || async {
        stack().decide().await.map(|d| d.iter().all(|d| d.allowed))
    })
    .await;
    assert_eq!(admitted, 1, "the per-user share (1) decides the stack");
    // Refused by the user's share, the global one was not charged: 10 left for others.
    let others = count(12, || async {
        redguard::limiter("all")
            .scope(SCOPE)
            .rate("40/h")
            .on(&rg)
            .decide()
            .await
            .map(|d| d.allowed)
    })
    .await;
    assert_eq!(others, 9, "the global share (10) less the stack's one call");

    let admitted = rg
        .scope(async {
            let mut admitted = 0;
            for _ in 0..4 {
                match report(9).await {
                    Ok(_) => admitted += 1,
                    Err(Error::RateLimited(d)) => assert!(d.retry_after > Duration::ZERO),
                    Err(other) => panic!("{other:?}"),
                }
            }
            admitted
        })
        .await;
    assert_eq!(admitted, 2, "the attribute's 8/h over 4 instances");
    assert!(
        metrics::counter(
            "redguard_backend_errors_total",
            &[("guard", "rate"), ("outcome", "fail_local")]
        ) > 0
    );
    assert_eq!(
        local_decisions(SCOPE),
        // 5 + 3 × 2 + 12, and the attribute's 4.
        5 + 6 + 12 + 4,
    );
}

#[redguard::rate_limit(key = "report:{user}", rate = "8/h", scope = "it::fallback::share")]
async fn report(user: u64) -> redguard::Result<u64> {
    Ok(user)
}

async fn count<F, Fut>(calls: usize, mut call: F) -> usize
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = redguard::Result<bool>>,
{
    let mut admitted = 0;
    for _ in 0..calls {
        if call().await.expect("the fallback decides") {
            admitted += 1;
        }
    }
    admitted
}

/// The layer decides through the same code: with Redis gone, `8/h` over 4 instances admits
/// 2 requests, then answers 429 with the share in its headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_falls_back_to_the_share() {
    use axum::{Router, body::Body, http::Request, http::StatusCode, routing::get};
    use tower::ServiceExt as _;

    let mut server = RedisServer::start();
    let rg = Redguard::redis(server.url())
        .timeout(Duration::from_millis(100))
        .fail_mode(GuardKind::RateLimit, FailMode::local(4).unwrap())
        .connect()
        .await
        .unwrap();
    server.kill();
    let app = Router::new().route("/", get(|| async { "hello" })).layer(
        redguard::http::RateLimitLayer::builder(redguard::http::Global)
            .limit("all", "8/h")
            .on(&rg)
            .build()
            .unwrap(),
    );
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let response = app
            .clone()
            .oneshot(Request::get("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        statuses.push(response.status());
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            let policy = response.headers()["ratelimit-policy"].to_str().unwrap();
            assert!(policy.contains("q=2"), "{policy}");
        }
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

/// `FailMode::Local` is for rate limits: a lock or an idempotency key decided in one process
/// would not exclude the others, so `connect` refuses it for them.
#[tokio::test]
async fn a_local_fallback_is_refused_for_other_guards() {
    for guard in [GuardKind::Lock, GuardKind::Idempotency, GuardKind::Token] {
        let err = Redguard::memory_builder()
            .fail_mode(guard, FailMode::local(2).unwrap())
            .connect()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Config(m) if m.contains("rate limits only")),
            "{err:?}"
        );
    }
    assert!(FailMode::local(0).is_err());
    assert!(FailMode::local(redguard::handle::MAX_FALLBACK_INSTANCES + 1).is_err());
}

/// A call that may wait keeps waiting while Redis is down: the local share decides without
/// reservations, and a refusal of its that the wait covers is waited out and asked again
/// (one GCRA limit reserves its slot in the store; the fallback has none to reserve).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_calls_wait_for_the_local_share_while_redis_is_down() {
    let mut server = RedisServer::start();
    let rg = Redguard::redis(server.url())
        .timeout(Duration::from_millis(100))
        .fail_mode(GuardKind::RateLimit, FailMode::local(1).unwrap())
        .connect()
        .await
        .expect("connect to the test redis-server");
    server.kill();
    let limiter = rg
        .limiter("waiting")
        .scope("it::fallback::wait")
        .rate("10/s")
        .burst(1)
        .wait(Duration::from_secs(5));
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.check().await.map(drop) })
        })
        .collect();
    let mut admitted = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(()) => admitted += 1,
            Err(Error::RateLimited(d)) => panic!("refused although the wait covers it: {d:?}"),
            Err(err) => panic!("{err}"),
        }
    }
    assert_eq!(admitted, 5);
}

/// Issue 45 (item 8): `charge = after` during an outage. The reply's cost, settled after the
/// call, reaches the local share when Redis cannot take it: with `300/h` over 3 instances (a
/// share of 100 units), `cost = 10` and replies of 100 units, sequential calls consume at most
/// the share plus one call's overshoot past its admitted cost (100 + 90); here exactly one
/// call (100 units) is admitted, where the dropped settlements let 10 calls (1,000 units) in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charges_after_the_call_are_charged_to_the_share_during_an_outage() {
    const SHARE: u64 = 300 / 3;
    const COST: u64 = 10;
    const REPLY: u64 = 100;
    let mut server = RedisServer::start();
    let rg = Redguard::redis(server.url())
        .timeout(Duration::from_millis(100))
        .fail_mode(GuardKind::RateLimit, FailMode::local(3).unwrap())
        .connect()
        .await
        .unwrap();
    server.kill();
    let (admitted, refused) = rg
        .scope(async {
            let (mut admitted, mut refused) = (0, 0);
            for _ in 0..20 {
                match reply("acme", REPLY).await {
                    Ok(_) => admitted += 1,
                    Err(Error::RateLimited(d)) => {
                        assert!(d.retry_after > Duration::ZERO);
                        refused += 1;
                    }
                    Err(other) => panic!("{other:?}"),
                }
            }
            (admitted, refused)
        })
        .await;
    assert_eq!(admitted + refused, 20);
    let consumed = admitted * REPLY;
    assert!(
        consumed <= SHARE + (REPLY - COST),
        "{consumed} units consumed against a share of {SHARE} ({admitted} calls admitted)"
    );
    assert_eq!(admitted, 1, "the first reply's 100 units fill the share");

    // The same through `Limiter::reserve`: the settlement is charged locally and answered.
    let limiter = || {
        redguard::limiter("tenant:globex")
            .scope("it::fallback::charge")
            .rate("300/h")
            .cost(COST)
            .on(&rg)
    };
    let mut call = limiter()
        .reserve()
        .await
        .expect("the share admits one call");
    call.settle(REPLY)
        .await
        .expect("charged to the local share");
    assert_eq!(call.held(), REPLY);
    let refused = limiter().reserve().await.unwrap_err();
    assert!(matches!(refused, Error::RateLimited(_)), "{refused:?}");
}

struct Reply(u64);

impl redguard::rate::Cost for Reply {
    fn cost(&self) -> u64 {
        self.0
    }
}

#[redguard::rate_limit(
    key = "tenant:{tenant}",
    scope = "it::fallback::charge",
    rate = "300/h",
    cost = 10,
    charge = after
)]
async fn reply(tenant: &str, units: u64) -> redguard::Result<Reply> {
    Ok(Reply(units))
}

/// An outage does not lift a deny entry: a key the store refused as denied stays refused,
/// with its reason, while Redis is down, under `FailMode::Local` and `FailMode::Open` alike;
/// other keys fall back as ever (the share, or admitted), and a denial removed before the
/// outage is not repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_key_stays_denied_while_redis_is_down() {
    let mut server = RedisServer::start();
    let local = instance(&server).await;
    let open = Redguard::redis(server.url())
        .timeout(Duration::from_millis(100))
        .fail_mode(GuardKind::RateLimit, FailMode::Open)
        .connect()
        .await
        .unwrap();
    let tenant = |rg: &Redguard, t: &str| {
        redguard::limiter(redguard::key("tenant:{t}").part("t", t))
            .scope("api::denied")
            .rate("100/s")
            .on(rg)
    };
    // The operator's own handle: one that removes an entry forgets every denial it knew.
    let admin = redguard::admin::Admin::new(redguard_tests::connect(&server).await);
    tenant(&local, "acme").check().await.unwrap();
    let hour = redguard::admin::QuotaTtl::For(Duration::from_secs(3600));
    for t in ["acme", "lifted"] {
        admin
            .deny_add("api::denied", &format!("tenant:{t}"), Some("abuse"), hour)
            .await
            .unwrap();
    }
    for rg in [&local, &open] {
        for t in ["acme", "lifted"] {
            assert!(matches!(
                tenant(rg, t).check().await,
                Err(Error::Denied { .. })
            ));
        }
    }
    // Lifted, and seen admitted again by both before the outage.
    assert!(
        admin
            .deny_remove("api::denied", "tenant:lifted")
            .await
            .unwrap()
    );
    for rg in [&local, &open] {
        tenant(rg, "lifted").check().await.unwrap();
    }

    server.kill();
    for rg in [&local, &open] {
        match tenant(rg, "acme").check().await {
            Err(Error::Denied { reason, .. }) => assert_eq!(reason.as_deref(), Some("abuse")),
            other => panic!(
                "{:?}: expected Denied during the outage, got {other:?}",
                rg.kind()
            ),
        }
        tenant(rg, "lifted").check().await.unwrap();
        tenant(rg, "globex").check().await.unwrap();
    }
}
