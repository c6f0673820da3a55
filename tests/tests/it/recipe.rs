//! The guide's recipe (`runtime/docs/recipes.md`, `redguard::guide::recipes`) run for real: an
//! axum `POST /orders` behind `RateLimitLayer` keyed on the user, the `Idempotency-Key`
//! header, the SKU's lock, the Postgres transaction opened inside it, the outcome committed in
//! it (`Idempotency::transaction`) with the fenced stock write, against a redis-server and a
//! Postgres the harness starts. Between the `recipe:` markers is the page's first code block,
//! character for character (`the_guide_shows_this_code` compares them): change both at once.

// recipe:start
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use redguard::http::{HeaderKey, IdempotencyKey, RateLimitLayer};
use redguard::idempotency::{sql_failure, track_replay};
use redguard::{Classify, Redguard};
use serde::{Deserialize, Serialize};

#[derive(Clone)]
struct App {
    rg: Redguard,
    db: sqlx::PgPool,
}

/// `POST /orders` body; it is the payload too, so a retry with another body is a `422`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrderRequest {
    sku: String,
    qty: u32,
}

/// `201` body; a replay answers it unchanged (it is what the outcome row holds).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Placed {
    order_id: i64,
    sku: String,
    qty: u32,
    fence: u64,
}

#[derive(Debug, Classify)]
enum OrderError {
    /// Business: rolled back, and a retry with the same key runs again.
    OutOfStock,
    /// A guard's refusal, which classifies itself (`from`: `impl From<redguard::Error>`).
    #[classify(from)]
    Guard(redguard::Error),
}

impl IntoResponse for OrderError {
    fn into_response(self) -> Response {
        match self {
            OrderError::OutOfStock => (StatusCode::CONFLICT, "out of stock").into_response(),
            OrderError::Guard(err) => err.into_response(), // the status table
        }
    }
}

fn router(app: App) -> redguard::Result<Router> {
    // Keyed on the user your authentication put in the request (here a header it set).
    let per_user = RateLimitLayer::builder(HeaderKey::new("x-user-id")?)
        .limit("orders", "5/s")
        .on(&app.rg)
        .build()?;
    Ok(Router::new()
        .route("/orders", post(submit_order))
        .route_layer(per_user)
        .with_state(app))
}

async fn submit_order(
    State(app): State<App>,
    key: IdempotencyKey, // 400 without a valid `Idempotency-Key`
    headers: HeaderMap,
    Json(req): Json<OrderRequest>,
) -> Result<Response, OrderError> {
    let user: u64 = headers
        .get("x-user-id")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .ok_or(redguard::Error::MissingKey {
            part: "x-user-id".into(), // 400
        })?;
    let (placed, replayed) = track_replay(place_order(&app, user, &key, &req)).await;
    let mut response = (StatusCode::CREATED, Json(placed?)).into_response();
    if replayed {
        let replayed = HeaderValue::from_static("true");
        response
            .headers_mut()
            .insert("idempotent-replayed", replayed);
    }
    Ok(response)
}

async fn place_order(
    app: &App,
    user: u64,
    key: &IdempotencyKey,
    req: &OrderRequest,
) -> Result<Placed, OrderError> {
    // The SKU goes through the key rules before it reaches Redis or the fence table.
    let stock = redguard::key("stock:{sku}").part("sku", req.sku.as_str());
    app.rg
        .lock(stock)
        .wait(Duration::from_secs(2)) // then `503 busy`: nothing ran, the retry runs
        .lease(Duration::from_secs(10))
        .run(async {
            // A lock that failed open has no fence: refuse rather than write unordered.
            let fence = redguard::lock::fence().ok_or_else(|| redguard::Error::LockLost {
                key: format!("stock:{}", req.sku),
            })?;
            // Inside the lock: this transaction never overlaps another holder's.
            let tx = app.db.begin().await.map_err(sql_failure)?;
            app.rg
                .idempotency(
                    redguard::key("{user}:{key}")
                        .part("user", &user)
                        .part("key", key),
                )
                .scope("orders")
                .expire(Duration::from_secs(600))
                .payload(req)
                .transaction(tx)
                .run(async |mut tx| {
                    let placed = write_order(&mut tx, fence, user, req).await;
                    (tx, placed) // redguard commits tx with the outcome row
                })
                .await
        })
        .await // released here: after the commit
}

