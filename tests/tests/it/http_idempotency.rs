//! `IdempotencyLayer`'s response handling (issue 25): the live response is the handler's,
//! replays carry the chosen headers as bytes, a response that came from a
//! `redguard::Error` (or that a handler marked) is classified by its class, and a body
//! larger than `max_response` or streamed is passed through as it streams.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt as _;
use redguard::http::IdempotencyLayer;
use redguard::{ErrorClass, Redguard};
use redguard_tests::on_memory_and_redis;
use tower::ServiceExt as _;

on_memory_and_redis!(
    the_live_response_keeps_every_handler_header,
    replay_headers_are_bytes_and_keep_their_order,
    a_busy_lock_in_the_handler_lets_the_retry_run,
    a_handler_can_mark_its_response_business,
    a_streaming_response_answers_its_first_chunk_promptly,
    a_body_over_max_response_streams_whole_and_is_not_replayed,
    a_record_of_the_first_format_is_answered_not_panicked_on,
    the_5xx_policy_is_the_classifiers,
    a_corrected_retry_after_a_business_failure_runs,
);

fn post_with_key(path: &str, key: &str, body: &'static [u8]) -> Request<Body> {
    Request::post(path)
        .header("idempotency-key", key)
        .body(Body::from(body))
        .unwrap()
}

async fn bytes_of(response: Response) -> Vec<u8> {
    response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec()
}

async fn code_of(response: Response) -> String {
    let body: serde_json::Value = serde_json::from_slice(&bytes_of(response).await).unwrap();
    body["error"].as_str().unwrap().to_owned()
}

