//! Every cancellation point of a request through `IdempotencyLayer` and `RateLimitLayer`
//! (issue 25), on the memory store and on Redis (see `redguard_tests::cancel`): the request's
//! future, as the server holds it, is dropped after each poll (and, on Redis, while Redis is
//! paused), as a client disconnecting or a server timeout drops it.
//!
//! After each drop, once the cleanups it spawned have run:
//!
//! | dropped                       | record (handler attached) | record (`detach`, default) | a retry            |
//! |-------------------------------|---------------------------|----------------------------|--------------------|
//! | before the handler started    | none (begin undone)       | none                       | runs the handler   |
//! | in the handler                | UNKNOWN                   | runs on: SUCCESS           | `409` / replays    |
//! | after it, finish unanswered   | SUCCESS or PROCESSING     | SUCCESS                    | replays or `409`   |
//! | never (completed)             | SUCCESS                   | SUCCESS                    | replays            |
//!
//! The handler runs once in all, original and retry together. A rate-limited request is
//! charged at most once however it is dropped, exactly once when it was answered `200`, and
//! not at all when it was dropped before its check was sent.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::{get, post};
use http_body_util::BodyExt as _;
use redguard::http::{ClientIp, IdempotencyLayer, Policy, RateLimitLayer};
use redguard::rate::Algorithm;
use redguard_tests::cancel::{self, Attempt, Harness, Verdict};
use tower::ServiceExt as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cancellation_point_of_the_layers_on_memory() {
    let mut memory = Harness::memory();
    layer_requests(&mut memory).await;
    cancel::finish([memory]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cancellation_point_of_the_layers_on_redis() {
    let mut redis = Harness::redis().await;
    layer_requests(&mut redis).await;
    cancel::finish([redis]);
}

async fn layer_requests(h: &mut Harness) {
    h.sweep("IdempotencyLayer request", |at| idempotent(at, false))
        .await;
    h.sweep("IdempotencyLayer request, detached (default)", |at| {
        idempotent(at, true)
    })
    .await;
    h.sweep("RateLimitLayer request", rate_limited).await;
}

/// What the handler did.
#[derive(Debug, Default)]
struct Handler {
    runs: AtomicUsize,
    started: AtomicBool,
    finished: AtomicBool,
}

/// A route whose handler records itself in `handler` and awaits a few times before `201`.
fn orders(at: &Attempt, scope: &str, detach: bool, handler: Arc<Handler>) -> Router {
    let layer = IdempotencyLayer::builder()
        .scope(scope)
        .detach(detach)
        .on(&at.rg)
        .build()
        .expect("layer");
    Router::new()
        .route(
            "/orders",
            post(move || {
                let handler = handler.clone();
                async move {
                    handler.started.store(true, Ordering::SeqCst);
                    handler.runs.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    tokio::task::yield_now().await;
                    handler.finished.store(true, Ordering::SeqCst);
                    (StatusCode::CREATED, "order 7")
                }
            }),
        )
        .layer(layer)
}

/// The order, its body arriving in two chunks a turn of the runtime apart, as from a network:
/// the layer reads it whole before it begins the record, so a drop can land in between.
fn order() -> Request<Body> {
    let chunks = futures_util::stream::unfold(0, |sent| async move {
        let chunk = match sent {
            0 => "{\"sku\":",
            1 => "\"tea\"}",
            _ => return None,
        };
        tokio::task::yield_now().await;
        Some((Ok::<_, std::io::Error>(chunk), sent + 1))
    });
    Request::post("/orders")
        .header("idempotency-key", "\"k7\"")
        .body(Body::from_stream(chunks))
        .expect("request")
}

/// The status and body of a response, read whole.
async fn read(response: axum::response::Response) -> (StatusCode, bool, String) {
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (
        status,
        replayed,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// Where a request through the layer was dropped, or how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Dropped (or answered `503`: the store did not answer) before the handler started.
    BeforeHandler,
    InHandler,
    /// Dropped after the handler returned: the response was being read or recorded.
    Finishing,
    Completed,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::BeforeHandler => "before the handler",
            Phase::InHandler => "in the handler",
            Phase::Finishing => "finishing",
            Phase::Completed => "completed",
        }
    }
}

async fn idempotent(at: Attempt, detach: bool) -> Verdict {
    let scope = at.key("layer");
    let first = Arc::new(Handler::default());
    let app = orders(&at, &scope, detach, first.clone());
    let outcome = at.drive(app.clone().oneshot(order())).await;
    if detach {
        // A detached handler, once begun, finishes on its own.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    at.settle().await;
    let outcome = match outcome {
        Some(response) => Some(read(response.expect("infallible")).await),
        None => None,
    };
    let mut v = Verdict::new(outcome.is_some());
    let (started, finished) = (
        first.started.load(Ordering::SeqCst),
        first.finished.load(Ordering::SeqCst),
    );
    let phase = match (&outcome, started, finished) {
        (Some((StatusCode::CREATED, false, body)), true, true) if body == "order 7" => {
            Phase::Completed
        }
        (Some((StatusCode::SERVICE_UNAVAILABLE, ..)), false, _) | (None, false, _) => {
            Phase::BeforeHandler
        }
        (None, true, false) => Phase::InHandler,
        // A detached handler dropped mid-way ran on to its end meanwhile.
        (None, true, true) if detach => Phase::InHandler,
        (None, true, true) => Phase::Finishing,
        (Some(other), ..) => {
            v.check(false, || {
                format!("the request was answered {other:?} (handler started: {started})")
            });
            return v;
        }
    };
    v.landed(phase.name());
    // The record states (`status` field) documented for this phase.
    let documented: &[Option<&str>] = match (phase, detach) {
        (Phase::BeforeHandler, _) => &[None],
        // The core records a body dropped mid-way UNKNOWN: it may have done its effect.
        (Phase::InHandler, false) => &[Some("U")],
        (Phase::InHandler | Phase::Finishing, true) | (Phase::Completed, _) => &[Some("S")],
        (Phase::Finishing, false) => &[Some("S"), Some("P")],
    };
    if let Some(view) = at.view() {
        let record = format!("redguard:idem:{{{scope}:k7}}");
        let status = view.field(&record, "status").await;
        v.check(documented.contains(&status.as_deref()), || {
            format!("{phase:?}: record status {status:?}, documented {documented:?}")
        });
    }
    // The retry the client makes.
    let second = Arc::new(Handler::default());
    let retry_app = orders(&at, &scope, detach, second.clone());
    let retry = read(retry_app.oneshot(order()).await.expect("infallible")).await;
    let reran = second.runs.load(Ordering::SeqCst) > 0;
    let replayed = retry == (StatusCode::CREATED, true, "order 7".to_owned());
    let fresh = retry == (StatusCode::CREATED, false, "order 7".to_owned());
    let refused = retry.0 == StatusCode::CONFLICT;
    let ok = match (phase, detach) {
        (Phase::BeforeHandler, _) => fresh && reran,
        (Phase::InHandler, false) => refused && !reran,
        (Phase::Finishing, false) => (replayed || refused) && !reran,
        (Phase::InHandler | Phase::Finishing, true) | (Phase::Completed, _) => replayed && !reran,
    };
    v.check(ok, || {
        format!("{phase:?}: the retry got {retry:?}, its handler ran: {reran}")
    });
    let runs = first.runs.load(Ordering::SeqCst) + second.runs.load(Ordering::SeqCst);
    v.check(runs == 1, || {
        format!("{phase:?}: the handler ran {runs} times")
    });
    v
}

/// The sliding window (a log of admitted calls) shows exactly how many requests it charged.
const RATE: &str = "5/min";

async fn rate_limited(at: Attempt) -> Verdict {
    let scope = at.key("rl");
    let layer = RateLimitLayer::builder(ClientIp::peer())
        .policy(Policy::new("ip", RATE).algorithm(Algorithm::SlidingWindow))
        .scope(&scope)
        .on(&at.rg)
        .build()
        .expect("layer");
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    "hello"
                }
            }),
        )
        .layer(layer);
    let mut request = Request::get("/").body(Body::empty()).expect("request");
    request
        .extensions_mut()
        .insert(SocketAddr::from(([203, 0, 113, 7], 40000)));
    let outcome = at.drive(app.oneshot(request)).await;
    at.settle().await;
    let status = outcome.map(|response| response.expect("infallible").status());
    let peek = redguard::limiter(redguard::key("{key}").part("key", "203.0.113.7"))
        .scope(format!("{scope}.ip"))
        .rate(RATE)
        .algorithm(Algorithm::SlidingWindow)
        .on(&at.rg)
        .peek()
        .await
        .expect("peek");
    // A peek reports what would remain after one more call, when it would be admitted.
    let charged = peek.limit - peek.remaining - u64::from(peek.allowed);
    let mut v = Verdict::new(status.is_some());
    v.landed(match (status, charged) {
        (Some(_), _) => "completed",
        (None, 0) => "dropped, not charged",
        (None, _) => "dropped, charged",
    });
    v.check(charged <= 1, || {
        format!("charged {charged} times for one request")
    });
    let ran = runs.load(Ordering::SeqCst);
    v.check(ran <= 1, || format!("the handler ran {ran} times"));
    match status {
        // Admitted by the store: charged. (An admission by the fail mode when Redis did not
        // answer in time may or may not have been charged.)
        Some(StatusCode::OK) if at.view().is_none() => {
            v.check(charged == 1, || format!("answered 200, charged {charged}"));
        }
        Some(StatusCode::OK) => v.check(charged <= 1 && ran == 1, || {
            format!("answered 200, charged {charged}, the handler ran {ran} times")
        }),
        Some(other) => v.check(false, || format!("answered {other}")),
        None => {}
    }
    // On the memory store the check is never in flight: a handler that ran was charged.
    if ran == 1 && at.view().is_none() {
        v.check(charged == 1, || {
            format!("the handler ran, charged {charged}")
        });
    }
    v
}
