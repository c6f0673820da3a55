//! `cargo run -p order-service [-- --port 8080 ...]`: see `Config` for every setting.

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let config = match order_service::Config::load(std::env::args().skip(1)) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("order-service: {message}");
            std::process::exit(2);
        }
    };
    if let Err(err) = order_service::run(config).await {
        eprintln!("order-service: {err}");
        std::process::exit(1);
    }
}
