//! Configuration: every setting a `--kebab-case` flag or an environment variable, checked at
//! startup (a bad value stops the service with exit status 2, never a 500 per request).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use redguard::rate::Rate;

/// Everything the service reads at startup. `order-service --help` lists it.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "order-service",
    version,
    about = "The redguard example order service"
)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "BIND", default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// Port to listen on.
    #[arg(long, env = "PORT", default_value_t = 8080)]
    pub port: u16,
    /// The SQLite file. Default: a new file in the temp dir, so each run starts empty; set it
    /// to keep orders across runs or share them between instances.
    #[arg(long = "order-db", env = "ORDER_DB")]
    pub db_path: Option<PathBuf>,
    /// Redis URL; unset: the in-memory store (one instance only).
    #[arg(long, env = "REDGUARD_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Redis Sentinel instead of one Redis: the sentinels' `host:port`s, comma-separated.
    #[arg(
        long,
        env = "REDGUARD_REDIS_SENTINELS",
        value_delimiter = ',',
        conflicts_with = "redis_url"
    )]
    pub redis_sentinels: Vec<String>,
    /// The master name the sentinels monitor.
    #[arg(long, env = "REDGUARD_REDIS_MASTER", default_value = "mymaster")]
    pub redis_master: String,
    /// This instance's name in logs and the job's records (default `<hostname>-<pid>`).
    #[arg(long = "instance-id", env = "INSTANCE_ID")]
    pub instance: Option<String>,

    /// Signs users' bearer tokens (at least 16 bytes; keep it secret, share it only with
    /// instances of this service).
    #[arg(long, env = "AUTH_SECRET", hide_env_values = true, value_parser = secret)]
    pub auth_secret: Option<Secret>,
    /// The admin credential for `/admin/*` (`Authorization: Bearer <ADMIN_TOKEN>`, at least
    /// 16 bytes).
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true, value_parser = secret)]
    pub admin_token: Option<Secret>,
    /// Shared with the payment provider: signs its callbacks (at least 16 bytes).
    #[arg(long, env = "PAYMENT_SECRET", hide_env_values = true, value_parser = secret)]
    pub payment_secret: Option<Secret>,
    /// Peers whose `X-User-Id` header is believed (your authenticating gateway), comma
    /// separated. Empty: only bearer tokens identify users.
    #[arg(long, env = "TRUSTED_PROXIES", default_value = "", value_parser = addresses)]
    pub trusted_proxies: Addresses,
    /// Try it locally: well-known secrets and admin token, 127.0.0.1 and ::1 trusted as
    /// proxies, for any of them not set. Refused with a non-loopback `--bind`.
    #[arg(long)]
    pub dev: bool,

    /// Order submissions per user.
    #[arg(long, env = "USER_RATE", default_value = "5/s", value_parser = rate)]
    pub user_rate: Rate,
    /// Burst of order submissions per user.
    #[arg(long, env = "USER_BURST", default_value_t = 10)]
    pub user_burst: u64,
    /// Order submissions of all users together (its count is also the burst).
    #[arg(long, env = "API_RATE", default_value = "1000/s", value_parser = rate)]
    pub api_rate: Rate,
    /// Idempotency tokens issued per user (`POST /tokens`).
    #[arg(long, env = "TOKEN_RATE", default_value = "1/s", value_parser = rate)]
    pub token_rate: Rate,
    /// Burst of tokens per user.
    #[arg(long, env = "TOKEN_BURST", default_value_t = 5)]
    pub token_burst: u64,
    /// Tokens issued to all users together (its count is also the burst).
    #[arg(long, env = "TOKEN_API_RATE", default_value = "100/s", value_parser = rate)]
    pub token_api_rate: Rate,
    /// Payment callbacks accepted (after their signature is checked; the count is the burst).
    #[arg(long, env = "CALLBACK_RATE", default_value = "100/s", value_parser = rate)]
    pub callback_rate: Rate,
    /// How far a callback's signed timestamp may be from this server's clock, in seconds.
    #[arg(long, env = "CALLBACK_WINDOW_S", default_value_t = 300)]
    pub callback_window_s: u64,

    /// A connection's request head must arrive within this many ms.
    #[arg(long, env = "HEADER_TIMEOUT_MS", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_ms: u64,
    /// A request body must arrive within this many ms.
    #[arg(long, env = "BODY_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout_ms: u64,
    /// Largest request body, in bytes.
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = 16 * 1024)]
    pub max_body_bytes: usize,
    /// Connections served at once; more wait in the listen backlog.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// A request's database waits (for a connection, for SQLite's write lock) end this many
    /// ms after it was read, and a job run's after it began: past it the request answers
    /// `503 busy`, having written nothing. Below the stock lock's 10 s lease, so an order's
    /// write never starts after its lock expired.
    #[arg(long, env = "REQUEST_DEADLINE_MS", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..10_000))]
    pub request_deadline_ms: u64,
    /// On SIGTERM/SIGINT, how long in-flight requests get to finish, in ms.
    #[arg(long, env = "SHUTDOWN_GRACE_MS", default_value_t = 30_000)]
    pub shutdown_grace_ms: u64,

    /// How often the unpaid-order job runs, in ms.
    #[arg(long, env = "JOB_TICK_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    pub job_tick_ms: u64,
    /// Unpaid orders older than this many ms are closed and their stock given back.
    #[arg(long, env = "UNPAID_TIMEOUT_MS", default_value_t = 900_000)]
    pub unpaid_timeout_ms: u64,
}

