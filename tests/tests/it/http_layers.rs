//! The web integration (issue 15): `RateLimitLayer`, `IdempotencyLayer`, `IntoResponse for
//! redguard::Error`, the `IdempotencyKey` extractor and `Classify for anyhow::Error`, each
//! under a real axum `Router` driven with `oneshot`, on the memory store and a real Redis.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::BodyExt as _;
use redguard::http::{
    ClientIp, HeaderKey, IdempotencyKey, IdempotencyLayer, Policy, RateLimitLayer,
};
use redguard::{Error, ErrorClass, Redguard, idempotent};
use redguard_tests::on_memory_and_redis;
use tower::ServiceExt as _;

on_memory_and_redis!(
    rate_limit_adds_headers_then_answers_429,
    stacked_limits_are_all_or_nothing,
    a_global_policy_is_shared_and_decided_with_the_clients,
    trusted_proxies_only_are_believed,
    requests_without_a_valid_key_never_reach_the_store,
    an_inner_refusal_keeps_its_own_headers,
    concurrent_duplicates_run_the_handler_once,
    every_idempotency_status,
    business_failures_release_and_unknown_outcomes_keep_the_record,
    error_responses_never_show_keys,
    anyhow_errors_are_classified,
    a_disconnected_client_finds_its_result_and_timeouts_are_unknown,
);

fn from(peer: [u8; 4]) -> Request<Body> {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(SocketAddr::from((peer, 40000)));
    request
}

async fn body_json(response: Response) -> serde_json::Value {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("not JSON: {bytes:?}"))
}

async fn body_text(response: Response) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

async fn rate_limit_adds_headers_then_answers_429(rg: Redguard) {
    let layer = RateLimitLayer::builder(ClientIp::peer())
        .limit("ip", "2/min")
        .on(&rg)
        .build()
        .unwrap();
    let app = hello().layer(layer);

    let first = app.clone().oneshot(from([203, 0, 113, 1])).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["ratelimit-policy"], "\"ip\";q=2;w=60");
    assert_eq!(first.headers()["ratelimit"], "\"ip\";r=1;t=30");
    assert!(first.headers().get("retry-after").is_none());
    assert_eq!(body_text(first).await, "hello");

    let second = app.clone().oneshot(from([203, 0, 113, 1])).await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    let refused = app.clone().oneshot(from([203, 0, 113, 1])).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((29..=30).contains(&retry_after), "{retry_after}");
    assert_eq!(refused.headers()["ratelimit"], "\"ip\";r=0;t=60");
    assert_eq!(refused.headers()["ratelimit-policy"], "\"ip\";q=2;w=60");
    assert_eq!(refused.headers()["content-type"], "application/json");
    let body = body_json(refused).await;
    assert_eq!(body["error"], "rate_limited");

    // Another client has its own quota.
    let other = app.oneshot(from([203, 0, 113, 2])).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
}