/// Read, decide in code, write: the read-modify-write the lock exists for. Everything runs
/// in a savepoint whose first statement is the fence, so nothing reads or writes the stock
/// before the fence row is locked.
async fn write_order(
    tx: &mut sqlx::PgConnection,
    fence: u64,
    user: u64,
    req: &OrderRequest,
) -> Result<Placed, OrderError> {
    let resource = format!("stock:{}", req.sku);
    let mut fenced = redguard::lock::begin_fenced(&mut *tx, &resource, fence).await?;
    let available: i64 = sqlx::query_scalar("SELECT available FROM stock WHERE sku = $1")
        .bind(&req.sku)
        .fetch_one(&mut *fenced)
        .await
        .map_err(sql_failure)?;
    if available < i64::from(req.qty) {
        return Err(OrderError::OutOfStock); // the savepoint and then tx roll back
    }
    sqlx::query("UPDATE stock SET available = $1 WHERE sku = $2")
        .bind(available - i64::from(req.qty))
        .bind(&req.sku)
        .execute(&mut *fenced)
        .await
        .map_err(sql_failure)?;
    let order_id: i64 = sqlx::query_scalar(
        "INSERT INTO orders (user_id, sku, qty, fence) VALUES ($1, $2, $3, $4) RETURNING id",
    )
    .bind(user as i64)
    .bind(&req.sku)
    .bind(i64::from(req.qty))
    .bind(fence as i64)
    .fetch_one(&mut *fenced)
    .await
    .map_err(sql_failure)?;
    fenced.commit().await?; // releases the savepoint; tx is still open
    Ok(Placed {
        order_id,
        sku: req.sku.clone(),
        qty: req.qty,
        fence,
    })
}
// recipe:end

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt as _;
use redguard_tests::RedisServer;
use redguard_tests::postgres::Postgres;
use tower::ServiceExt as _;

/// The servers, the handle and the tables; `stock` rows given as (sku, available).
struct Service {
    router: Router,
    db: sqlx::PgPool,
    redis: RedisServer,
    _pg: Postgres,
}

async fn service(stock: &[(&str, i64)]) -> Service {
    let (redis, pg) = (RedisServer::start(), Postgres::start());
    let rg = Redguard::redis(redis.url())
        .connect()
        .await
        .expect("connect to the test redis-server");
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect(&pg.url())
        .await
        .expect("connect to the test postgres");
    sqlx::raw_sql(redguard::idempotency::POSTGRES_MIGRATION)
        .execute(&db)
        .await
        .expect("migrate");
    sqlx::raw_sql(
        "CREATE TABLE stock (sku TEXT PRIMARY KEY, available BIGINT NOT NULL); \
         CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, user_id BIGINT, sku TEXT, qty BIGINT, \
         fence BIGINT)",
    )
    .execute(&db)
    .await
    .expect("create the tables");
    for (sku, available) in stock {
        sqlx::query("INSERT INTO stock VALUES ($1, $2)")
            .bind(sku)
            .bind(available)
            .execute(&db)
            .await
            .expect("stock");
    }
    let router = router(App { rg, db: db.clone() }).expect("the router");
    Service {
        router,
        db,
        redis,
        _pg: pg,
    }
}

/// What a response said: its status, `Idempotent-Replayed`, and its body (JSON when it is).
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    replayed: bool,
    body: serde_json::Value,
}

impl Service {
    async fn order(&self, user: u64, key: &str, sku: &str, qty: u32) -> Answer {
        let request = Request::post("/orders")
            .header("x-user-id", user.to_string())
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(Body::from(
                serde_json::json!({ "sku": sku, "qty": qty }).to_string(),
            ))
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let replayed = response.headers().get("idempotent-replayed").is_some();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()));
        Answer {
            status,
            replayed,
            body,
        }
    }

    /// Every order as (id, user, sku, qty, fence), in id order.
    async fn orders(&self) -> Vec<(i64, i64, String, i64, i64)> {
        sqlx::query_as("SELECT id, user_id, sku, qty, fence FROM orders ORDER BY id")
            .fetch_all(&self.db)
            .await
            .expect("read the orders")
    }

    async fn available(&self, sku: &str) -> i64 {
        sqlx::query_scalar("SELECT available FROM stock WHERE sku = $1")
            .bind(sku)
            .fetch_one(&self.db)
            .await
            .expect("read the stock")
    }
}

/// `n` calls of `call` at once, each on a task of its own.
async fn at_once<F, Fut>(n: u64, call: F) -> Vec<Answer>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Answer> + Send + 'static,
{
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n as usize));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (call, barrier) = (call(i), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                call.await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("a request panicked"));
    }
    answers
}

/// Five copies of one request (one user, one `Idempotency-Key`) at once: one order, one
/// decrement; every copy answered `201` with that order, four of them marked replayed (each
/// waited at the SKU's lock, then found the record SUCCESS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_place_one_order() {
    let service = std::sync::Arc::new(service(&[("SK-1", 100)]).await);
    let answers = at_once(5, |_| {
        let service = service.clone();
        async move { service.order(7, "order-7f3a", "SK-1", 2).await }
    })
    .await;
    assert!(
        answers.iter().all(|a| a.status == StatusCode::CREATED),
        "{answers:?}"
    );
    assert_eq!(
        answers.iter().filter(|a| a.replayed).count(),
        4,
        "{answers:?}"
    );
    let orders = service.orders().await;
    assert_eq!(orders.len(), 1, "{orders:?}");
    assert!(answers.iter().all(|a| a.body["order_id"] == orders[0].0));
    assert_eq!(service.available("SK-1").await, 98);
}

