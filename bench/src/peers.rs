//! Peer libraries in the same run: `peers/peers.mjs` runs rate-limiter-flexible and redlock
//! (on ioredis) in the closed loop of `measure.rs` against the bench's own Redis. Their
//! published figures come from other machines; only a same-run ratio compares. Optional: the
//! bench runs without node.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::measure::Sample;

/// The Node project beside this crate's sources.
const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/peers");

/// Whether the peers can run: node is there and the project's packages are installed (by
/// `npm ci`, the first time). Says why not, in one line.
pub(crate) fn ready() -> bool {
    let installed = install();
    if let Err(reason) = &installed {
        println!("peers skipped: {reason} (install node + npm, or run npm ci in bench/peers)");
    }
    installed.is_ok()
}

fn install() -> Result<(), String> {
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|out| out.status.success()) {
        return Err("node not found".to_owned());
    }
    if Path::new(DIR).join("node_modules").is_dir() {
        return Ok(());
    }
    let npm = Command::new("npm")
        .args([
            "ci",
            "--loglevel",
            "error",
            "--no-audit",
            "--no-fund",
            "--prefix",
            DIR,
        ])
        .output()
        .map_err(|e| format!("npm: {e}"))?;
    if npm.status.success() {
        Ok(())
    } else {
        Err(format!("npm ci failed: {}", error_line(&npm.stderr)))
    }
}

/// `peers.mjs --case <case>` with `in_flight` loops against the Redis on `port`, on the load
/// core like redis-benchmark. `None` (and a line saying why) when it fails.
pub(crate) fn run(
    port: u16,
    case: &str,
    in_flight: usize,
    warmup: Duration,
    window: Duration,
) -> Option<Sample> {
    let output = crate::on_load_core("node")
        .arg(Path::new(DIR).join("peers.mjs"))
        .args(["--port", &port.to_string()])
        .args(["--case", case])
        .args(["--in-flight", &in_flight.to_string()])
        .args(["--warmup-ms", &warmup.as_millis().to_string()])
        .args(["--window-ms", &window.as_millis().to_string()])
        .output();
    let parsed = output
        .map_err(|e| e.to_string())
        .and_then(|out| parse(&out));
    parsed
        .map_err(|reason| println!("peer {case} at {in_flight} failed: {reason}"))
        .ok()
}

/// The script's one JSON line.
fn parse(out: &Output) -> Result<Sample, String> {
    if !out.status.success() {
        return Err(format!("{}: {}", out.status, error_line(&out.stderr)));
    }
    let line = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(line.trim()).map_err(|e| format!("{e} in {line:?}"))
}

/// The line of an error output that says what went wrong (npm's error code, node's error,
/// past the source excerpt it prints first), else its first line.
fn error_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.lines().map(str::trim).filter(|line| !line.is_empty());
    let first = lines.clone().next();
    let line = lines.find(|line| line.contains("rror")).or(first);
    line.unwrap_or("no output").to_owned()
}
