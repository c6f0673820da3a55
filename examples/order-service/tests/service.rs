//! The order service end to end: real Redis, several instances (child processes) on one
//! SQLite file, the load generator, and every status of the HTTP contract provoked over HTTP.
//! Tests of issue 19 are named after the promise they check.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redguard_tests::{RedisSentinel, RedisServer};
use reqwest::StatusCode;
use serde_json::{Value, json};

const ADMIN_TOKEN: &str = "test-admin-token-0123456789";
const AUTH_SECRET: &str = "test-auth-secret-0123456789";
const PAYMENT_SECRET: &str = "test-payment-secret-0123456789";

/// A running `order-service` process, killed on drop.
struct Instance {
    child: Child,
    url: String,
    port: u16,
    client: reqwest::Client,
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// Starts an instance with the test's secrets and this machine trusted as a proxy (so
/// `X-User-Id` is believed); `env` overrides any of it.
async fn start(redis: &RedisServer, db: &Path, name: &str, env: &[(&str, &str)]) -> Instance {
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_order-service"));
    command
        .env("PORT", port.to_string())
        .env("ORDER_DB", db)
        .env("REDGUARD_REDIS_URL", redis.url())
        .env("INSTANCE_ID", name)
        .env("JOB_TICK_MS", "50")
        .env("AUTH_SECRET", AUTH_SECRET)
        .env("ADMIN_TOKEN", ADMIN_TOKEN)
        .env("PAYMENT_SECRET", PAYMENT_SECRET)
        .env("TRUSTED_PROXIES", "127.0.0.1")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (key, value) in env {
        command.env(key, value);
    }
    if env
        .iter()
        .any(|(key, _)| *key == "REDGUARD_REDIS_SENTINELS")
    {
        command.env_remove("REDGUARD_REDIS_URL");
    }
    let instance = Instance {
        child: command.spawn().expect("spawn order-service"),
        url: format!("http://127.0.0.1:{port}"),
        port,
        client: reqwest::Client::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let health = instance
            .client
            .get(format!("{}/healthz", instance.url))
            .send();
        if let Ok(response) = health.await {
            let health: Value = response.json().await.unwrap();
            // The kind of the handle: a service started on Sentinel says so.
            let sentinel = env
                .iter()
                .any(|(key, _)| *key == "REDGUARD_REDIS_SENTINELS");
            let kind = if sentinel { "redis-sentinel" } else { "redis" };
            assert_eq!(health["store"], kind);
            assert_eq!(health["instance"], name);
            return instance;
        }
        assert!(Instant::now() < deadline, "{name} did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn temp_db(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("orders.db")
}

/// Who sends a request: a trusted proxy's `X-User-Id`, a bearer token, or nobody.
#[derive(Clone, Copy)]
enum As<'a> {
    Proxied(u64),
    Bearer(&'a str),
    Anonymous,
}

impl Instance {
    fn post(&self, path: &str, who: As<'_>) -> reqwest::RequestBuilder {
        who.apply(self.client.post(format!("{}{path}", self.url)))
    }

    fn get(&self, path: &str, who: As<'_>) -> reqwest::RequestBuilder {
        who.apply(self.client.get(format!("{}{path}", self.url)))
    }

    async fn set_stock(&self, sku: &str, available: u32, price: u32) {
        let response = self
            .client
            .post(format!("{}/admin/stock", self.url))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({ "sku": sku, "available": available, "price": price }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }

    /// A bearer token for `user`, minted by the admin endpoint.
    async fn user_token(&self, user: u64) -> String {
        let response = self
            .client
            .post(format!("{}/admin/tokens", self.url))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({ "user_id": user }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.unwrap();
        body["token"].as_str().unwrap().to_owned()
    }

    async fn order(&self, who: As<'_>, key: &str, body: Value) -> reqwest::Response {
        self.post("/orders", who)
            .header("idempotency-key", key)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// A payment callback signed with `secret` at `timestamp`.
    async fn callback(&self, body: &str, secret: &str, timestamp: u64) -> reqwest::Response {
        let signature = order_service::sign_callback(secret.as_bytes(), timestamp, body.as_bytes());
        self.client
            .post(format!("{}/payments/callback", self.url))
            .header("x-signature-timestamp", timestamp.to_string())
            .header("x-signature", signature)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap()
    }
}

impl As<'_> {
    fn apply(self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self {
            As::Proxied(user) => request.header("x-user-id", user.to_string()),
            As::Bearer(token) => request.bearer_auth(token),
            As::Anonymous => request,
        }
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// One service on its own Redis and database.
async fn service(env: &[(&str, &str)]) -> (RedisServer, tempfile::TempDir, Instance) {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let svc = start(&redis, &temp_db(&dir), "svc", env).await;
    (redis, dir, svc)
}

/// A connection of the test's own to an instance's database file.
async fn db_conn(path: &Path) -> sqlx::SqliteConnection {
    use sqlx::Connection as _;
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::from_secs(10));
    sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap()
}

async fn db_count(dir: &tempfile::TempDir, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(&mut db_conn(&temp_db(dir)).await)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_never_duplicate_or_oversell_under_load() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db = temp_db(&dir);
    let fast = [
        ("USER_RATE", "10000/s"),
        ("USER_BURST", "10000"),
        ("API_RATE", "100000/s"),
        ("UNPAID_TIMEOUT_MS", "600000"),
    ];
    let mut instances = Vec::new();
    for name in ["a", "b", "c"] {
        instances.push(start(&redis, &db, name, &fast).await);
    }
    let targets: Vec<&str> = instances.iter().map(|i| i.url.as_str()).collect();
    // 2,000 intents × 3 sends; stock (5 SKUs × 500) is smaller than demand (~4,000 units).
    let output = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["--targets", &targets.join(",")])
        .args(["--db", db.to_str().unwrap()])
        .args(["--admin-token", ADMIN_TOKEN])
        .args(["--intents", "2000", "--dups", "3", "--concurrency", "48"])
        .args(["--skus", "5", "--stock", "500", "--users", "400"])
        .output()
        .expect("run loadgen");
    let report = String::from_utf8_lossy(&output.stdout);
    println!("{report}{}", String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "loadgen found violations:\n{report}"
    );
    let value = |name: &str| -> i64 {
        report
            .lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name:?} in report"))
    };
    assert_eq!(value("duplicate orders"), 0);
    assert_eq!(value("oversold units"), 0);
    assert_eq!(value("job-run overlaps"), 0);
    assert!(value("status 201") > 0);
    assert!(
        value("status 409") > 0,
        "demand exceeds stock: some must be out_of_stock"
    );
    assert!(value("replays") > 0);
    assert!(value("job runs") > 0, "the job never ran");
    // Sold exactly what the stock allowed: nothing more, nothing lost.
    let mut conn = db_conn(&db).await;
    let available: i64 =
        sqlx::query_scalar("SELECT SUM(available) FROM stock WHERE sku LIKE 'LG-%'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    let sold: i64 = sqlx::query_scalar(
        "SELECT SUM(qty) FROM orders WHERE sku LIKE 'LG-%' AND status != 'closed'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(available + sold, 2500);
    redis.assert_every_key_has_ttl();
}

/// Every key and its serialized value, except the background job's lock, which comes and
/// goes on its own tick.
fn snapshot(redis: &RedisServer) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut conn = redis.connection();
    redis
        .keys()
        .into_iter()
        .filter(|key| !key.contains("close_unpaid"))
        .map(|key| {
            let value: Vec<u8> = redis::cmd("DUMP")
                .arg(&key)
                .query(&mut conn)
                .unwrap_or_default();
            (key, value)
        })
        .collect()
}

async fn error_code(response: reqwest::Response) -> (StatusCode, String) {
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert!(body["message"].is_string(), "{body}");
    (
        status,
        body["error"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_status_of_the_contract() {
    let (redis, dir, svc) = service(&[]).await;
    let url = svc.url.as_str();
    let client = &svc.client;

    svc.set_stock("SK-1", 5, 1999).await;
    let stock: Value = svc
        .get("/stock/SK-1", As::Anonymous)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        stock,
        json!({ "sku": "SK-1", "available": 5, "price": 1999 })
    );
    let missing = svc.get("/stock/NOPE", As::Anonymous).send().await.unwrap();
    assert_eq!(
        error_code(missing).await,
        (StatusCode::NOT_FOUND, "not_found".into())
    );

    // 201, then the replay with the same status and body.
    let first = svc
        .order(As::Proxied(1), "k-1", json!({ "sku": "SK-1", "qty": 2 }))
        .await;
    assert_eq!(first.status(), 201);
    assert!(!first.headers().contains_key("idempotent-replayed"));
    let first: Value = first.json().await.unwrap();
    assert_eq!(
        (
            first["user_id"].as_u64(),
            first["qty"].as_u64(),
            first["total"].as_u64()
        ),
        (Some(1), Some(2), Some(3998))
    );
    assert!(first["fence"].as_u64().unwrap() > 0);
    let again = svc
        .order(As::Proxied(1), "k-1", json!({ "sku": "SK-1", "qty": 2 }))
        .await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), first);

    // 422: same key, different body.
    let reuse = svc
        .order(As::Proxied(1), "k-1", json!({ "sku": "SK-1", "qty": 3 }))
        .await;
    assert_eq!(
        error_code(reuse).await,
        (StatusCode::UNPROCESSABLE_ENTITY, "key_reuse".into())
    );

    // 400s and a 401: nothing written anywhere.
    let before = snapshot(&redis);
    for (user, key) in [
        ("x", "k-2"),
        ("2", ""),
        ("2", "bad key"),
        ("2", &"k".repeat(65)),
    ] {
        let mut request = client
            .post(format!("{url}/orders"))
            .json(&json!({ "sku": "SK-1", "qty": 1 }));
        if !user.is_empty() {
            request = request.header("x-user-id", user);
        }
        if !key.is_empty() {
            request = request.header("idempotency-key", key);
        }
        let (status, _) = error_code(request.send().await.unwrap()).await;
        assert_eq!(status, 400, "user {user:?} key {key:?}");
    }
    let anonymous = svc
        .order(As::Anonymous, "k-2", json!({ "sku": "SK-1", "qty": 1 }))
        .await;
    assert_eq!(
        error_code(anonymous).await,
        (StatusCode::UNAUTHORIZED, "unauthenticated".into())
    );
    // Nothing new and nothing changed; a key may only have gone (GCRA state expires as soon
    // as its bucket is full again).
    for (key, value) in snapshot(&redis) {
        assert_eq!(before.get(&key), Some(&value), "a 400 wrote {key}");
    }

    // 409 out_of_stock is a business error: after a restock the same key runs again.
    let short = svc
        .order(As::Proxied(2), "k-3", json!({ "sku": "SK-1", "qty": 4 }))
        .await;
    assert_eq!(
        error_code(short).await,
        (StatusCode::CONFLICT, "out_of_stock".into())
    );
    svc.set_stock("SK-1", 10, 1999).await;
    let retried = svc
        .order(As::Proxied(2), "k-3", json!({ "sku": "SK-1", "qty": 4 }))
        .await;
    assert_eq!(retried.status(), 201);

    // A record left PROCESSING (an instance died mid-order) is resolved from the database:
    // no outcome row and no transaction holding one, so nothing committed and the retry runs
    // at once. (With the outcome in Redis only it was `409 in_progress` until the record
    // expired; an order's `in_progress` now needs another execution's open transaction, which
    // SQLite's one writer makes the duplicate wait out instead.)
    let mut conn = redis.connection();
    let record = "redguard:idem:{order-submit:3:k-4}";
    let _: () = redis::cmd("HSET")
        .arg(record)
        .arg("status")
        .arg("P")
        .arg("owner")
        .arg("crashed")
        .arg("fp")
        .arg("")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("EXPIRE")
        .arg(record)
        .arg(60)
        .query(&mut conn)
        .unwrap();
    let resolved = svc
        .order(As::Proxied(3), "k-4", json!({ "sku": "SK-1", "qty": 1 }))
        .await;
    assert_eq!(resolved.status(), 201, "{:?}", resolved.text().await);

    // 503 busy: the stock lock is held elsewhere past the 300 ms wait.
    let holder = redguard::Redguard::redis(redis.url())
        .connect()
        .await
        .unwrap();
    let guard = holder
        .lock("stock:SK-1")
        .scope("order_service::orders::reserve_stock")
        .acquire()
        .await
        .unwrap();
    let waited = svc
        .order(As::Proxied(4), "k-5", json!({ "sku": "SK-1", "qty": 1 }))
        .await;
    assert_eq!(
        waited
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    assert_eq!(
        error_code(waited).await,
        (StatusCode::SERVICE_UNAVAILABLE, "busy".into())
    );
    guard.release().await.unwrap();

    // Tokens: 201, then 409 token_used, and 400 token_invalid for a forgery.
    let token: Value = {
        let response = svc.post("/tokens", As::Proxied(5)).send().await.unwrap();
        assert_eq!(response.status(), 201);
        response.json().await.unwrap()
    };
    let token = token["token"].as_str().unwrap();
    let with_token = |key: &'static str, token: String| {
        client
            .post(format!("{url}/orders"))
            .header("x-user-id", "5")
            .header("idempotency-key", key)
            .header("x-idempotent-token", token)
            .json(&json!({ "sku": "SK-1", "qty": 1 }))
            .send()
    };
    assert_eq!(
        with_token("k-6", token.to_owned()).await.unwrap().status(),
        201
    );
    let used = with_token("k-7", token.to_owned()).await.unwrap();
    assert_eq!(
        error_code(used).await,
        (StatusCode::CONFLICT, "token_used".into())
    );
    let forged = with_token("k-8", "0".repeat(32)).await.unwrap();
    assert_eq!(
        error_code(forged).await,
        (StatusCode::BAD_REQUEST, "token_invalid".into())
    );

    // 429 with the headers a client needs: user 6 bursts past 10 at 5/s.
    let mut limited = None;
    for i in 0..15 {
        let response = svc
            .order(
                As::Proxied(6),
                &format!("burst-{i}"),
                json!({ "sku": "SK-1", "qty": 1 }),
            )
            .await;
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(response);
            break;
        }
    }
    let limited = limited.expect("15 requests at once never hit the 10-request burst");
    assert!(limited.headers().contains_key("retry-after"));
    assert!(limited.headers().contains_key("ratelimit"));
    assert!(limited.headers().contains_key("ratelimit-policy"));
    assert_eq!(error_code(limited).await.1, "rate_limited");

    // Orders by id and by user.
    let order_id = first["order_id"].as_i64().unwrap();
    let order: Value = svc
        .get(&format!("/orders/{order_id}"), As::Proxied(1))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(order["idempotency_key"], "k-1");
    let missing = svc
        .get("/orders/999999", As::Proxied(1))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let mine: Value = svc
        .get("/orders", As::Proxied(1))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(mine["orders"].as_array().unwrap().len(), 1);

    // Payment callbacks: retried by the provider, recorded once.
    let callback =
        json!({ "payment_id": "pay-1", "order_id": order_id, "amount": 3998 }).to_string();
    let mut answers = Vec::new();
    for _ in 0..3 {
        let response = svc.callback(&callback, PAYMENT_SECRET, now_s()).await;
        assert_eq!(response.status(), 200);
        answers.push(response.json::<Value>().await.unwrap());
    }
    assert!(
        answers
            .iter()
            .all(|a| *a == json!({ "order_id": order_id, "status": "paid" }))
    );
    assert_eq!(
        db_count(
            &dir,
            "SELECT COUNT(*) FROM ledger WHERE payment_id = 'pay-1'"
        )
        .await,
        1
    );

    let metrics = client
        .get(format!("{url}/metrics"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("redguard_idempotency_total"), "{metrics}");
}

/// Keys (the background job's lock aside) and the bytes they use, by `MEMORY USAGE`.
fn footprint(redis: &RedisServer) -> (std::collections::BTreeSet<String>, u64) {
    let mut conn = redis.connection();
    let keys: std::collections::BTreeSet<String> = redis
        .keys()
        .into_iter()
        .filter(|key| !key.contains("close_unpaid"))
        .collect();
    let bytes = keys
        .iter()
        .map(|key| {
            redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .query::<Option<u64>>(&mut conn)
                .unwrap()
                .unwrap_or(0)
        })
        .sum();
    (keys, bytes)
}

async fn status_of(dir: &tempfile::TempDir, order_id: i64) -> String {
    sqlx::query_scalar("SELECT status FROM orders WHERE order_id = ?1")
        .bind(order_id)
        .fetch_one(&mut db_conn(&temp_db(dir)).await)
        .await
        .unwrap()
}

/// Issue 19 item 5: reads check ownership; identity is a verified token, or `X-User-Id` from a
/// trusted proxy only; `/admin/*` needs the admin token (401 without, 403 with another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_belong_to_their_owner_and_admin_needs_its_credential() {
    let (_redis, _dir, svc) = service(&[("TRUSTED_PROXIES", "10.9.9.9")]).await;
    svc.set_stock("SK-1", 10, 500).await;
    let alice = svc.user_token(1).await;
    let bob = svc.user_token(2).await;
    let placed = svc
        .order(
            As::Bearer(&alice),
            "a-1",
            json!({ "sku": "SK-1", "qty": 1 }),
        )
        .await;
    assert_eq!(placed.status(), 201);
    let placed: Value = placed.json().await.unwrap();
    assert_eq!(placed["user_id"], 1);
    let path = format!("/orders/{}", placed["order_id"]);

    let mine = svc.get(&path, As::Bearer(&alice)).send().await.unwrap();
    assert_eq!(mine.status(), 200);
    let theirs = svc.get(&path, As::Bearer(&bob)).send().await.unwrap();
    assert_eq!(
        error_code(theirs).await,
        (StatusCode::NOT_FOUND, "not_found".into())
    );
    let listed: Value = svc
        .get("/orders?user_id=1", As::Bearer(&bob))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed, json!({ "orders": [] }), "bob listed alice's orders");

    // No identity, a claimed one from an untrusted peer, a tampered or expired token: 401.
    let mut tampered = alice.clone();
    tampered.replace_range(0..1, "2");
    let expiring = {
        let response = svc
            .client
            .post(format!("{}/admin/tokens", svc.url))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({ "user_id": 1, "ttl_s": 1 }))
            .send()
            .await
            .unwrap();
        response.json::<Value>().await.unwrap()["token"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    tokio::time::sleep(Duration::from_millis(2100)).await;
    for who in [
        As::Anonymous,
        As::Proxied(1),
        As::Bearer(&tampered),
        As::Bearer(&expiring),
        As::Bearer("1.99999999999.00"),
    ] {
        let response = svc.get(&path, who).send().await.unwrap();
        assert_eq!(
            error_code(response).await,
            (StatusCode::UNAUTHORIZED, "unauthenticated".into())
        );
    }

    // The admin credential: 401 missing, 403 wrong (a user's token is not one).
    for (token, status) in [
        (None, 401),
        (Some("wrong-admin-token-000000"), 403),
        (Some(alice.as_str()), 403),
    ] {
        for path in ["/admin/stock", "/admin/tokens"] {
            let mut request = svc
                .client
                .post(format!("{}{path}", svc.url))
                .json(&json!({ "sku": "SK-1", "available": 0, "price": 1, "user_id": 1 }));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let (got, _) = error_code(request.send().await.unwrap()).await;
            assert_eq!(got, status, "{path} with {token:?}");
        }
        let mut metrics = svc.client.get(format!("{}/metrics", svc.url));
        if let Some(token) = token {
            metrics = metrics.bearer_auth(token);
        }
        assert_eq!(metrics.send().await.unwrap().status(), status);
    }
    let stock: Value = svc
        .get("/stock/SK-1", As::Anonymous)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        stock["available"], 9,
        "a refused admin call changed the stock"
    );
}

/// Issue 19 item 8: 40 orders under 40 `X-User-Id` values are one client's: refused from an
/// untrusted peer, and with a token they all count against the token's user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_client_limit_is_keyed_on_the_authenticated_identity() {
    let (_redis, dir, svc) = service(&[("TRUSTED_PROXIES", "10.9.9.9")]).await;
    svc.set_stock("SK-1", 1000, 100).await;
    let bob = svc.user_token(2).await;
    let started = Instant::now();
    let mut admitted = 0;
    for i in 0..40 {
        let spoofed = svc
            .post("/orders", As::Proxied(100 + i))
            .header("idempotency-key", format!("s-{i}"))
            .json(&json!({ "sku": "SK-1", "qty": 1 }))
            .send()
            .await
            .unwrap();
        assert_eq!(spoofed.status(), 401);
        let with_token = svc
            .post("/orders", As::Bearer(&bob))
            .header("x-user-id", (200 + i).to_string())
            .header("idempotency-key", format!("t-{i}"))
            .json(&json!({ "sku": "SK-1", "qty": 1 }))
            .send()
            .await
            .unwrap();
        match with_token.status().as_u16() {
            201 => admitted += 1,
            429 => {}
            other => panic!("unexpected {other}"),
        }
    }
    // Burst 10, then 5/s for as long as the loop took.
    let refilled = (started.elapsed().as_secs_f64() * 5.0).ceil() as usize;
    assert!(
        (10..=10 + refilled).contains(&admitted),
        "{admitted} admitted"
    );
    assert_eq!(
        db_count(&dir, "SELECT COUNT(*) FROM orders WHERE user_id != 2").await,
        0
    );
}

/// Issue 19 item 7: 200 requests of each kind of abuse, the Redis keys and bytes before and
/// after: refused requests write nothing, and what an admitted client can make is bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abuse_cannot_fill_redis() {
    let (redis, _dir, svc) = service(&[("TRUSTED_PROXIES", "10.9.9.9")]).await;
    svc.set_stock("SK-1", 1000, 100).await;
    let user = svc.user_token(1).await;
    let (start_keys, start_bytes) = footprint(&redis);
    let start_memory = redguard_tests::faults::used_memory(&redis);
    let order_id = 999_999;
    let kinds: [(&str, u16); 8] = [
        ("anonymous orders", 401),
        ("orders under X-User-Id from an untrusted peer", 401),
        ("orders for unknown SKUs", 404),
        ("unsigned payment callbacks", 401),
        ("badly signed payment callbacks", 401),
        ("signed callbacks for no order", 404),
        ("anonymous token requests", 401),
        ("malformed order bodies", 400),
    ];
    for (kind, expected) in kinds {
        for i in 0..200 {
            let callback =
                json!({ "payment_id": format!("p-{i}"), "order_id": order_id, "amount": 1 })
                    .to_string();
            let response = match kind {
                "anonymous orders" => {
                    svc.order(
                        As::Anonymous,
                        &format!("k-{i}"),
                        json!({ "sku": "SK-1", "qty": 1 }),
                    )
                    .await
                }
                "orders under X-User-Id from an untrusted peer" => svc
                    .post("/orders", As::Anonymous)
                    .header("x-user-id", (1000 + i).to_string())
                    .header("idempotency-key", format!("k-{i}"))
                    .json(&json!({ "sku": "SK-1", "qty": 1 }))
                    .send()
                    .await
                    .unwrap(),
                "orders for unknown SKUs" => {
                    svc.order(
                        As::Bearer(&user),
                        &format!("k-{i}"),
                        json!({ "sku": format!("NO-{i}"), "qty": 1 }),
                    )
                    .await
                }
                "unsigned payment callbacks" => svc
                    .client
                    .post(format!("{}/payments/callback", svc.url))
                    .header("content-type", "application/json")
                    .body(callback)
                    .send()
                    .await
                    .unwrap(),
                "badly signed payment callbacks" => {
                    svc.callback(&callback, "not-the-payment-secret", now_s())
                        .await
                }
                "signed callbacks for no order" => {
                    svc.callback(&callback, PAYMENT_SECRET, now_s()).await
                }
                "anonymous token requests" => {
                    svc.post("/tokens", As::Anonymous).send().await.unwrap()
                }
                _ => svc
                    .post("/orders", As::Bearer(&user))
                    .header("idempotency-key", format!("k-{i}"))
                    .header("content-type", "application/json")
                    .body("{\"sku\":")
                    .send()
                    .await
                    .unwrap(),
            };
            assert_eq!(response.status(), expected, "{kind}");
        }
        let (keys, bytes) = footprint(&redis);
        println!(
            "{kind} ×200: {} keys, {bytes} bytes (before {} keys, {start_bytes} bytes)",
            keys.len(),
            start_keys.len()
        );
        assert!(
            keys.is_subset(&start_keys),
            "{kind} wrote {:?}",
            keys.difference(&start_keys).collect::<Vec<_>>()
        );
    }
    // An authenticated user asking for tokens as fast as it can: its burst, then 429s.
    let started = Instant::now();
    let mut issued = 0;
    for _ in 0..200 {
        let response = svc.post("/tokens", As::Bearer(&user)).send().await.unwrap();
        match response.status().as_u16() {
            201 => issued += 1,
            429 => {}
            other => panic!("token request: {other}"),
        }
    }
    let (keys, bytes) = footprint(&redis);
    println!(
        "token requests ×200 by one user: {issued} issued, {} new keys, {} bytes; used_memory {} → {}",
        keys.len() - start_keys.len(),
        bytes - start_bytes,
        start_memory,
        redguard_tests::faults::used_memory(&redis)
    );
    // Burst 5, then 1/s for as long as the loop took.
    let refilled = started.elapsed().as_secs() as usize + 1;
    assert!(
        (5..=5 + refilled).contains(&issued),
        "{issued} tokens issued"
    );
    assert!(keys.len() - start_keys.len() <= issued + 2);
    assert!(bytes - start_bytes < 300 * (issued as u64 + 2));
    redis.assert_every_key_has_ttl();
}