/// Dev mode's well-known credentials: never valid outside loopback.
const DEV_AUTH_SECRET: &str = "dev-only-auth-secret";
const DEV_ADMIN_TOKEN: &str = "dev-only-admin-token";
const DEV_PAYMENT_SECRET: &str = "dev-only-payment-secret";

impl Config {
    /// Parses flags (then the environment, then defaults) and checks them together. `Err`
    /// is clap's, printed by `exit()`: status 0 for `--help`, 2 for a bad setting.
    pub fn load<I, T>(args: I) -> Result<Config, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut config = Config::try_parse_from(args)?;
        let fail = |message: String| Config::command().error(ErrorKind::InvalidValue, message);
        if config.dev {
            if !config.bind.is_loopback() {
                return Err(fail(format!(
                    "--dev uses well-known credentials: it serves loopback only, not {}",
                    config.bind
                )));
            }
            let fill = |value: &mut Option<Secret>, dev: &str| {
                value.get_or_insert_with(|| Secret(dev.to_owned()));
            };
            fill(&mut config.auth_secret, DEV_AUTH_SECRET);
            fill(&mut config.admin_token, DEV_ADMIN_TOKEN);
            fill(&mut config.payment_secret, DEV_PAYMENT_SECRET);
            if config.trusted_proxies.0.is_empty() {
                config.trusted_proxies.0 =
                    vec![[127, 0, 0, 1].into(), std::net::Ipv6Addr::LOCALHOST.into()];
            }
        }
        for (value, name) in [
            (&config.auth_secret, "AUTH_SECRET"),
            (&config.admin_token, "ADMIN_TOKEN"),
            (&config.payment_secret, "PAYMENT_SECRET"),
        ] {
            if value.is_none() {
                return Err(Config::command().error(
                    ErrorKind::MissingRequiredArgument,
                    format!("{name} is required (or --dev, to try the service on this machine)"),
                ));
            }
        }
        Ok(config)
    }

    /// The API-wide burst: one period's worth of the API rate (`1000/s` → 1000).
    pub fn api_burst(&self) -> u64 {
        self.api_rate.count()
    }

    pub(crate) fn db_path(&self) -> PathBuf {
        self.db_path.clone().unwrap_or_else(fresh_db)
    }

    pub(crate) fn instance(&self) -> String {
        self.instance.clone().unwrap_or_else(default_instance)
    }

    /// When the database waits of work starting now end.
    pub(crate) fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_millis(self.request_deadline_ms)
    }

    pub(crate) fn job_tick(&self) -> Duration {
        Duration::from_millis(self.job_tick_ms)
    }

    pub(crate) fn unpaid_timeout(&self) -> Duration {
        Duration::from_millis(self.unpaid_timeout_ms)
    }
}

/// IP addresses, comma separated; empty for none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Addresses(pub Vec<IpAddr>);

fn addresses(value: &str) -> Result<Addresses, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|address| !address.is_empty())
        .map(|address| {
            address
                .parse()
                .map_err(|_| format!("{address:?} is not an IP address"))
        })
        .collect::<Result<_, _>>()
        .map(Addresses)
}

/// A secret setting; `Debug` does not show it, so a logged `Config` leaks nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

fn secret(value: &str) -> Result<Secret, String> {
    if value.len() < 16 {
        return Err("must be at least 16 bytes".to_owned());
    }
    Ok(Secret(value.to_owned()))
}

fn rate(value: &str) -> Result<Rate, String> {
    value
        .parse()
        .map_err(|err: redguard::Error| err.to_string())
}

/// A database file no earlier run used: the process id and the start time name it.
fn fresh_db() -> PathBuf {
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    std::env::temp_dir().join(format!("orders-{}-{started}.db", std::process::id()))
}

fn default_instance() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "host".to_owned());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(args: &[&str]) -> Result<Config, clap::Error> {
        Config::load(std::iter::once("order-service").chain(args.iter().copied()))
    }

    #[test]
    fn flags_override_defaults_and_bad_values_are_refused() {
        let config = load(&[
            "--dev",
            "--port",
            "9001",
            "--user-burst=3",
            "--instance-id",
            "a",
        ])
        .unwrap();
        assert_eq!(config.port, 9001);
        assert_eq!(config.user_burst, 3);
        assert_eq!(config.instance(), "a");
        assert_eq!(config.job_tick_ms, 1000);
        assert_eq!(config.admin_token, Some(Secret(DEV_ADMIN_TOKEN.to_owned())));
        assert!(!format!("{config:?}").contains(DEV_ADMIN_TOKEN));
        assert_eq!(config.trusted_proxies.0.len(), 2);
        let config = load(&["--dev", "--trusted-proxies", "10.0.0.1, ::1"]).unwrap();
        assert_eq!(
            config.trusted_proxies.0,
            [
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "::1".parse().unwrap()
            ]
        );
        for bad in [
            &["--dev", "--port"][..],
            &["--dev", "--port", "x"],
            &["--dev", "--user-rate", "5/fortnight"],
            &["--dev", "--bind", "0.0.0.0"],
            &["--dev", "--auth-secret", "short"],
            &["--dev", "--unknown-flag", "1"],
            &["--dev", "--trusted-proxies", "10.0.0.1,gateway"],
            &["--dev", "--request-deadline-ms", "10000"],
            &["--port", "9001"],
        ] {
            let err = load(bad).expect_err(&format!("{bad:?} accepted"));
            assert_eq!(err.exit_code(), 2, "{bad:?}: {err}");
        }
    }
}
