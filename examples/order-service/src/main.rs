//! `cargo run -p order-service -- --help` lists every setting.

#[tokio::main]
async fn main() {
    // Exits with status 2 and clap's message on a bad setting, 0 for --help.
    let config = order_service::Config::load(std::env::args_os()).unwrap_or_else(|err| err.exit());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        // Colour only for a person at a terminal: never in a pipe or a log file, nor with
        // `NO_COLOR` set (no-color.org: any non-empty value).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stdout())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .init();
    if let Err(err) = order_service::run(config).await {
        eprintln!("order-service: {err}");
        std::process::exit(1);
    }
}