/// A `201` with a session cookie, caching and tracing headers and two `Link` values.
fn with_headers() -> Response {
    let mut response = (StatusCode::CREATED, "created").into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::SET_COOKIE,
        HeaderValue::from_static("session=s3cr3t"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-request-id", HeaderValue::from_static("req-1"));
    headers.insert(header::LOCATION, HeaderValue::from_static("/orders/1"));
    headers.append(header::LINK, HeaderValue::from_static("</a>; rel=first"));
    headers.append(header::LINK, HeaderValue::from_static("</b>; rel=second"));
    response
}

async fn the_live_response_keeps_every_handler_header(rg: Redguard) {
    let app = Router::new()
        .route("/orders", post(|| async { with_headers() }))
        .layer(IdempotencyLayer::builder().on(&rg).build().unwrap());

    let first = app
        .clone()
        .oneshot(post_with_key("/orders", "h-1", b"a"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let headers = first.headers();
    assert_eq!(headers[header::SET_COOKIE], "session=s3cr3t");
    assert_eq!(headers[header::CACHE_CONTROL], "no-store");
    assert_eq!(headers["x-request-id"], "req-1");
    let links: Vec<_> = headers.get_all(header::LINK).iter().collect();
    assert_eq!(links, ["</a>; rel=first", "</b>; rel=second"]);
    assert_eq!(bytes_of(first).await, b"created");

    // The replay carries the default set only: never the first caller's cookie.
    let replay = app
        .oneshot(post_with_key("/orders", "h-1", b"a"))
        .await
        .unwrap();
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()[header::LOCATION], "/orders/1");
    assert_eq!(
        replay.headers()[header::CONTENT_TYPE],
        "text/plain; charset=utf-8"
    );
    for absent in [header::SET_COOKIE, header::CACHE_CONTROL, header::LINK] {
        assert!(replay.headers().get(&absent).is_none(), "{absent} replayed");
    }
    assert_eq!(bytes_of(replay).await, b"created");
}

/// `attachment; filename="thé €.txt"` in UTF-8: obs-text, legal in a field value.
const DISPOSITION: &[u8] = "attachment; filename=\"th\u{e9} \u{20ac}.txt\"".as_bytes();

async fn replay_headers_are_bytes_and_keep_their_order(rg: Redguard) {
    let app = Router::new()
        .route(
            "/files",
            post(|| async {
                let mut response = with_headers();
                response.headers_mut().insert(
                    header::CONTENT_DISPOSITION,
                    HeaderValue::from_bytes(DISPOSITION).unwrap(),
                );
                response
            }),
        )
        .layer(
            IdempotencyLayer::builder()
                .replay_headers([header::CONTENT_DISPOSITION, header::LINK])
                .on(&rg)
                .build()
                .unwrap(),
        );
    for replayed in [false, true] {
        let response = app
            .clone()
            .oneshot(post_with_key("/files", "f-1", b""))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(
            response.headers().contains_key("idempotent-replayed"),
            replayed
        );
        let disposition = response.headers().get(header::CONTENT_DISPOSITION);
        assert_eq!(
            disposition.map(HeaderValue::as_bytes),
            Some(DISPOSITION),
            "replayed: {replayed}"
        );
        let links: Vec<_> = response.headers().get_all(header::LINK).iter().collect();
        assert_eq!(
            links,
            ["</a>; rel=first", "</b>; rel=second"],
            "replayed: {replayed}"
        );
        if replayed {
            // Only the chosen names: not even the default set.
            assert!(response.headers().get(header::LOCATION).is_none());
        }
    }
}

async fn a_busy_lock_in_the_handler_lets_the_retry_run(rg: Redguard) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/orders",
            post(move || {
                let counter = Arc::clone(&counter);
                async move {
                    let guard = redguard::lock("stock:SK-1")
                        .wait(Duration::from_millis(50))
                        .acquire()
                        .await?;
                    counter.fetch_add(1, Ordering::SeqCst);
                    guard.release().await?;
                    Ok::<_, redguard::Error>((StatusCode::CREATED, "ordered"))
                }
            }),
        )
        .layer(IdempotencyLayer::builder().on(&rg).build().unwrap());

    let holder = rg.lock("stock:SK-1").acquire().await.unwrap();
    let busy = app
        .clone()
        .oneshot(post_with_key("/orders", "busy-1", b"x"))
        .await
        .unwrap();
    assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(busy.headers().contains_key(header::RETRY_AFTER));
    assert_eq!(code_of(busy).await, "busy");
    holder.release().await.unwrap();

    // Nothing ran: the retry runs the body.
    let retry = app
        .oneshot(post_with_key("/orders", "busy-1", b"x"))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED, "the retry was refused");
    assert_eq!(bytes_of(retry).await, b"ordered");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn a_handler_can_mark_its_response_business(rg: Redguard) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/orders",
            post(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        // Shed before doing anything: a retry may run.
                        let mut response = StatusCode::SERVICE_UNAVAILABLE.into_response();
                        response.extensions_mut().insert(ErrorClass::Business);
                        response
                    } else if n == 1 {
                        // A 4xx whose outcome the handler knows to be unknown.
                        let mut response = StatusCode::CONFLICT.into_response();
                        response.extensions_mut().insert(ErrorClass::Indeterminate);
                        response
                    } else {
                        (StatusCode::CREATED, "ordered").into_response()
                    }
                }
            }),
        )
        .layer(IdempotencyLayer::builder().on(&rg).build().unwrap());

    let shed = app
        .clone()
        .oneshot(post_with_key("/orders", "m-1", b"x"))
        .await
        .unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    let unknown = app
        .clone()
        .oneshot(post_with_key("/orders", "m-1", b"x"))
        .await
        .unwrap();
    assert_eq!(unknown.status(), StatusCode::CONFLICT);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the marked 503 released the key"
    );
    // The marked 409 kept the record: the next retry is refused, not run.
    let refused = app
        .oneshot(post_with_key("/orders", "m-1", b"x"))
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    assert!(refused.headers().get(header::RETRY_AFTER).is_none());
    assert_eq!(code_of(refused).await, "outcome_unknown");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// the guide: a business failure releases the record, so the client corrects its request and