/// Twelve buyers (twelve users, so no per-user limit is reached) of a SKU with five in stock,
/// at once: exactly five orders, seven `409 out of stock`, nothing left and nothing oversold;
/// the orders' fences increase with their ids (each holder wrote after the one before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_buyers_of_one_sku_never_oversell() {
    let service = std::sync::Arc::new(service(&[("SK-2", 5)]).await);
    let answers = at_once(12, |i| {
        let service = service.clone();
        async move { service.order(100 + i, &format!("buy-{i}"), "SK-2", 1).await }
    })
    .await;
    let placed = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .count();
    let refused = answers
        .iter()
        .filter(|a| a.status == StatusCode::CONFLICT && a.body == "out of stock")
        .count();
    assert_eq!((placed, refused), (5, 7), "{answers:?}");
    assert_eq!(service.available("SK-2").await, 0);
    let orders = service.orders().await;
    assert_eq!(orders.len(), 5, "{orders:?}");
    assert!(orders.windows(2).all(|w| w[0].4 < w[1].4), "{orders:?}");
}

/// A retry after success is the first answer replayed, from Redis's record; with the record
/// gone (Redis flushed: a failover that lost it, or the record expired), from the outcome row
/// committed with the order. Either way the order is placed once. The same key with another
/// body is `422`, and a refusal (out of stock) rolls back and is run again by its retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_success_is_replayed() {
    let service = service(&[("SK-3", 3)]).await;
    let first = service.order(9, "pay-1", "SK-3", 2).await;
    assert_eq!(
        (first.status, first.replayed),
        (StatusCode::CREATED, false),
        "{first:?}"
    );
    let retry = service.order(9, "pay-1", "SK-3", 2).await;
    assert_eq!((retry.status, retry.replayed), (StatusCode::CREATED, true));
    assert_eq!(retry.body, first.body);

    let mut redis = redis::Client::open(service.redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("FLUSHALL")
        .query_async::<()>(&mut redis)
        .await
        .unwrap();
    let from_row = service.order(9, "pay-1", "SK-3", 2).await;
    assert_eq!(
        (from_row.status, from_row.replayed),
        (StatusCode::CREATED, true)
    );
    assert_eq!(from_row.body, first.body);

    let reuse = service.order(9, "pay-1", "SK-3", 1).await;
    assert_eq!(reuse.status, StatusCode::UNPROCESSABLE_ENTITY, "{reuse:?}");
    assert_eq!(service.orders().await.len(), 1);
    assert_eq!(service.available("SK-3").await, 1);

    // Out of stock is a business error: nothing committed, and the same key runs again.
    let short = service.order(9, "pay-2", "SK-3", 2).await;
    assert_eq!(short.status, StatusCode::CONFLICT, "{short:?}");
    sqlx::query("UPDATE stock SET available = 5 WHERE sku = 'SK-3'")
        .execute(&service.db)
        .await
        .unwrap();
    let restocked = service.order(9, "pay-2", "SK-3", 2).await;
    assert_eq!(
        (restocked.status, restocked.replayed),
        (StatusCode::CREATED, false)
    );
    assert_eq!(service.orders().await.len(), 2);
}

/// The route's limit is per user, in front of everything: ten orders of one user at once,
/// each with its own key, are five placed (the limit's burst) and the rest `429`, which
/// placed nothing; another user is not limited by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_is_per_user_and_comes_first() {
    let service = std::sync::Arc::new(service(&[("SK-4", 100)]).await);
    let answers = at_once(10, |i| {
        let service = service.clone();
        async move { service.order(5, &format!("k-{i}"), "SK-4", 1).await }
    })
    .await;
    let placed = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .count();
    let limited = answers
        .iter()
        .filter(|a| a.status == StatusCode::TOO_MANY_REQUESTS)
        .count();
    // All ten reach the layer within a few ms: five admitted, a sixth only if 200 ms passed.
    assert!((5..=6).contains(&placed), "{answers:?}");
    assert_eq!(placed + limited, 10, "{answers:?}");
    assert_eq!(service.orders().await.len(), placed);
    let other = service.order(6, "k-0", "SK-4", 1).await;
    assert_eq!(other.status, StatusCode::CREATED, "{other:?}");
}

/// The recipe between the markers above is the guide's code block, hidden lines aside.
#[test]
fn the_guide_shows_this_code() {
    let page = include_str!("../../../runtime/docs/recipes.md");
    let block = page
        .split_once("```rust,no_run\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the page's first code block")
        .0;
    let shown: Vec<&str> = block
        .lines()
        .filter(|line| !(line.starts_with("# ") || *line == "#"))
        .collect();
    let here = include_str!("recipe.rs");
    let recipe = here
        .split_once("// recipe:start\n")
        .and_then(|(_, rest)| rest.split_once("// recipe:end"))
        .expect("the markers")
        .0;
    let tested: Vec<&str> = recipe.lines().collect();
    assert_eq!(
        shown, tested,
        "runtime/docs/recipes.md and this file differ"
    );
}