async fn stacked_limits_are_all_or_nothing(rg: Redguard) {
    let layer = RateLimitLayer::builder(ClientIp::peer())
        .limit("small", "2/min")
        .policy(Policy::new("big", "10/min"))
        .scope("stacked")
        .on(&rg)
        .build()
        .unwrap();
    let app = hello().layer(layer);
    for _ in 0..2 {
        let ok = app.clone().oneshot(from([198, 51, 100, 1])).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        // The tightest policy in `RateLimit`, every policy in `RateLimit-Policy`.
        assert!(
            ok.headers()["ratelimit"]
                .to_str()
                .unwrap()
                .starts_with("\"small\"")
        );
        assert_eq!(
            ok.headers()["ratelimit-policy"],
            "\"small\";q=2;w=60, \"big\";q=10;w=60"
        );
    }
    for _ in 0..3 {
        let refused = app.clone().oneshot(from([198, 51, 100, 1])).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    // The refusals by `small` charged `big` nothing: 2 of 10 used, a peek says 7 after one more.
    let big = redguard::limiter(redguard::key("{key}").part("key", "198.51.100.1"))
        .scope("stacked.big")
        .rate("10/min")
        .on(&rg);
    assert_eq!(big.peek().await.unwrap().remaining, 7);
}

/// `Policy::global`: one count for every client, decided all-or-nothing with the per-client
/// policy of the same layer.
async fn a_global_policy_is_shared_and_decided_with_the_clients(rg: Redguard) {
    let layer = RateLimitLayer::builder(ClientIp::peer())
        .limit("ip", "2/min")
        .policy(Policy::new("api", "5/min").global())
        .scope("mixed")
        .on(&rg)
        .build()
        .unwrap();
    let app = hello().layer(layer);
    // Client 1 uses its 2 and is refused 3 times: the refusals cost the API budget nothing.
    for expected in [200, 200, 429, 429, 429] {
        let response = app.clone().oneshot(from([198, 51, 100, 1])).await.unwrap();
        assert_eq!(response.status(), expected);
    }
    // Three more clients share the 3 left of 5; the fourth is refused by `api`.
    for (peer, expected) in [(2, 200), (3, 200), (4, 200), (5, 429)] {
        let response = app
            .clone()
            .oneshot(from([198, 51, 100, peer]))
            .await
            .unwrap();
        assert_eq!(response.status(), expected, "client {peer}");
    }
    // The refusal by `api` charged client 5's own limit nothing.
    let ip = redguard::limiter(redguard::key("{key}").part("key", "198.51.100.5"))
        .scope("mixed.ip")
        .rate("2/min")
        .on(&rg);
    assert_eq!(ip.peek().await.unwrap().remaining, 1);
}

async fn trusted_proxies_only_are_believed(rg: Redguard) {
    let layer = RateLimitLayer::builder(ClientIp::behind(["10.0.0.0/8"]).unwrap())
        .limit("ip", "1/min")
        .on(&rg)
        .build()
        .unwrap();
    let app = hello().layer(layer);
    let via = |peer: [u8; 4], xff: &str| {
        let mut request = from(peer);
        request
            .headers_mut()
            .insert("x-forwarded-for", xff.parse().unwrap());
        request
    };
    let status = |app: Router, request: Request<Body>| async move {
        app.oneshot(request).await.unwrap().status()
    };

    // Through our proxy: the client is the rightmost untrusted entry.
    assert_eq!(
        status(app.clone(), via([10, 0, 0, 2], "198.51.100.7")).await,
        StatusCode::OK
    );
    assert_eq!(
        status(app.clone(), via([10, 0, 0, 3], "198.51.100.7")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A client prepending addresses of its own cannot pick a fresh bucket...
    assert_eq!(
        status(app.clone(), via([10, 0, 0, 2], "1.2.3.4, 198.51.100.7")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // ...and one talking to us directly is its peer address, whatever it claims.
    assert_eq!(
        status(app.clone(), via([203, 0, 113, 9], "198.51.100.8")).await,
        StatusCode::OK
    );
    assert_eq!(
        status(app.clone(), via([203, 0, 113, 9], "198.51.100.99")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another client behind the proxy has its own quota.
    assert_eq!(
        status(app, via([10, 0, 0, 2], "198.51.100.8")).await,
        StatusCode::OK
    );
}

async fn requests_without_a_valid_key_never_reach_the_store(rg: Redguard) {
    let layer = RateLimitLayer::builder(HeaderKey::new("x-api-key").unwrap())
        .limit("key", "100/s")
        .on(&rg)
        .build()
        .unwrap();
    let app = hello().layer(layer);
    let missing = app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert_eq!(body_json(missing).await["error"], "bad_request");
    let bad = Request::get("/")
        .header("x-api-key", "key with spaces")
        .body(Body::empty())
        .unwrap();
    let bad = app.clone().oneshot(bad).await.unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let body = body_json(bad).await;
    assert_eq!(body["error"], "bad_request");
    assert!(!body.to_string().contains("key with spaces"), "{body}");
    let good = Request::get("/")
        .header("x-api-key", "k-1")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.oneshot(good).await.unwrap().status(), StatusCode::OK);

    // No peer address: the server is misconfigured, not the client.
    let ip = hello().layer(
        RateLimitLayer::builder(ClientIp::peer())
            .limit("ip", "1/s")
            .on(&rg)
            .build()
            .unwrap(),
    );
    let no_peer = ip
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(no_peer.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

/// A handler with its own, tighter limit than the layer around it.
#[redguard::rate_limit(key = "user:{user}", rate = "2/min", scope = "inner")]
async fn per_user(user: String) -> Result<&'static str, Error> {
    let _ = user;
    Ok("hello")
}

/// Issue 45: the layer's admission headers must not overwrite the handler's own refusal.
async fn an_inner_refusal_keeps_its_own_headers(rg: Redguard) {
    let layer = RateLimitLayer::builder(ClientIp::peer())
        .limit("plan", "200/s")
        .on(&rg)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| per_user("ann".to_owned())))
        .layer(layer);
    let call = || rg.scope(app.clone().oneshot(from([203, 0, 113, 1])));

    let first = call().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // Admitted by both: the layer's headers describe the layer's quota.
    assert_eq!(first.headers()["ratelimit"], "\"plan\";r=199;t=1");
    call().await.unwrap();
    let refused = call().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["ratelimit"], "\"default\";r=0;t=60");
    assert_eq!(
        refused.headers()["ratelimit-policy"],
        "\"default\";q=2;w=60"
    );
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((29..=30).contains(&retry_after), "{retry_after}");
    assert_eq!(body_json(refused).await["error"], "rate_limited");
}

/// An order endpoint counting its runs; answers `201` after `delay`.
fn orders(runs: Arc<AtomicUsize>, delay: Duration) -> Router {
    Router::new().route(
        "/orders",
        post(move |body: String| {
            let runs = Arc::clone(&runs);
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(delay).await;
                (
                    StatusCode::CREATED,
                    [
                        ("location", format!("/orders/{n}")),
                        ("x-run", n.to_string()),
                    ],
                    format!("order {n}: {body}"),
                )
            }
        }),
    )
}

fn order(key: &str, body: &str) -> Request<Body> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .body(Body::from(body.to_owned()))
        .unwrap()
}

async fn concurrent_duplicates_run_the_handler_once(rg: Redguard) {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = orders(Arc::clone(&runs), Duration::from_millis(300))
        .layer(IdempotencyLayer::builder().on(&rg).build().unwrap());
    let tasks: Vec<_> = (0..30)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { app.oneshot(order("dup-1", "tea")).await.unwrap() })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        let response = task.await.unwrap();
        match response.status() {
            StatusCode::CREATED => {
                created += 1;
                assert_eq!(body_text(response).await, "order 1: tea");
            }
            StatusCode::CONFLICT => {
                assert_eq!(body_json(response).await["error"], "in_progress");
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert!(created >= 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // A retry after it finished gets the recorded response: status, chosen headers, body.
    let replay = app.oneshot(order("dup-1", "tea")).await.unwrap();
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["location"], "/orders/1");
    assert!(
        replay.headers().get("x-run").is_none(),
        "not a replayed header"
    );
    assert_eq!(body_text(replay).await, "order 1: tea");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn every_idempotency_status(rg: Redguard) {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = orders(Arc::clone(&runs), Duration::ZERO)
        .route("/orders", get(|| async { "list" }))
        .layer(
            IdempotencyLayer::builder()
                .max_body(64)
                .on(&rg)
                .build()
                .unwrap(),
        );
    let call = |request| {
        let app = app.clone();
        async move { app.oneshot(request).await.unwrap() }
    };

    let fresh = call(order("\"k-1\"", "a")).await;
    assert_eq!(fresh.status(), StatusCode::CREATED);
    assert!(fresh.headers().get("idempotent-replayed").is_none());
    // 422: the same key with another payload.
    let reuse = call(order("k-1", "b")).await;
    assert_eq!(reuse.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body_json(reuse).await["error"], "key_reuse");
    // 400: missing and invalid keys.
    let missing = call(Request::post("/orders").body(Body::from("a")).unwrap()).await;
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert_eq!(body_json(missing).await["error"], "bad_request");
    let invalid = call(order("not a key", "a")).await;
    assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
    // 413: a body over the limit, declared or streamed.
    let big = call(order("k-2", &"x".repeat(65))).await;
    assert_eq!(big.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let stream = futures_stream(&"y".repeat(100));
    let streamed = call(
        Request::post("/orders")
            .header("idempotency-key", "k-3")
            .body(stream)
            .unwrap(),
    )
    .await;
    assert_eq!(streamed.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // GET is not guarded: no key needed.
    let list = call(Request::get("/orders").body(Body::empty()).unwrap()).await;
    assert_eq!(list.status(), StatusCode::OK);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Not required: a request without the key passes through, unguarded.
    let optional = orders(Arc::clone(&runs), Duration::ZERO).layer(
        IdempotencyLayer::builder()
            .required(false)
            .scope("optional")
            .on(&rg)
            .build()
            .unwrap(),
    );
    for _ in 0..2 {
        let response = optional
            .clone()
            .oneshot(Request::post("/orders").body(Body::from("a")).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// A body of unknown length (no `Content-Length`).
fn futures_stream(text: &str) -> Body {
    let chunks: Vec<Result<String, std::io::Error>> = text
        .as_bytes()
        .chunks(10)
        .map(|c| Ok(String::from_utf8(c.to_vec()).unwrap()))
        .collect();
    Body::from_stream(futures_util::stream::iter(chunks))
}

async fn business_failures_release_and_unknown_outcomes_keep_the_record(rg: Redguard) {
    // Answers in turn 409 (business), 201; and for `/flaky` 502 (unknown outcome).
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/orders",
            post(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        (StatusCode::CONFLICT, "out of stock").into_response()
                    } else {
                        (StatusCode::CREATED, "ok").into_response()
                    }
                }
            }),
        )
        .route("/flaky", post(|| async { StatusCode::BAD_GATEWAY }))
        .layer(IdempotencyLayer::builder().on(&rg).build().unwrap());

    let first = app.clone().oneshot(order("biz-1", "x")).await.unwrap();
    assert_eq!(first.status(), StatusCode::CONFLICT);
    assert_eq!(body_text(first).await, "out of stock");
    // Released: the retry runs again and succeeds.
    let retry = app.clone().oneshot(order("biz-1", "x")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let flaky = |key: &str| {
        Request::post("/flaky")
            .header("idempotency-key", key)
            .body(Body::empty())
            .unwrap()
    };
    let unknown = app.clone().oneshot(flaky("up-1")).await.unwrap();
    assert_eq!(unknown.status(), StatusCode::BAD_GATEWAY);
    // Recorded UNKNOWN: the retry is refused, not run blindly, and told it was not a twin.
    let refused = app.oneshot(flaky("up-1")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    assert!(refused.headers().get("retry-after").is_none());
    assert_eq!(body_json(refused).await["error"], "outcome_unknown");
}

async fn error_responses_never_show_keys(rg: Redguard) {
    let key = rg
        .key(
            redguard::key::GuardKind::Lock,
            "shop::stock",
            &redguard::key::KeyBuilder::new()
                .part("sku", "tea-1")
                .finish()
                .unwrap(),
        )
        .unwrap()
        .to_string();
    let errors = [
        Error::LockTimeout {
            key: key.clone(),
            waited: Duration::from_millis(300),
        },
        Error::LockHeld { key: key.clone() },
        Error::LockLost { key: key.clone() },
        Error::Corrupt {
            key: key.clone(),
            detail: "WRONGTYPE at 10.1.2.3:6379".into(),
        },
        Error::InvalidKey {
            part: "sku".into(),
            rule: redguard::key::KeyRule::Empty,
        },
        Error::Config("redis://:hunter2@10.1.2.3".into()),
        Error::InProgress,
        Error::KeyReuse,
    ];
    let expected = [
        (503, "busy"),
        (503, "busy"),
        (503, "unavailable"),
        (500, "internal"),
        (400, "bad_request"),
        (500, "internal"),
        (409, "in_progress"),
        (422, "key_reuse"),
    ];
    for (err, (status, code)) in errors.into_iter().zip(expected) {
        let shown = err.to_string();
        let response = err.into_response();
        assert_eq!(response.status().as_u16(), status, "{shown}");
        let headers: HeaderMap = response.headers().clone();
        let body = body_json(response).await;
        assert_eq!(body["error"], code, "{shown}");
        let text = body.to_string();
        for secret in [
            "redguard",
            "shop",
            "tea-1",
            "10.1.2.3",
            "hunter2",
            "WRONGTYPE",
        ] {
            assert!(!text.contains(secret), "{text} shows {secret}");
        }
        if status == 503 {
            assert_eq!(headers["retry-after"], "1");
        }
    }
    // A real refusal through the layer says as little.
    let app = hello().layer(
        RateLimitLayer::builder(ClientIp::peer())
            .limit("ip", "1/h")
            .on(&rg)
            .build()
            .unwrap(),
    );
    app.clone().oneshot(from([192, 0, 2, 1])).await.unwrap();
    let refused = body_json(app.oneshot(from([192, 0, 2, 1])).await.unwrap()).await;
    let text = refused.to_string();
    assert!(
        !text.contains(rg.prefix()) && !text.contains("192.0.2.1"),
        "{text}"
    );
}

async fn a_disconnected_client_finds_its_result_and_timeouts_are_unknown(rg: Redguard) {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = orders(Arc::clone(&runs), Duration::from_millis(300))
        .layer(IdempotencyLayer::builder().on(&rg).build().unwrap());
    // The client gives up mid-request: the handler still finishes and is recorded.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        app.clone().oneshot(order("gone-1", "tea")),
    )
    .await;
    assert!(gave_up.is_err());
    tokio::time::sleep(Duration::from_millis(600)).await;
    let retry = app.oneshot(order("gone-1", "tea")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A handler past the layer's timeout: 503, the outcome unknown, the retry refused.
    let slow = orders(Arc::clone(&runs), Duration::from_millis(500)).layer(
        IdempotencyLayer::builder()
            .timeout(Duration::from_millis(100))
            .scope("slow")
            .on(&rg)
            .build()
            .unwrap(),
    );
    let timed_out = slow.clone().oneshot(order("slow-1", "tea")).await.unwrap();
    assert_eq!(timed_out.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(timed_out.headers()["retry-after"], "1");
    let refused = slow.oneshot(order("slow-1", "tea")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
}

/// The layers follow the handle's `FailMode` when the store cannot answer: rate limits
/// admit (open), idempotency answers 503 (closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_follows_the_fail_modes() {
    let server = redguard_tests::RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = orders(Arc::clone(&runs), Duration::ZERO)
        .layer(IdempotencyLayer::builder().on(&rg).build().unwrap())
        .layer(
            RateLimitLayer::builder(redguard::http::Global)
                .limit("all", "100/s")
                .on(&rg)
                .build()
                .unwrap(),
        );
    drop(server);
    let rate_only = hello().layer(
        RateLimitLayer::builder(redguard::http::Global)
            .limit("all", "100/s")
            .on(&rg)
            .build()
            .unwrap(),
    );
    let admitted = rate_only
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    let refused = app.oneshot(order("down-1", "tea")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body = body_json(refused).await;
    assert_eq!(body["error"], "unavailable");
    assert!(!body.to_string().contains("127.0.0.1"), "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[idempotent(key = "charge:{id}", expire = 60)]
async fn charge(id: u64, outcome: &'static str, runs: &AtomicUsize) -> anyhow::Result<u64> {
    runs.fetch_add(1, Ordering::SeqCst);
    match outcome {
        "ok" => Ok(id),
        "declined" => {
            Err(anyhow::anyhow!("card declined")).map_err(|e| e.context(ErrorClass::Business))
        }
        _ => Err(anyhow::anyhow!("payment gateway timed out")),
    }
}

async fn anyhow_errors_are_classified(rg: Redguard) {
    let runs = AtomicUsize::new(0);
    rg.scope(async {
        // Declared business: released, the retry runs.
        assert!(charge(1, "declined", &runs).await.is_err());
        assert_eq!(charge(1, "ok", &runs).await.unwrap(), 1);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        // Unclassified: the outcome is unknown, the retry is refused.
        assert!(charge(2, "timeout", &runs).await.is_err());
        let err = charge(2, "ok", &runs).await.unwrap_err();
        assert!(
            matches!(err.downcast_ref::<Error>(), Some(Error::OutcomeUnknown)),
            "{err:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    })
    .await;
}

#[tokio::test]
async fn idempotency_key_extractor_and_rejections() {
    async fn required(key: IdempotencyKey) -> String {
        key.as_str().to_owned()
    }
    async fn optional(key: Option<IdempotencyKey>) -> String {
        key.map_or_else(|| "none".to_owned(), |k| k.to_string())
    }
    let app = Router::new()
        .route("/required", post(required))
        .route("/optional", post(optional));
    let call = |path: &str, key: Option<&str>| {
        let mut request = Request::post(path);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        app.clone().oneshot(request.body(Body::empty()).unwrap())
    };
    let ok = call("/required", Some("\"abc-1\"")).await.unwrap();
    assert_eq!(body_text(ok).await, "abc-1");
    let missing = call("/required", None).await.unwrap();
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert_eq!(missing.headers()["content-type"], "application/json");
    assert_eq!(body_json(missing).await["error"], "bad_request");
    let none = call("/optional", None).await.unwrap();
    assert_eq!(body_text(none).await, "none");
    let malformed = call("/optional", Some("a b")).await.unwrap();
    assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);
    let too_long = call("/required", Some(&"k".repeat(65))).await.unwrap();
    assert_eq!(too_long.status(), StatusCode::BAD_REQUEST);
}

/// Two instances (two handles, two connections) on one Redis share records and quotas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis() {
    let server = redguard_tests::RedisServer::start();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut apps = Vec::new();
    for _ in 0..2 {
        let rg = redguard_tests::connect(&server).await;
        let app = orders(Arc::clone(&runs), Duration::from_millis(200))
            .layer(IdempotencyLayer::builder().on(&rg).build().unwrap())
            .layer(
                RateLimitLayer::builder(redguard::http::Global)
                    .limit("all", "3/min")
                    .on(&rg)
                    .build()
                    .unwrap(),
            );
        apps.push(app);
    }
    let (a, b) = tokio::join!(
        apps[0].clone().oneshot(order("inst-1", "tea")),
        apps[1].clone().oneshot(order("inst-1", "tea")),
    );
    let mut statuses = [a.unwrap().status(), b.unwrap().status()];
    statuses.sort();
    assert_eq!(statuses, [StatusCode::CREATED, StatusCode::CONFLICT]);
    let replay = apps[1]
        .clone()
        .oneshot(order("inst-1", "tea"))
        .await
        .unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Three requests used the shared quota of 3: the fourth, on either instance, is refused.
    let limited = apps[0]
        .clone()
        .oneshot(order("inst-2", "tea"))
        .await
        .unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    server.assert_every_key_has_ttl();
}

/// `Redguard::scope` does not reach into `tokio::spawn`; `redguard::spawn` carries it, and
/// the error says which case it is.
#[tokio::test]
async fn spawned_tasks_and_the_scope() {
    let rg = Redguard::memory();
    rg.scope(async {
        let issue = || async { redguard::tokens().issue("s", Duration::from_secs(60)).await };
        let lost = tokio::spawn(issue()).await.unwrap();
        let err = lost.unwrap_err();
        assert!(matches!(err, Error::NotInScope { .. }), "{err:?}");
        assert!(err.to_string().contains("redguard::spawn"), "{err}");
        let carried = redguard::spawn(issue()).await.unwrap();
        assert!(carried.is_ok());
    })
    .await;
    // Outside any scope, with nothing installed: the plain message.
    let err = redguard::tokens()
        .issue("s", Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotInstalled), "{err:?}");
}

/// Every response a layer answers itself carries its `Rejection` (for outer layers), and
/// `on_rejection` renders the body while the layer keeps the headers.
#[tokio::test]
async fn rejections_are_in_the_extensions_and_can_be_rendered() {
    use bytes::Bytes;
    use http_body_util::Full;
    use redguard::http::Rejection;

    let rg = Redguard::memory();
    let plain = |rejection: &Rejection| {
        let mut response = axum::http::Response::new(Full::new(Bytes::from(format!(
            "nope: {}",
            rejection.code()
        ))));
        *response.status_mut() = rejection.status();
        response
    };
    let app = hello().layer(
        RateLimitLayer::builder(ClientIp::peer())
            .limit("ip", "1/h")
            .on_rejection(plain)
            .on(&rg)
            .build()
            .unwrap(),
    );
    app.clone().oneshot(from([192, 0, 2, 7])).await.unwrap();
    let refused = app.oneshot(from([192, 0, 2, 7])).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(refused.headers()["ratelimit-policy"], "\"ip\";q=1;w=3600");
    let rejection = refused.extensions().get::<Rejection>().unwrap().clone();
    assert_eq!(rejection.code(), "rate_limited");
    assert_eq!(body_text(refused).await, "nope: rate_limited");

    let orders = orders(Arc::new(AtomicUsize::new(0)), Duration::ZERO)
        .layer(IdempotencyLayer::builder().on(&rg).build().unwrap());
    let missing = orders
        .oneshot(Request::post("/orders").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        missing.extensions().get::<Rejection>().unwrap().code(),
        "bad_request"
    );
    // A guard error answered by `IntoResponse` carries it too.
    let response = Error::KeyReuse.into_response();
    assert_eq!(
        response.extensions().get::<Rejection>().unwrap().status(),
        422
    );
}
