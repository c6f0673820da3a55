//! The order service: an axum HTTP API over SQLite, with redguard's three guards.
//!
//! `cargo run -p order-service` starts it on the in-memory store; with `REDGUARD_REDIS_URL`
//! set it uses Redis and several instances may share one database file.

mod api;
mod config;
mod db;
mod error;
mod job;
mod orders;

use std::sync::Arc;

pub use crate::config::Config;
pub use crate::db::{Db, Order};
pub use crate::orders::{App, OrderRequest, Placed};

/// Starts the service and serves until the process is stopped.
pub async fn run(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let rg = match &config.redis_url {
        Some(url) => redguard::Redguard::redis(url).connect().await?,
        None => {
            tracing::warn!(
                "REDGUARD_REDIS_URL is unset: using the in-memory store, which is safe for ONE \
                 instance only"
            );
            redguard::Redguard::memory()
        }
    };
    let rg = rg.install()?;
    let db = Db::open(&config.db_path)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", config.port)).await?;
    println!(
        "order-service {} listening on http://{} (store: {}, database: {})",
        config.instance,
        listener.local_addr()?,
        rg.store().kind(),
        config.db_path.display()
    );
    let app = Arc::new(App {
        db,
        store: rg.store().kind().as_str(),
        config,
    });
    tokio::spawn(job::run(app.clone()));
    axum::serve(listener, api::router(app, metrics)).await?;
    Ok(())
}
