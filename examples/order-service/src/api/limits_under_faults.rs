//! The routes' rate limits, as `router` stacks them, under `redguard::testing`'s faults at
//! the rate-limit decision: a user's requests stay within their limit when decisions stall or
//! are applied twice, and the kit catches the one trade-off the defaults make on purpose: a
//! decision the store fails, or whose reply is lost, lets the request through uncounted.
//!
//! Time is Tokio's, paused: the memory store's clock and the history's follow it, so each
//! admission is timed as the store decided it. The requests are `POST /tokens`, whose limits
//! `per_user_and_api` builds as it does the orders': an order waits on SQLite, which sqlx
//! runs on threads of its own that paused time does not wait for, so the clock would jump to
//! the next timer (a request's deadline, seconds on) at each database call.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use redguard::clock::TokioClock;
use redguard::handle::FailMode;
use redguard::key::GuardKind;
use redguard::testing::{At, Fault, Faults, History, Point};
use redguard::{Redguard, Result};
use tower::ServiceExt as _;

use crate::orders::App;
use crate::{Config, Db};

/// Requests offered per tick, and ticks: 40 a second for 10 s against the default per-user
/// limit of 1/s with a burst of 5, so the limit refuses most of them.
const PER_TICK: usize = 4;
const TICKS: u32 = 100;
const TICK: Duration = Duration::from_millis(100);

/// The most a GCRA limit of rate N per W with burst B admits within a span of W: B + N − 1
/// (the whole burst, then one per emission interval).
fn at_most(config: &Config) -> usize {
    let per_window = usize::try_from(config.token_rate.count()).expect("count");
    usize::try_from(config.token_burst).expect("burst") + per_window - 1
}

/// The service's routes on `rg` with the `--dev` settings and a fresh database holding
/// plenty of `SK-1`.
pub(super) async fn service(dir: &tempfile::TempDir) -> (Router, Config) {
    let path = dir.path().join("orders.db");
    let args: [std::ffi::OsString; 4] = [
        "order-service".into(),
        "--dev".into(),
        "--order-db".into(),
        path.clone().into(),
    ];
    let config = Config::load(args).expect("config");
    let db = Db::open(&path).await.expect("database");
    db.set_stock(config.deadline(), "SK-1".into(), 100_000, 100)
        .await
        .expect("stock");
    let app = Arc::new(App {
        db,
        store: "memory",
        instance: "test".into(),
        keys: crate::auth::Keys::new(&config),
        writes: Arc::default(),
        config: config.clone(),
    });
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .build_recorder()
        .handle();
    let router = super::router(app, metrics).expect("router");
    (router, config)
}

/// `POST /orders` from the trusted gateway for user 7, a new idempotency key each time.
pub(super) fn order(n: usize) -> Request<Body> {
    let mut request = Request::post("/orders")
        .header("x-user-id", "7")
        .header("idempotency-key", format!("k-{n}"))
        .header("content-type", "application/json")
        .body(Body::from(r#"{"sku":"SK-1","qty":1}"#))
        .expect("request");
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 4000))));
    request
}

/// `POST /tokens` from the trusted gateway for user 7.
fn token_request() -> Request<Body> {
    let mut request = Request::post("/tokens")
        .header("x-user-id", "7")
        .body(Body::empty())
        .expect("request");
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 4000))));
    request
}

/// Offers user 7's token requests tick by tick through `rg` and records each one the limits let
/// through (anything but `429`, and but `503` from a limit failing closed) in a history on
/// the store's clock.
async fn offer(rg: &Redguard, router: &Router) -> (History, usize) {
    let admitted = History::with_clock(TokioClock::new());
    let refused = std::sync::atomic::AtomicUsize::new(0);
    rg.scope(async {
        for _ in 0..TICKS {
            // Each response is recorded as it arrives (a stalled decision is made, and
            // recorded, later than its neighbours).
            let sent = (0..PER_TICK).map(|_| {
                let (admitted, refused) = (&admitted, &refused);
                let response = router.clone().oneshot(token_request());
                async move {
                    match response.await.expect("infallible").status() {
                        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        _ => admitted.admitted("user:7"),
                    }
                }
            });
            futures_util::future::join_all(sent).await;
            tokio::time::sleep(TICK).await;
        }
    })
    .await;
    (admitted, refused.into_inner())
}

async fn faulty(fail_mode: FailMode, faults: Faults) -> Redguard {
    let store = Redguard::memory_builder()
        .fail_mode(GuardKind::RateLimit, fail_mode)
        .connect()
        .await
        .expect("memory handle");
    redguard::testing::faulty(&store, faults)
}

#[tokio::test]
async fn requests_stay_within_the_user_limit_when_decisions_stall_or_repeat() -> Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let (router, config) = service(&dir).await;
    // Once the database is open: sqlx's pool would see its connect time out at once.
    tokio::time::pause();
    for seed in 1..=3 {
        // Stalls shorter than the handle's timeout: a longer one is a failed decision.
        let kinds = vec![Fault::Stall(Duration::from_millis(60)), Fault::ApplyTwice];
        let faults = Faults::new().random_at(At::point(Point::RateCheck), seed, 0.3, kinds);
        let rg = faulty(FailMode::Open, faults.clone()).await;
        let (admitted, refused) = offer(&rg, &router).await;
        assert!(
            faults.injected().len() > 50,
            "seed {seed}: faults struck {} decisions",
            faults.injected().len()
        );
        assert!(refused > 0, "seed {seed}: the limit refused nothing");
        admitted.assert_at_most(at_most(&config), config.token_rate.period());
    }
    Ok(())
}

/// Rate limits fail open by default (an outage of the limiter is not an outage of the
/// service): a decision the store fails, or whose reply is lost (a refusal included), is an
/// admission nobody counted, and the checker shows the limit broken. Failing closed, the
/// same schedule keeps it.
#[tokio::test]
async fn a_failed_or_lost_decision_breaks_the_limit_only_when_failing_open() -> Result<()> {
    let dir = tempfile::tempdir().expect("tempdir");
    let (router, config) = service(&dir).await;
    // Once the database is open: sqlx's pool would see its connect time out at once.
    tokio::time::pause();
    let schedule = || {
        let kinds = vec![Fault::Fail, Fault::ReplyLost];
        Faults::new().random_at(At::point(Point::RateCheck), 7, 0.5, kinds)
    };

    let (open, _) = offer(&faulty(FailMode::Open, schedule()).await, &router).await;
    let broken = open
        .check_at_most(at_most(&config), config.token_rate.period())
        .expect_err("failing open admits past the limit");
    assert!(broken.calls.len() > at_most(&config), "{broken}");

    let (closed, refused) = offer(&faulty(FailMode::Closed, schedule()).await, &router).await;
    assert!(refused > 0);
    closed.assert_at_most(at_most(&config), config.token_rate.period());
    Ok(())
}
