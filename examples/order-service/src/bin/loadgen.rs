//! Load generator: sends every order intent several times, concurrently, across instances,
//! then checks the database for what must never happen.
//!
//! ```text
//! loadgen --targets http://127.0.0.1:8081,http://127.0.0.1:8082 --db /tmp/orders.db \
//!         --admin-token <ADMIN_TOKEN> [--intents 2000] [--dups 3] [--concurrency 64] [--skus 5] [--stock 500] [--users 200]
//! ```
//! The instances must trust this machine as a proxy (`TRUSTED_PROXIES=127.0.0.1`): orders
//! carry `X-User-Id`, as behind an authenticating gateway.
//! Exits non-zero when a must-be-0 line is not 0.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::Connection as _;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use tokio::sync::Semaphore;

/// Sends every order intent several times, concurrently, across instances, then checks the
/// database for what must never happen. Exits 1 when a must-be-0 line is not 0.
#[derive(clap::Parser)]
#[command(name = "loadgen")]
struct Args {
    /// The instances' base URLs, comma separated.
    #[arg(long, required = true, value_delimiter = ',')]
    targets: Vec<String>,
    /// The instances' SQLite database file, read after the run.
    #[arg(long)]
    db: String,
    /// The instances' admin token (stocks the SKUs).
    #[arg(long)]
    admin_token: String,
    /// Order intents.
    #[arg(long, default_value_t = 2000)]
    intents: usize,
    /// Sends of each intent.
    #[arg(long, default_value_t = 3, value_parser = at_least_one)]
    dups: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    concurrency: usize,
    /// SKUs ordered.
    #[arg(long, default_value_t = 5, value_parser = at_least_one)]
    skus: usize,
    /// Stock of each SKU.
    #[arg(long, default_value_t = 500)]
    stock: u32,
    /// Users sending the orders.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    users: u64,
}

fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("expected a whole number, at least 1".to_owned()),
    }
}

struct Reply {
    intent: usize,
    status: u16,
    replayed: bool,
    order_id: Option<i64>,
    latency: Duration,
}

#[tokio::main]
async fn main() {
    // Exits 0 with the usage for --help, 2 with clap's message for a bad flag.
    let args = <Args as clap::Parser>::parse();
    match run(args).await {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(err) => {
            eprintln!("loadgen: {err}");
            std::process::exit(2);
        }
    }
}