/// Issue 19 item 6: callbacks are signed over timestamp and body, within a replay window;
/// the amount is the order's total exactly; the ledger's payment id refuses another order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payment_callbacks_are_signed_and_checked() {
    let (redis, dir, svc) = service(&[]).await;
    svc.set_stock("SK-1", 10, 1999).await;
    let mut orders = Vec::new();
    for user in [1, 2] {
        // A: user 1, 2 × 1999 = 3998; B: user 2, 1 × 1999.
        let placed = svc
            .order(
                As::Proxied(user),
                "k",
                json!({ "sku": "SK-1", "qty": 3 - user }),
            )
            .await;
        let placed: Value = placed.json().await.unwrap();
        orders.push(placed["order_id"].as_i64().unwrap());
    }
    let (a, b) = (orders[0], orders[1]);
    let pay = |payment: &str, order: i64, amount: &str| {
        format!(r#"{{"payment_id":"{payment}","order_id":{order},"amount":{amount}}}"#)
    };

    // Unsigned, signed with another secret, or outside the replay window: 401.
    let unsigned = svc
        .client
        .post(format!("{}/payments/callback", svc.url))
        .header("content-type", "application/json")
        .body(pay("p-0", a, "0"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(unsigned).await,
        (StatusCode::UNAUTHORIZED, "unauthenticated".into())
    );
    let forged = svc
        .callback(&pay("p-0", a, "3998"), "another-secret-0123456789", now_s())
        .await;
    assert_eq!(forged.status(), 401);
    let stale = svc
        .callback(&pay("p-0", a, "3998"), PAYMENT_SECRET, now_s() - 3600)
        .await;
    assert_eq!(stale.status(), 401);

    // The amount must be the total, read as a u64 exactly.
    for (amount, status, code) in [
        ("0", 422, "amount_mismatch"),
        ("3997", 422, "amount_mismatch"),
        ("18446744073709551615", 422, "amount_mismatch"),
        ("18446744073709551616", 400, "invalid_body"),
        ("3998.0", 400, "invalid_body"),
        ("-3998", 400, "invalid_body"),
    ] {
        let response = svc
            .callback(
                &pay(&format!("p-{amount}"), a, amount),
                PAYMENT_SECRET,
                now_s(),
            )
            .await;
        assert_eq!(
            error_code(response).await,
            (StatusCode::from_u16(status).unwrap(), code.into()),
            "amount {amount}"
        );
    }
    assert_eq!(status_of(&dir, a).await, "created");

    let paid = svc
        .callback(&pay("pay-a", a, "3998"), PAYMENT_SECRET, now_s())
        .await;
    assert_eq!(paid.status(), 200);
    assert_eq!(status_of(&dir, a).await, "paid");

    // The guard's record expired; the same payment id now names order B: the ledger refuses.
    for key in redis
        .keys()
        .into_iter()
        .filter(|key| key.contains("payment:pay-a"))
    {
        let _: () = redis::cmd("DEL")
            .arg(key)
            .query(&mut redis.connection())
            .unwrap();
    }
    let conflict = svc
        .callback(&pay("pay-a", b, "1999"), PAYMENT_SECRET, now_s())
        .await;
    assert_eq!(
        error_code(conflict).await,
        (StatusCode::CONFLICT, "payment_conflict".into())
    );
    assert_eq!(status_of(&dir, b).await, "created");
    assert_eq!(
        db_count(
            &dir,
            "SELECT order_id FROM ledger WHERE payment_id = 'pay-a'"
        )
        .await,
        a
    );
}

/// Issue 19 item 6: a payment for an order the unpaid job closed (its stock back on sale) is
/// `409 order_closed`, recorded in the ledger as `refund_due`, the same answer on every retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_for_a_closed_order_is_refused_and_kept_for_refund() {
    let (_redis, dir, svc) = service(&[("UNPAID_TIMEOUT_MS", "300")]).await;
    svc.set_stock("SK-1", 1, 700).await;
    let placed: Value = svc
        .order(As::Proxied(1), "k", json!({ "sku": "SK-1", "qty": 1 }))
        .await
        .json()
        .await
        .unwrap();
    let order = placed["order_id"].as_i64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while status_of(&dir, order).await != "closed" {
        assert!(Instant::now() < deadline, "the job never closed the order");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = format!(r#"{{"payment_id":"late","order_id":{order},"amount":700}}"#);
    for _ in 0..2 {
        let late = svc.callback(&body, PAYMENT_SECRET, now_s()).await;
        assert_eq!(
            error_code(late).await,
            (StatusCode::CONFLICT, "order_closed".into())
        );
    }
    assert_eq!(status_of(&dir, order).await, "closed");
    assert_eq!(
        db_count(
            &dir,
            "SELECT COUNT(*) FROM ledger WHERE payment_id = 'late' AND status = 'refund_due'"
        )
        .await,
        1
    );
}

/// Issue 19 item 4: after the idempotency record expired, the database answers: the same
/// intent is a replay (marked), another payload under the key is `422 key_reuse`. First
/// redguard's outcome row does (the Redis record deleted), then, once the row is purged too,
/// the orders table's unique (user, key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_backstop_answers_truthfully_after_the_record_expired() {
    let (redis, dir, svc) = service(&[]).await;
    svc.set_stock("SK-1", 10, 100).await;
    svc.set_stock("SK-2", 10, 100).await;
    let first = svc
        .order(As::Proxied(1), "k-1", json!({ "sku": "SK-1", "qty": 1 }))
        .await;
    assert_eq!(first.status(), 201);
    let first: Value = first.json().await.unwrap();
    let expire = || {
        for key in redis
            .keys()
            .into_iter()
            .filter(|key| key.contains("order-submit:1:k-1"))
        {
            let _: () = redis::cmd("DEL")
                .arg(key)
                .query(&mut redis.connection())
                .unwrap();
        }
    };
    for purge_row in [false, true] {
        if purge_row {
            sqlx::query("DELETE FROM redguard_outcomes")
                .execute(&mut db_conn(&temp_db(&dir)).await)
                .await
                .unwrap();
        }
        expire();
        let other = svc
            .order(As::Proxied(1), "k-1", json!({ "sku": "SK-2", "qty": 7 }))
            .await;
        assert_eq!(
            error_code(other).await,
            (StatusCode::UNPROCESSABLE_ENTITY, "key_reuse".into()),
            "row purged: {purge_row}"
        );
        expire();
        let same = svc
            .order(As::Proxied(1), "k-1", json!({ "sku": "SK-1", "qty": 1 }))
            .await;
        assert_eq!(same.status(), 201, "row purged: {purge_row}");
        assert_eq!(
            same.headers()
                .get("idempotent-replayed")
                .map(|v| v.to_str().unwrap()),
            Some("true"),
            "row purged: {purge_row}"
        );
        assert_eq!(same.json::<Value>().await.unwrap(), first);
    }
    assert_eq!(db_count(&dir, "SELECT COUNT(*) FROM orders").await, 1);
    assert_eq!(
        db_count(&dir, "SELECT available FROM stock WHERE sku = 'SK-2'").await,
        10
    );
}

/// Reads what the server sends until it closes the connection (or `within` passes).
fn read_until_closed(stream: &mut std::net::TcpStream, within: Duration) -> (String, Duration) {
    let started = Instant::now();
    stream.set_read_timeout(Some(within)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

/// Issue 19 item 9: a connection that sends half a header, or nothing, is closed after the
/// header timeout; a body that trickles gets `408 body_timeout`; connections over
/// `MAX_CONNECTIONS` wait until the timeout frees a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_sent_connections_are_closed_within_the_timeouts() {
    let (_redis, _dir, svc) = service(&[
        ("HEADER_TIMEOUT_MS", "500"),
        ("BODY_TIMEOUT_MS", "500"),
        ("MAX_CONNECTIONS", "4"),
    ])
    .await;
    let port = svc.port;
    tokio::task::spawn_blocking(move || {
        let connect = || std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut half = connect();
        half.write_all(b"POST /orders HTTP/1.1\r\nHost: x\r\n").unwrap();
        let mut silent = connect();
        let (_, took) = read_until_closed(&mut half, Duration::from_secs(10));
        assert!(took < Duration::from_secs(3), "half a header kept the connection {took:?}");
        let (_, took) = read_until_closed(&mut silent, Duration::from_secs(10));
        assert!(took < Duration::from_secs(3), "a silent connection was kept {took:?}");

        let mut trickle = connect();
        trickle
            .write_all(b"POST /orders HTTP/1.1\r\nHost: x\r\nx-user-id: 1\r\nidempotency-key: k\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"sku\"")
            .unwrap();
        let (response, took) = read_until_closed(&mut trickle, Duration::from_secs(10));
        assert!(response.starts_with("HTTP/1.1 408"), "{response}");
        assert!(response.contains("body_timeout"), "{response}");
        assert!(took < Duration::from_secs(3), "{took:?}");

        // Four silent connections take every slot: the fifth is not served until they time out.
        let _silent: Vec<_> = (0..4).map(|_| connect()).collect();
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        let mut health = connect();
        health.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let (response, _) = read_until_closed(&mut health, Duration::from_secs(10));
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        let waited = started.elapsed();
        assert!(
            (Duration::from_millis(300)..Duration::from_secs(3)).contains(&waited),
            "served after {waited:?}"
        );
    })
    .await
    .unwrap();
}

/// Issue 19 item 9 / issue 15: SIGTERM stops accepting, finishes the request in flight (its
/// body still arriving), exits 0, and leaves no lock held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_request_in_flight_and_releases_locks() {
    let (redis, dir, mut svc) = service(&[]).await;
    svc.set_stock("SK-1", 10, 100).await;
    let (port, pid) = (svc.port, svc.child.id());
    let body = br#"{"sku":"SK-1","qty":2}"#;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(format!("POST /orders HTTP/1.1\r\nHost: x\r\nx-user-id: 1\r\nidempotency-key: k\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes())
        .unwrap();
    stream.write_all(&body[..5]).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let term = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "still accepting after SIGTERM"
    );
    stream.write_all(&body[5..]).unwrap();
    let (response, _) = read_until_closed(&mut stream, Duration::from_secs(10));
    assert!(response.starts_with("HTTP/1.1 201"), "{response}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = svc.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the service did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
    assert_eq!(db_count(&dir, "SELECT COUNT(*) FROM orders").await, 1);
    let held: Vec<String> = redis
        .keys()
        .into_iter()
        .filter(|key| key.contains(":lock:") && key.ends_with('}'))
        .collect();
    assert!(held.is_empty(), "locks left held: {held:?}");
}

/// Issue 45: `--dev` on the memory store, output piped: its log has no ANSI colour codes,
/// and after SIGTERM the temporary database it made is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dev_run_logs_plain_text_and_removes_its_database() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_order-service"))
        .args(["--dev", "--port", &port.to_string()])
        .env("TMPDIR", tmp.path())
        .env("RUST_LOG", "info")
        .env("SHUTDOWN_GRACE_MS", "100")
        .env_remove("ORDER_DB")
        .env_remove("REDGUARD_REDIS_URL")
        .env_remove("REDGUARD_REDIS_SENTINELS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while client
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "order-service did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let made = std::fs::read_dir(tmp.path()).unwrap().count();
    assert!(made > 0, "no database in TMPDIR");
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let output = tokio::task::spawn_blocking(move || {
        let mut text = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        (child.wait().unwrap(), text)
    })
    .await
    .unwrap();
    let (status, text) = output;
    assert!(status.success(), "{status}: {text}");
    assert!(text.contains("in-memory store"), "{text}");
    assert!(!text.contains("\x1b["), "{text:?}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Issue 45: `loadgen --help` prints its usage and exits 0; a bad flag still exits 2.
#[test]
fn loadgen_help_prints_usage() {
    let help = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.status.success(),
        "{}",
        String::from_utf8_lossy(&help.stderr)
    );
    for flag in ["--targets", "--db", "--admin-token", "--dups"] {
        assert!(
            text.contains(flag),
            "--help does not mention {flag}: {text}"
        );
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["--dups", "none"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

/// Issue 15: `--help` works; a bad setting or a missing secret stops the service at startup
/// with status 2 and a message naming it.
#[test]
fn startup_refuses_bad_settings_with_status_2() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_order-service"));
        command
            .args(args)
            .env_remove("AUTH_SECRET")
            .env_remove("ADMIN_TOKEN")
            .env_remove("PAYMENT_SECRET");
        for (key, value) in env {
            command.env(key, value);
        }
        command.output().unwrap()
    };
    let help = run(&["--help"], &[]);
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for setting in [
        "USER_RATE",
        "TRUSTED_PROXIES",
        "ADMIN_TOKEN",
        "HEADER_TIMEOUT_MS",
        "MAX_CONNECTIONS",
    ] {
        assert!(text.contains(setting), "--help does not mention {setting}");
    }
    for (args, env, says) in [
        (
            &["--dev"][..],
            &[("USER_RATE", "5/fortnight")][..],
            "5/fortnight",
        ),
        (&["--dev", "--port", "http"], &[], "http"),
        (&["--dev", "--no-such-flag"], &[], "no-such-flag"),
        (&[], &[], "AUTH_SECRET"),
        (&["--dev", "--bind", "0.0.0.0"], &[], "loopback"),
        (
            &["--dev"],
            &[
                ("REDGUARD_REDIS_URL", "redis://127.0.0.1:1/"),
                ("REDGUARD_REDIS_SENTINELS", "127.0.0.1:2"),
            ],
            "redis-sentinels",
        ),
    ] {
        let output = run(args, env);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?} {env:?}: {stderr}");
    }
}

/// Issue 15: every error is JSON with a stable `error` code, axum's own rejections included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_json_with_a_stable_code() {
    let (_redis, _dir, svc) = service(&[]).await;
    svc.set_stock("SK-1", 10, 100).await;
    let order = |body: &'static str, content_type: &'static str| {
        svc.post("/orders", As::Proxied(1))
            .header("idempotency-key", "k")
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    let json = "application/json";
    let cases = [
        (
            order("{\"sku\":", json).await.unwrap(),
            400,
            "malformed_json",
        ),
        (
            order("{\"sku\":\"SK-1\",\"qty\":1}", "text/plain")
                .await
                .unwrap(),
            415,
            "unsupported_media_type",
        ),
        (
            order("{\"sku\":\"SK-1\",\"qty\":5000000000}", json)
                .await
                .unwrap(),
            400,
            "invalid_body",
        ),
        (
            order("{\"sku\":\"SK-1\",\"qty\":\"1\"}", json)
                .await
                .unwrap(),
            400,
            "invalid_body",
        ),
        (
            order("{\"sku\":\"SK-1\",\"qty\":0}", json).await.unwrap(),
            400,
            "bad_request",
        ),
        (
            order("{\"sku\":\"NOPE\",\"qty\":1}", json).await.unwrap(),
            404,
            "not_found",
        ),
        (
            svc.post("/orders", As::Proxied(1))
                .header("idempotency-key", "k")
                .header("content-type", json)
                .body(vec![b' '; 20_000])
                .send()
                .await
                .unwrap(),
            413,
            "too_large",
        ),
        (
            svc.get("/orders/abc", As::Proxied(1)).send().await.unwrap(),
            400,
            "bad_request",
        ),
        (
            svc.get("/nowhere", As::Anonymous).send().await.unwrap(),
            404,
            "not_found",
        ),
        (
            svc.client
                .delete(format!("{}/orders", svc.url))
                .send()
                .await
                .unwrap(),
            405,
            "method_not_allowed",
        ),
    ];
    for (response, status, code) in cases {
        assert_eq!(
            error_code(response).await,
            (StatusCode::from_u16(status).unwrap(), code.into())
        );
    }
}

/// Issue 19 item 1: Redis stalls 1.5 s during `POST /orders`: the client gets `503` with
/// `Retry-After: 1`, and the retry that invites is served (not `409 in_progress`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_begin_cut_off_by_a_redis_stall_is_undone_and_the_retry_served() {
    let (redis, dir, svc) = service(&[]).await;
    svc.set_stock("SK-1", 10, 100).await;
    redis.pause();
    let stalled = svc.order(As::Proxied(1), "k", json!({ "sku": "SK-1", "qty": 1 }));
    let resume = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        redis.resume();
    };
    let (stalled, ()) = tokio::join!(stalled, resume);
    assert_eq!(
        stalled
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    assert_eq!(
        error_code(stalled).await,
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable".into())
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let retry = svc
        .order(As::Proxied(1), "k", json!({ "sku": "SK-1", "qty": 1 }))
        .await;
    assert_eq!(retry.status(), 201, "{:?}", retry.text().await);
    assert_eq!(db_count(&dir, "SELECT COUNT(*) FROM orders").await, 1);
}

/// Returns once an order waits for the lock of `stock:SK-1` (its attempt marked the held
/// lock with the field `w`), which an order takes before its idempotency record.
async fn waits_for_the_stock_lock(redis: &RedisServer) {
    let mut conn = redis.connection();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let waited = redis.keys().iter().any(|key| {
            key.contains("reserve_stock")
                && key.ends_with("stock:SK-1}")
                && redis::cmd("HEXISTS")
                    .arg(key)
                    .arg("w")
                    .query::<bool>(&mut conn)
                    .unwrap_or(false)
        });
        if waited {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no order waited for the lock: {:?}",
            redis.keys()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Issue 19 item 2: a client whose timeout fires while its order waits for the stock lock
/// goes away; the order is still placed, and the retry gets it within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_write_gets_its_order_on_retry() {
    let (redis, dir, svc) = service(&[]).await;
    svc.set_stock("SK-1", 10, 100).await;
    let holder = redguard::Redguard::redis(redis.url())
        .connect()
        .await
        .unwrap();
    let guard = holder
        .lock("stock:SK-1")
        .scope("order_service::orders::reserve_stock")
        .acquire()
        .await
        .unwrap();
    let request = svc
        .post("/orders", As::Proxied(1))
        .header("idempotency-key", "k")
        .json(&json!({ "sku": "SK-1", "qty": 1 }))
        .send();
    let client = tokio::spawn(request);
    // The order's task waits for the lock: the client goes away.
    waits_for_the_stock_lock(&redis).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    client.abort();
    assert!(
        client.await.unwrap_err().is_cancelled(),
        "answered while the lock was held"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.release().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let placed = loop {
        let retry = svc
            .order(As::Proxied(1), "k", json!({ "sku": "SK-1", "qty": 1 }))
            .await;
        if retry.status() == 201 {
            break retry;
        }
        assert_eq!(
            error_code(retry).await,
            (StatusCode::CONFLICT, "in_progress".into())
        );
        assert!(Instant::now() < deadline, "the retry never got the order");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(placed.headers()["idempotent-replayed"], "true");
    assert_eq!(db_count(&dir, "SELECT COUNT(*) FROM orders").await, 1);
}

/// Issue 19 item 3: a token request refused by `429` or `503 busy` keeps its token, so the
/// retry goes through; a retry of a token submission whose response was lost gets its order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_keep_their_token_and_a_lost_response_is_replayed() {
    let (redis, dir, svc) = service(&[("USER_RATE", "1/s"), ("USER_BURST", "1")]).await;
    svc.set_stock("SK-1", 10, 100).await;
    let token = || async {
        let response = svc.post("/tokens", As::Proxied(9)).send().await.unwrap();
        response.json::<Value>().await.unwrap()["token"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let send = |key: &'static str, token: String| {
        svc.post("/orders", As::Proxied(9))
            .header("idempotency-key", key)
            .header("x-idempotent-token", token)
            .json(&json!({ "sku": "SK-1", "qty": 1 }))
            .send()
    };
    let first = token().await;
    let second = token().await;

    // 429: user 9's burst of 1 is used up by the first request.
    assert_eq!(
        svc.order(As::Proxied(9), "k-0", json!({ "sku": "SK-1", "qty": 1 }))
            .await
            .status(),
        201
    );
    let limited = send("k-1", first.clone()).await.unwrap();
    assert_eq!(limited.status(), 429);
    let wait: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let placed = send("k-1", first.clone()).await.unwrap();
    assert_eq!(placed.status(), 201, "the 429 burnt the token");
    let placed: Value = placed.json().await.unwrap();

    // 503 busy: the stock lock is held past the 300 ms wait.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let holder = redguard::Redguard::redis(redis.url())
        .connect()
        .await
        .unwrap();
    let guard = holder
        .lock("stock:SK-1")
        .scope("order_service::orders::reserve_stock")
        .acquire()
        .await
        .unwrap();
    let busy = send("k-2", second.clone()).await.unwrap();
    assert_eq!(
        error_code(busy).await,
        (StatusCode::SERVICE_UNAVAILABLE, "busy".into())
    );
    guard.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        send("k-2", second).await.unwrap().status(),
        201,
        "the 503 burnt the token"
    );

    // The first submission's response was lost: its retry gets the same order.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = send("k-1", first).await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), placed);
    assert_eq!(db_count(&dir, "SELECT COUNT(*) FROM orders").await, 3);
}

/// Issue 19 items 2 and 9: SIGTERM while the order of a client that already left is still
/// being written: the service finishes it and records it before exiting, so the client's
/// retry, served by a new instance, gets that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_the_orders_of_clients_that_left() {
    let (redis, dir, mut svc) = service(&[]).await;
    svc.set_stock("SK-1", 10, 100).await;
    let holder = redguard::Redguard::redis(redis.url())
        .connect()
        .await
        .unwrap();
    let guard = holder
        .lock("stock:SK-1")
        .scope("order_service::orders::reserve_stock")
        .acquire()
        .await
        .unwrap();
    let client = tokio::spawn(
        svc.post("/orders", As::Proxied(1))
            .header("idempotency-key", "k")
            .json(&json!({ "sku": "SK-1", "qty": 1 }))
            .send(),
    );
    // The order's task waits for the lock (taken before the order begins): leave then.
    waits_for_the_stock_lock(&redis).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    client.abort();
    let _ = client.await;
    let pid = svc.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    guard.release().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = svc.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the service did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}");
    assert_eq!(db_count(&dir, "SELECT COUNT(*) FROM orders").await, 1);
    let next = start(&redis, &temp_db(&dir), "next", &[]).await;
    let retry = next
        .order(As::Proxied(1), "k", json!({ "sku": "SK-1", "qty": 1 }))
        .await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
}

/// The guide's "Redis Sentinel" (`runtime/docs/servers.md`): the service on Sentinel with one setting
/// (`REDGUARD_REDIS_SENTINELS`); after the master is SIGKILLed, orders are placed again once
/// a replica is promoted, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_on_sentinel_and_orders_again_after_a_failover() {
    let mut sentinel = RedisSentinel::start();
    let dir = tempfile::tempdir().unwrap();
    let sentinels = sentinel.sentinel_addrs().join(",");
    let master = sentinel.master();
    let svc = start(
        sentinel.node(master),
        &temp_db(&dir),
        "svc",
        &[("REDGUARD_REDIS_SENTINELS", &sentinels)],
    )
    .await;
    svc.set_stock("SK-1", 10, 100).await;
    let placed = svc
        .order(As::Proxied(1), "k-1", json!({ "sku": "SK-1", "qty": 1 }))
        .await;
    assert_eq!(placed.status(), 201, "{:?}", placed.text().await);

    sentinel.kill_master();
    let killed = Instant::now();
    let recovered = loop {
        let retry = svc
            .order(As::Proxied(1), "k-2", json!({ "sku": "SK-1", "qty": 1 }))
            .await;
        match retry.status().as_u16() {
            201 => break killed.elapsed(),
            503 => {}
            other => panic!("{other}: {:?}", retry.text().await),
        }
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "no order placed 15 s after the kill"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("order-service on Sentinel: orders placed again {recovered:?} after the kill");
    assert_eq!(db_count(&dir, "SELECT COUNT(*) FROM orders").await, 2);
}

/// Sends `request` on its own task: its response and how long it took.
fn timed(
    request: reqwest::RequestBuilder,
) -> tokio::task::JoinHandle<(reqwest::Response, Duration)> {
    tokio::spawn(async move {
        let started = Instant::now();
        let response = request.send().await.unwrap();
        (response, started.elapsed())
    })
}

/// Issue 25 finding 14: another connection holds SQLite's write lock for 4 s. An order
/// waiting on it does not stall its instance: reads (`GET /stock`, `GET /orders`) never wait
/// behind a write, a buyer of the same SKU gets `503 busy` (the stock lock's wait, or its
/// own deadline), and each write waiting on SQLite (that order's, another SKU's) gives up at
/// its request's deadline (`REQUEST_DEADLINE_MS`, 1 s here) with `503 busy`: every answer
/// well before the holder lets go. The job (every 50 ms here) waits on the same lock and stalls
/// nothing either. Nothing was written, so each retry after the holder is served. Then a hold
/// within the deadline: the first order waits it out holding its SKU's lock, so a buyer of the
/// same SKU gets `503 busy` at the lock's wait while one of another SKU is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waiting_on_sqlite_does_not_stall_its_instance() {
    const HOLD: Duration = Duration::from_secs(4);
    let (_redis, dir, svc) = service(&[("REQUEST_DEADLINE_MS", "1000")]).await;
    svc.set_stock("SK-1", 10, 100).await;
    svc.set_stock("SK-2", 10, 100).await;
    let db = temp_db(&dir);
    let (held, is_held) = tokio::sync::oneshot::channel();
    let holder = tokio::spawn(async move {
        use sqlx::Connection as _;
        let mut conn = db_conn(&db).await;
        let tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
        held.send(()).unwrap();
        tokio::time::sleep(HOLD).await;
        tx.commit().await.unwrap();
    });
    is_held.await.unwrap();
    let order = |user: u64, key: &str, sku: &str| {
        svc.post("/orders", As::Proxied(user))
            .header("idempotency-key", key)
            .json(&json!({ "sku": sku, "qty": 1 }))
    };
    let first = timed(order(1, "k-a", "SK-1"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stock = timed(svc.get("/stock/SK-2", As::Anonymous));
    let list = timed(svc.get("/orders", As::Proxied(1)));
    let same_sku = timed(order(2, "k-b", "SK-1"));
    let other_sku = timed(order(3, "k-c", "SK-2"));

    let mut answers = Vec::new();
    for (what, handle, want) in [
        ("GET /stock", stock, 200),
        ("GET /orders", list, 200),
        ("the first order", first, 503),
        ("a buyer of the same SKU", same_sku, 503),
        ("a buyer of another SKU", other_sku, 503),
    ] {
        let (response, took) = handle.await.unwrap();
        println!("{what}: {} after {took:?}", response.status());
        answers.push((what, response, took, want));
    }
    let well_under = HOLD / 2;
    for (what, response, took, want) in answers {
        assert!(
            took < well_under,
            "{what} took {took:?} while another connection held the write lock for {HOLD:?}"
        );
        if want == 503 {
            assert_eq!(
                response
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap()),
                Some("1"),
                "{what}"
            );
            assert_eq!(
                error_code(response).await,
                (StatusCode::SERVICE_UNAVAILABLE, "busy".into()),
                "{what}"
            );
        } else {
            assert_eq!(response.status(), want, "{what}");
        }
    }
    holder.await.unwrap();
    for (user, key, sku) in [(1, "k-a", "SK-1"), (2, "k-b", "SK-1"), (3, "k-c", "SK-2")] {
        let retry = order(user, key, sku).send().await.unwrap();
        assert_eq!(retry.status(), 201, "{key}: {:?}", retry.text().await);
    }
    assert_eq!(db_count(&dir, "SELECT COUNT(*) FROM orders").await, 3);

    // Issue 45 item 3: a shorter hold, within the deadline. The first order holds the SKU's
    // lock while it waits for the database, so a buyer of the same SKU is answered `503 busy`
    // at the lock's 300 ms wait, not served after the database comes back; a buyer of another
    // SKU waits only for the database (its own lock is free), and is served.
    const SHORT_HOLD: Duration = Duration::from_millis(700);
    let db = temp_db(&dir);
    let (held, is_held) = tokio::sync::oneshot::channel();
    let holder = tokio::spawn(async move {
        use sqlx::Connection as _;
        let mut conn = db_conn(&db).await;
        let tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
        held.send(()).unwrap();
        tokio::time::sleep(SHORT_HOLD).await;
        tx.commit().await.unwrap();
    });
    is_held.await.unwrap();
    let first = timed(order(1, "k-d", "SK-1"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let same_sku = timed(order(2, "k-e", "SK-1"));
    let other_sku = timed(order(3, "k-f", "SK-2"));
    let (first, first_took) = first.await.unwrap();
    let (same_sku, same_took) = same_sku.await.unwrap();
    let (other_sku, other_took) = other_sku.await.unwrap();
    println!(
        "database held {SHORT_HOLD:?}: the first order {} after {first_took:?}, a buyer of the \
         same SKU {} after {same_took:?}, of another SKU {} after {other_took:?}",
        first.status(),
        same_sku.status(),
        other_sku.status()
    );
    assert_eq!(first.status(), 201, "{:?}", first.text().await);
    assert!(
        same_took < Duration::from_secs(1),
        "a buyer of the same SKU took {same_took:?}, past the lock's 300 ms wait"
    );
    assert_eq!(
        error_code(same_sku).await,
        (StatusCode::SERVICE_UNAVAILABLE, "busy".into()),
        "a buyer of the same SKU"
    );
    assert_eq!(other_sku.status(), 201, "{:?}", other_sku.text().await);
    assert!(
        other_took < SHORT_HOLD + Duration::from_secs(1),
        "a buyer of another SKU took {other_took:?}"
    );
    holder.await.unwrap();
    assert_eq!(db_count(&dir, "SELECT COUNT(*) FROM orders").await, 5);
}