/// retries with the same key (the failed attempt's fingerprint does not hold the key).
async fn a_corrected_retry_after_a_business_failure_runs(rg: Redguard) {
    let app = Router::new()
        .route(
            "/orders",
            post(|body: String| async move {
                if body == "bad" {
                    (StatusCode::BAD_REQUEST, "fix the sku").into_response()
                } else {
                    (StatusCode::CREATED, "ordered").into_response()
                }
            }),
        )
        .layer(IdempotencyLayer::builder().on(&rg).build().unwrap());
    let rejected = app
        .clone()
        .oneshot(post_with_key("/orders", "fix-1", b"bad"))
        .await
        .unwrap();
    assert_eq!(rejected.status(), StatusCode::BAD_REQUEST);
    let corrected = app
        .clone()
        .oneshot(post_with_key("/orders", "fix-1", b"good"))
        .await
        .unwrap();
    assert_eq!(corrected.status(), StatusCode::CREATED);
    // Recorded now: the corrected payload's replay, and the first payload is a reuse.
    let replay = app
        .clone()
        .oneshot(post_with_key("/orders", "fix-1", b"good"))
        .await
        .unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let reuse = app
        .oneshot(post_with_key("/orders", "fix-1", b"bad"))
        .await
        .unwrap();
    assert_eq!(reuse.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

/// An event stream: one event at once, then nothing for a minute.
fn event_stream() -> Body {
    let first = futures_util::stream::once(async {
        Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"data: 1\n\n"))
    });
    let stalled = futures_util::stream::once(async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(bytes::Bytes::from_static(b"data: 2\n\n"))
    });
    Body::from_stream(futures_util::StreamExt::chain(first, stalled))
}

async fn a_streaming_response_answers_its_first_chunk_promptly(rg: Redguard) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/events",
            post(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async move {
                    (
                        [(header::CONTENT_TYPE, "text/event-stream")],
                        event_stream(),
                    )
                }
            }),
        )
        .layer(IdempotencyLayer::builder().on(&rg).build().unwrap());

    // Generous bounds for a loaded machine; the stream's second event is a minute away.
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        app.clone().oneshot(post_with_key("/events", "sse-1", b"")),
    )
    .await
    .expect("the streaming route never answered")
    .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    let mut body = response.into_body();
    let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("the first event never came")
        .unwrap()
        .unwrap();
    assert_eq!(frame.into_data().unwrap(), "data: 1\n\n");
    drop(body);

    // Not recorded as a replayable success: a retry is refused (the handler answered, so it
    // must not run twice) rather than replayed or run.
    let retry = app
        .oneshot(post_with_key("/events", "sse-1", b""))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn a_body_over_max_response_streams_whole_and_is_not_replayed(rg: Redguard) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let big: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    let body = big.clone();
    let app = Router::new()
        .route(
            "/export",
            post(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                let body = body.clone();
                async move { (StatusCode::OK, body) }
            }),
        )
        .route(
            "/rejected",
            post(|| async { (StatusCode::BAD_REQUEST, vec![b'x'; 10_000]) }),
        )
        .layer(
            IdempotencyLayer::builder()
                .max_response(4096)
                .on(&rg)
                .build()
                .unwrap(),
        );
    let first = app
        .clone()
        .oneshot(post_with_key("/export", "big-1", b""))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(bytes_of(first).await, big, "the client gets the whole body");
    let retry = app
        .clone()
        .oneshot(post_with_key("/export", "big-1", b""))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A business failure too large to record is still a business failure: released.
    for _ in 0..2 {
        let rejected = app
            .clone()
            .oneshot(post_with_key("/rejected", "big-2", b""))
            .await
            .unwrap();
        assert_eq!(rejected.status(), StatusCode::BAD_REQUEST);
        assert_eq!(bytes_of(rejected).await.len(), 10_000);
    }
}

