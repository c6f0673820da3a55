//! The order service end to end: real Redis, several instances (child processes) on one
//! SQLite file, the load generator, and every status of the HTTP contract provoked over HTTP.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redguard_tests::RedisServer;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A running `order-service` process, killed on drop.
struct Instance {
    child: Child,
    url: String,
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

async fn start(redis: &RedisServer, db: &Path, name: &str, env: &[(&str, &str)]) -> Instance {
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_order-service"));
    command
        .env("PORT", port.to_string())
        .env("ORDER_DB", db)
        .env("REDGUARD_REDIS_URL", redis.url())
        .env("INSTANCE_ID", name)
        .env("JOB_TICK_MS", "50")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (key, value) in env {
        command.env(key, value);
    }
    let instance = Instance {
        child: command.spawn().expect("spawn order-service"),
        url: format!("http://127.0.0.1:{port}"),
    };
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(response) = client.get(format!("{}/healthz", instance.url)).send().await {
            let health: Value = response.json().await.unwrap();
            assert_eq!(health["store"], "redis");
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
    let conn = rusqlite::Connection::open(&db).unwrap();
    let available: i64 = conn
        .query_row(
            "SELECT SUM(available) FROM stock WHERE sku LIKE 'LG-%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let sold: i64 = conn
        .query_row(
            "SELECT SUM(qty) FROM orders WHERE sku LIKE 'LG-%' AND status != 'closed'",
            [],
            |r| r.get(0),
        )
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

async fn get_json(client: &reqwest::Client, url: String) -> Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

async fn post_order(
    client: &reqwest::Client,
    url: &str,
    user: &str,
    key: &str,
    body: Value,
) -> reqwest::Response {
    client
        .post(format!("{url}/orders"))
        .header("x-user-id", user)
        .header("idempotency-key", key)
        .json(&body)
        .send()
        .await
        .unwrap()
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
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db = temp_db(&dir);
    let svc = start(&redis, &db, "status", &[]).await;
    let url = svc.url.as_str();
    let client = reqwest::Client::new();

    let set = client
        .post(format!("{url}/admin/stock"))
        .json(&json!({ "sku": "SK-1", "available": 5 }))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    let stock: Value = get_json(&client, format!("{url}/stock/SK-1")).await;
    assert_eq!(stock, json!({ "sku": "SK-1", "available": 5 }));
    assert_eq!(
        client
            .get(format!("{url}/stock/NOPE"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );

    // 201, then the replay with the same status and body.
    let first = post_order(&client, url, "1", "k-1", json!({ "sku": "SK-1", "qty": 2 })).await;
    assert_eq!(first.status(), 201);
    assert!(!first.headers().contains_key("idempotent-replayed"));
    let first: Value = first.json().await.unwrap();
    assert_eq!(
        (first["user_id"].as_u64(), first["qty"].as_u64()),
        (Some(1), Some(2))
    );
    assert!(first["fence"].as_u64().unwrap() > 0);
    let again = post_order(&client, url, "1", "k-1", json!({ "sku": "SK-1", "qty": 2 })).await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), first);

    // 422: same key, different body.
    let reuse = post_order(&client, url, "1", "k-1", json!({ "sku": "SK-1", "qty": 3 })).await;
    assert_eq!(
        error_code(reuse).await,
        (StatusCode::UNPROCESSABLE_ENTITY, "key_reuse".into())
    );

    // 400s: nothing written anywhere.
    let before = snapshot(&redis);
    for (user, key) in [
        ("", "k-2"),
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
    // Nothing new and nothing changed; a key may only have gone (GCRA state expires as soon
    // as its bucket is full again).
    for (key, value) in snapshot(&redis) {
        assert_eq!(before.get(&key), Some(&value), "a 400 wrote {key}");
    }

    // 409 out_of_stock is a business error: after a restock the same key runs again.
    let short = post_order(&client, url, "2", "k-3", json!({ "sku": "SK-1", "qty": 4 })).await;
    assert_eq!(
        error_code(short).await,
        (StatusCode::CONFLICT, "out_of_stock".into())
    );
    client
        .post(format!("{url}/admin/stock"))
        .json(&json!({ "sku": "SK-1", "available": 10 }))
        .send()
        .await
        .unwrap();
    let retried = post_order(&client, url, "2", "k-3", json!({ "sku": "SK-1", "qty": 4 })).await;
    assert_eq!(retried.status(), 201);

    // 409 in_progress: a record left PROCESSING (an instance died mid-order).
    let mut conn = redis.connection();
    let record = "redguard:idem:{order_service::orders::submit_order:3:k-4}";
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
    let busy = post_order(&client, url, "3", "k-4", json!({ "sku": "SK-1", "qty": 1 })).await;
    assert_eq!(
        error_code(busy).await,
        (StatusCode::CONFLICT, "in_progress".into())
    );

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
    let waited = post_order(&client, url, "4", "k-5", json!({ "sku": "SK-1", "qty": 1 })).await;
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
        let response = client
            .post(format!("{url}/tokens?scene=order-submit"))
            .send()
            .await
            .unwrap();
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
        let response = post_order(
            &client,
            url,
            "6",
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
    let order: Value = get_json(&client, format!("{url}/orders/{order_id}")).await;
    assert_eq!(order["idempotency_key"], "k-1");
    assert_eq!(
        client
            .get(format!("{url}/orders/999999"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    let mine: Value = get_json(&client, format!("{url}/orders?user_id=1")).await;
    assert_eq!(mine["orders"].as_array().unwrap().len(), 1);

    // Payment callbacks: retried by the provider, recorded once.
    let callback = json!({ "payment_id": "pay-1", "order_id": order_id, "amount": 1999 });
    let mut answers = Vec::new();
    for _ in 0..3 {
        let response = client
            .post(format!("{url}/payments/callback"))
            .json(&callback)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        answers.push(response.json::<Value>().await.unwrap());
    }
    assert!(
        answers
            .iter()
            .all(|a| *a == json!({ "order_id": order_id, "status": "paid" }))
    );
    let ledger: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM ledger WHERE payment_id = 'pay-1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(ledger, 1);

    let metrics = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("redguard_idempotency_total"), "{metrics}");
}
