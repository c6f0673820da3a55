//! The order service: an axum HTTP API over SQLite (through `sqlx`, so it runs with no
//! database server to install), with redguard's three guards.
//!
//! `cargo run -p order-service -- --dev` starts it on the in-memory store with well-known
//! credentials; with `REDGUARD_REDIS_URL` (one Redis) or `REDGUARD_REDIS_SENTINELS` (Redis
//! Sentinel) set it uses Redis and several instances may share one database file. Its
//! security model is in this example's README.md.

mod api;
mod auth;
mod config;
pub mod db;
mod error;
mod job;
mod orders;
mod serve;

use std::sync::Arc;

pub use crate::auth::sign_callback;
pub use crate::config::{Addresses, Config, Secret};
pub use crate::db::{Db, DbError, Order, Payment};
pub use crate::orders::{App, OrderRequest, Placed};

/// Starts the service and serves until SIGTERM or SIGINT, then drains: in-flight requests
/// (and orders still being written for clients that left) finish, the job stops after its
/// current run, and their locks are released.
pub async fn run(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    // The keys refused and admitted most are gauges named by key (`top_metrics` below):
    // dropped once idle, so a key that left the top does not stay a series.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .idle_timeout(
            metrics_util::MetricKindMask::GAUGE,
            Some(std::time::Duration::from_secs(60)),
        )
        .install_recorder()?;
    let rg = match &config.redis_url {
        Some(url) => {
            redguard::Redguard::redis(url)
                .top_metrics(10)
                .connect()
                .await?
        }
        None if !config.redis_sentinels.is_empty() => {
            redguard::Redguard::redis_sentinel(&config.redis_sentinels, &config.redis_master)
                .top_metrics(10)
                .connect()
                .await?
        }
        None => {
            tracing::warn!(
                "REDGUARD_REDIS_URL and REDGUARD_REDIS_SENTINELS are unset: using the \
                 in-memory store, which is safe for ONE instance only"
            );
            redguard::Redguard::memory()
        }
    };
    let rg = rg.install()?;
    let db_path = config.db_path();
    // A database this run made up is this run's alone: removed however `run` ends.
    let _temporary = config
        .db_path
        .is_none()
        .then(|| TemporaryDb(db_path.clone()));
    let db = Db::open(&db_path).await?;
    let listener = tokio::net::TcpListener::bind((config.bind, config.port)).await?;
    let instance = config.instance();
    println!(
        "order-service {instance} listening on http://{} (store: {}, database: {})",
        listener.local_addr()?,
        rg.kind(),
        db_path.display()
    );
    if config.dev {
        tracing::warn!("--dev: well-known credentials; never expose this instance");
    }
    let app = Arc::new(App {
        db,
        store: rg.kind().as_str(),
        instance,
        keys: auth::Keys::new(&config),
        writes: Arc::default(),
        config,
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let job = tokio::spawn(job::run(app.clone(), stopped));
    let router = api::router(app.clone(), metrics)?;
    serve::serve(listener, router, &app.config, serve::signal()).await;
    // Orders of clients that disconnected run on in their own tasks: let them finish. After
    // its body each records its outcome (and may give a token back), store calls bounded by
    // the handle's timeout that the library does not let us await: wait for two of them.
    let grace = std::time::Duration::from_millis(app.config.shutdown_grace_ms);
    drop(tokio::time::timeout(grace, app.writes.write()).await);
    tokio::time::sleep(rg.timeout() * 2).await;
    let _ = stop.send(true);
    job.await?;
    Ok(())
}

/// Removes a database file made for one run, with SQLite's files beside it (WAL mode), when
/// dropped.
struct TemporaryDb(std::path::PathBuf);

impl Drop for TemporaryDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut path = self.0.clone().into_os_string();
            path.push(suffix);
            // Absent (never made, or SQLite removed it at close) is the goal, not an error.
            let _ = std::fs::remove_file(path);
        }
    }
}