async fn run(args: Args) -> Result<bool, Box<dyn std::error::Error>> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let skus: Vec<String> = (0..args.skus).map(|i| format!("LG-{i}")).collect();
    for sku in &skus {
        client
            .post(format!("{}/admin/stock", args.targets[0]))
            .bearer_auth(&args.admin_token)
            .json(&json!({ "sku": sku, "available": args.stock, "price": 100 }))
            .send()
            .await?
            .error_for_status()?;
    }

    // Every intent `dups` times, sends interleaved so duplicates race each other.
    let run_id = std::process::id();
    let mut sends: Vec<(usize, usize)> = (0..args.intents)
        .flat_map(|intent| (0..args.dups).map(move |dup| (intent, dup)))
        .collect();
    sends.sort_by_key(|(intent, dup)| (intent / 16, *dup, *intent));
    let limit = Arc::new(Semaphore::new(args.concurrency));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(sends.len());
    for (intent, dup) in sends {
        let permit = limit.clone().acquire_owned().await?;
        let client = client.clone();
        let target = args.targets[(intent + dup) % args.targets.len()].clone();
        let sku = skus[intent % skus.len()].clone();
        let user = intent as u64 % args.users + 1;
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let response = client
                .post(format!("{target}/orders"))
                .header("x-user-id", user.to_string())
                .header("idempotency-key", format!("lg{run_id}-{intent}"))
                .json(&json!({ "sku": sku, "qty": 1 + intent % 3 }))
                .send()
                .await;
            drop(permit);
            let latency = sent.elapsed();
            match response {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let replayed = response.headers().contains_key("idempotent-replayed");
                    let body: Value = response.json().await.unwrap_or(Value::Null);
                    Reply {
                        intent,
                        status,
                        replayed,
                        order_id: body.get("order_id").and_then(Value::as_i64),
                        latency,
                    }
                }
                Err(_) => Reply {
                    intent,
                    status: 0,
                    replayed: false,
                    order_id: None,
                    latency,
                },
            }
        }));
    }
    let mut replies = Vec::with_capacity(tasks.len());
    for task in tasks {
        replies.push(task.await?);
    }
    let elapsed = started.elapsed();

    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    let mut order_ids: HashMap<usize, Vec<i64>> = HashMap::new();
    for reply in &replies {
        *by_status.entry(reply.status).or_default() += 1;
        if let Some(id) = reply.order_id {
            order_ids.entry(reply.intent).or_default().push(id);
        }
    }
    let replays = replies.iter().filter(|r| r.replayed).count();
    // Two answers with different order ids for one intent would be a duplicate order.
    let inconsistent = order_ids
        .values()
        .filter(|ids| ids.iter().any(|id| *id != ids[0]))
        .count();
    let mut latencies: Vec<Duration> = replies.iter().map(|r| r.latency).collect();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];

    let mut db = SqliteConnection::connect_with(
        &SqliteConnectOptions::new()
            .filename(&args.db)
            .read_only(true)
            .busy_timeout(Duration::from_secs(10)),
    )
    .await?;
    let prefix = format!("lg{run_id}-%");
    let orders: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE idempotency_key LIKE ?1")
            .bind(&prefix)
            .fetch_one(&mut db)
            .await?;
    let distinct: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT DISTINCT user_id, idempotency_key FROM orders WHERE idempotency_key LIKE ?1)",
    )
    .bind(&prefix)
    .fetch_one(&mut db)
    .await?;
    let duplicates = (orders - distinct) as usize + inconsistent;
    let mut oversold = 0i64;
    let mut stock_mismatch = 0i64;
    for sku in &skus {
        let sold: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(qty), 0) FROM orders WHERE sku = ?1 AND status != 'closed'",
        )
        .bind(sku)
        .fetch_one(&mut db)
        .await?;
        let available: i64 = sqlx::query_scalar("SELECT available FROM stock WHERE sku = ?1")
            .bind(sku)
            .fetch_one(&mut db)
            .await?;
        oversold += (sold - i64::from(args.stock)).max(0);
        stock_mismatch += (i64::from(args.stock) - sold - available).abs();
    }
    let runs: Vec<(i64, i64)> =
        sqlx::query_as("SELECT started_ms, ended_ms FROM job_runs ORDER BY started_ms, ended_ms")
            .fetch_all(&mut db)
            .await?;
    let overlaps = runs.windows(2).filter(|w| w[1].0 < w[0].1).count();

    println!(
        "loadgen: {} requests in {:.2?} ({:.0}/s)",
        replies.len(),
        elapsed,
        replies.len() as f64 / elapsed.as_secs_f64()
    );
    println!("{:<28} {:>10}", "metric", "value");
    for (status, count) in &by_status {
        println!("{:<28} {:>10}", format!("status {status}"), count);
    }
    let rows = [
        ("replays", replays as i64),
        ("orders in database", orders),
        ("distinct intents ordered", distinct),
        ("duplicate orders (must be 0)", duplicates as i64),
        ("oversold units (must be 0)", oversold),
        ("stock mismatch (must be 0)", stock_mismatch),
        ("job runs", runs.len() as i64),
        ("job-run overlaps (must be 0)", overlaps as i64),
    ];
    for (name, value) in rows {
        println!("{name:<28} {value:>10}");
    }
    println!("{:<28} {:>10.2?}", "latency p50", pct(0.50));
    println!("{:<28} {:>10.2?}", "latency p99", pct(0.99));
    Ok(duplicates == 0 && oversold == 0 && stock_mismatch == 0 && overlaps == 0)
}
