//! `cargo run -p order-service -- --help` lists every setting.

#[tokio::main]
async fn main() {
    // Exits with status 2 and clap's message on a bad setting, 0 for --help.
    let config = order_service::Config::load(std::env::args_os()).unwrap_or_else(|err| err.exit());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    if let Err(err) = order_service::run(config).await {
        eprintln!("order-service: {err}");
        std::process::exit(1);
    }
}