async fn a_record_of_the_first_format_is_answered_not_panicked_on(rg: Redguard) {
    // The first format kept header values as text under `headers`.
    #[derive(serde::Serialize, serde::Deserialize)]
    struct FirstFormat {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    }
    let key = redguard::key::KeyBuilder::new()
        .part("key", "old-1")
        .finish()
        .unwrap();
    let written = rg
        .scope(redguard::idempotency(key).scope("http").run(async {
            Ok::<_, redguard::Error>(FirstFormat {
                status: 201,
                headers: vec![("location".to_owned(), "/orders/1".to_owned())],
                body: "b2s=".to_owned(),
            })
        }))
        .await;
    assert!(written.is_ok());
    let app = Router::new()
        .route("/orders", post(|| async { (StatusCode::CREATED, "ran") }))
        .layer(
            IdempotencyLayer::builder()
                // No payload: the record above was begun without one.
                .fingerprint(|_, _| Vec::new())
                .on(&rg)
                .build()
                .unwrap(),
        );
    let response = app
        .oneshot(post_with_key("/orders", "old-1", b""))
        .await
        .unwrap();
    assert!(response.status().is_server_error(), "{}", response.status());
    assert_eq!(code_of(response).await, "internal");
}

#[test]
fn framing_headers_and_unscoped_cookies_are_not_replayable() {
    for name in [header::CONTENT_LENGTH, header::TRANSFER_ENCODING] {
        let err = IdempotencyLayer::builder()
            .replay_headers([header::CONTENT_TYPE, name.clone()])
            .build()
            .unwrap_err();
        assert!(err.to_string().contains(name.as_str()), "{err}");
    }
    let err = IdempotencyLayer::builder()
        .replay_headers([header::SET_COOKIE])
        .build()
        .unwrap_err();
    assert!(err.to_string().contains(".per("), "{err}");
    // Per client, a cookie goes back to the client it was set for only.
    let _per_client = IdempotencyLayer::builder()
        .replay_headers([header::SET_COOKIE])
        .per(redguard::http::HeaderKey::new("x-user-id").unwrap())
        .build()
        .unwrap();
}

/// the guide's 5xx table: unknown by default; Stripe's replay and Powertools' release are each
/// one `classify`.
async fn the_5xx_policy_is_the_classifiers(rg: Redguard) {
    use redguard::http::idempotency::default_classify;

    let runs = Arc::new(AtomicUsize::new(0));
    let app = |scope: &str, classify: fn(StatusCode) -> Option<ErrorClass>| {
        let counter = Arc::clone(&runs);
        Router::new()
            .route(
                "/pay",
                post(move || {
                    counter.fetch_add(1, Ordering::SeqCst);
                    async { (StatusCode::INTERNAL_SERVER_ERROR, "failed") }
                }),
            )
            .layer(
                IdempotencyLayer::builder()
                    .scope(scope)
                    .classify(classify)
                    .on(&rg)
                    .build()
                    .unwrap(),
            )
    };
    let twice = |app: Router| async move {
        let first = app
            .clone()
            .oneshot(post_with_key("/pay", "p-1", b""))
            .await
            .unwrap();
        assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
        app.oneshot(post_with_key("/pay", "p-1", b""))
            .await
            .unwrap()
    };

    // Default: an unknown outcome; the retry is refused, not run.
    let retry = twice(app("default", default_classify)).await;
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Stripe's: recorded and replayed.
    let stripe = |s: StatusCode| {
        if s.is_server_error() {
            None
        } else {
            default_classify(s)
        }
    };
    let retry = twice(app("stripe", stripe)).await;
    assert_eq!(retry.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(bytes_of(retry).await, b"failed");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Powertools': released; the retry runs.
    let release = |s: StatusCode| {
        if s.is_server_error() {
            Some(ErrorClass::Business)
        } else {
            default_classify(s)
        }
    };
    let retry = twice(app("release", release)).await;
    assert_eq!(retry.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}
