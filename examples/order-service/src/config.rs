//! Configuration from the environment, each variable also accepted as a `--kebab-case` flag.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Everything the service reads at startup.
#[derive(Debug, Clone)]
pub struct Config {
    /// `PORT` (default 8080).
    pub port: u16,
    /// `ORDER_DB`: the SQLite file (default: a new `orders-<pid>-<ms>.db` in the system temp
    /// dir, so each run starts empty; set it to keep orders across runs or share them between
    /// instances).
    pub db_path: PathBuf,
    /// `REDGUARD_REDIS_URL`: unset → in-memory store (one instance only).
    pub redis_url: Option<String>,
    /// `INSTANCE_ID` (default `<hostname>-<pid>`).
    pub instance: String,
    /// `USER_RATE` (default `5/s`): per-user order submissions.
    pub user_rate: String,
    /// `USER_BURST` (default 10).
    pub user_burst: u64,
    /// `API_RATE` (default `1000/s`): all order submissions together.
    pub api_rate: String,
    /// `JOB_TICK_MS` (default 1000): how often the unpaid-order job runs.
    pub job_tick: Duration,
    /// `UNPAID_TIMEOUT_MS` (default 900000): unpaid orders older than this are closed.
    pub unpaid_timeout: Duration,
}

impl Config {
    /// The API-wide burst: one period's worth of the API rate (`API_RATE` = "1000/s" → 1000).
    pub fn api_burst(&self) -> u64 {
        self.api_rate
            .split('/')
            .next()
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or(1)
    }

    /// Reads `--name value` / `--name=value` flags, then the environment, then defaults.
    pub fn load(args: impl IntoIterator<Item = String>) -> Result<Config, String> {
        let flags = parse_flags(args)?;
        let get = |name: &str| -> Option<String> {
            let flag = name.to_ascii_lowercase().replace('_', "-");
            flags
                .iter()
                .find(|(k, _)| *k == flag)
                .map(|(_, v)| v.clone())
                .or_else(|| std::env::var(name).ok())
                .filter(|v| !v.trim().is_empty())
        };
        let number = |name: &str, default: u64| -> Result<u64, String> {
            get(name).map_or(Ok(default), |v| {
                v.trim()
                    .parse()
                    .map_err(|_| format!("{name} must be a non-negative integer, got {v:?}"))
            })
        };
        let port = number("PORT", 8080)?;
        Ok(Config {
            port: u16::try_from(port).map_err(|_| format!("PORT {port} is out of range"))?,
            db_path: get("ORDER_DB").map(PathBuf::from).unwrap_or_else(fresh_db),
            redis_url: get("REDGUARD_REDIS_URL"),
            instance: get("INSTANCE_ID").unwrap_or_else(default_instance),
            user_rate: get("USER_RATE").unwrap_or_else(|| "5/s".to_owned()),
            user_burst: number("USER_BURST", 10)?,
            api_rate: get("API_RATE").unwrap_or_else(|| "1000/s".to_owned()),
            job_tick: Duration::from_millis(number("JOB_TICK_MS", 1000)?.max(10)),
            unpaid_timeout: Duration::from_millis(number("UNPAID_TIMEOUT_MS", 900_000)?),
        })
    }
}

fn parse_flags(args: impl IntoIterator<Item = String>) -> Result<Vec<(String, String)>, String> {
    let mut flags = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let Some(flag) = arg.strip_prefix("--") else {
            return Err(format!(
                "unexpected argument {arg:?}; flags look like --port 8080"
            ));
        };
        match flag.split_once('=') {
            Some((name, value)) => flags.push((name.to_owned(), value.to_owned())),
            None => {
                let value = args
                    .next()
                    .ok_or_else(|| format!("--{flag} needs a value"))?;
                flags.push((flag.to_owned(), value));
            }
        }
    }
    Ok(flags)
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

    #[test]
    fn flags_override_and_default() {
        let config = Config::load(
            ["--port", "9001", "--user-burst=3", "--instance-id", "a"].map(String::from),
        )
        .unwrap();
        assert_eq!(config.port, 9001);
        assert_eq!(config.user_burst, 3);
        assert_eq!(config.instance, "a");
        assert_eq!(config.job_tick, Duration::from_millis(1000));
        assert!(Config::load(["--port".to_owned()]).is_err());
        assert!(Config::load(["--port", "x"].map(String::from)).is_err());
    }
}
