//! What Redis itself runs for an operation, from `INFO commandstats` (and `INFO cpu`) before
//! and after: the self-check that every raw EVALSHA baseline makes Redis run the same
//! commands per operation as its runtime-API row (a baseline whose script answers at its
//! first line does no work and measures nothing), and the lock cycle's server cost, ours
//! beside rslock's.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use redguard::Redguard;
use redguard::rate::Algorithm;
use redis::aio::ConnectionManager;

use crate::measure::{OPERATIONS, closed_loop};
use crate::{Bench, idem, lock, rate};

/// One operation, boxed so rows of different closures fit one list.
pub(crate) type Op = Arc<dyn Fn(u64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

pub(crate) fn op<F, Fut>(f: F) -> Op
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move |i| Box::pin(f(i)))
}

/// Redis's counters: per command (lower case, `a|b` for subcommands) its calls and µs, and the
/// main thread's CPU µs (user + system).
#[derive(Debug, Clone, Default)]
pub(crate) struct Stats {
    pub(crate) commands: BTreeMap<String, (u64, u64)>,
    pub(crate) cpu_us: f64,
}

impl Stats {
    /// `after - self`, without the `INFO` calls that read the counters.
    fn until(&self, after: &Stats) -> Stats {
        let mut commands = BTreeMap::new();
        for (name, &(calls, usec)) in &after.commands {
            let (c0, u0) = self.commands.get(name).copied().unwrap_or_default();
            if name != "info" && calls > c0 {
                commands.insert(name.clone(), (calls - c0, usec.saturating_sub(u0)));
            }
        }
        Stats {
            commands,
            cpu_us: after.cpu_us - self.cpu_us,
        }
    }

    /// Calls per operation of each command.
    fn calls_per_op(&self, ops: u64) -> BTreeMap<&str, f64> {
        self.commands
            .iter()
            .map(|(name, &(calls, _))| (name.as_str(), calls as f64 / ops as f64))
            .collect()
    }
}

/// `INFO cpu commandstats`, read.
pub(crate) async fn snapshot(conn: &mut ConnectionManager) -> Stats {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO cpu commandstats");
    parse(&info)
}

fn parse(info: &str) -> Stats {
    let mut stats = Stats::default();
    let (mut user, mut sys) = (None, None);
    for line in info.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("cmdstat_") {
            let Some((name, fields)) = rest.split_once(':') else {
                continue;
            };
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            stats
                .commands
                .insert(name.to_ascii_lowercase(), (field("calls"), field("usec")));
        } else if let Some(v) = line.strip_prefix("used_cpu_user_main_thread:") {
            user = v.parse::<f64>().ok();
        } else if let Some(v) = line.strip_prefix("used_cpu_sys_main_thread:") {
            sys = v.parse::<f64>().ok();
        }
    }
    stats.cpu_us = (user.unwrap_or(0.0) + sys.unwrap_or(0.0)) * 1e6;
    stats
}

/// `n` operations `op(start..start + n)`, one after the other, and what Redis ran for them.
pub(crate) async fn burst(conn: &mut ConnectionManager, n: u64, start: u64, op: &Op) -> Stats {
    let before = snapshot(conn).await;
    for i in start..start + n {
        op(i).await;
    }
    before.until(&snapshot(conn).await)
}

/// Commands the runtime API may send beyond its raw baseline, at most once per handle (not
/// per operation): the release bus's one `PSUBSCRIBE` to its prefix.
const PER_HANDLE_EXTRAS: [&str; 2] = ["psubscribe", "subscribe"];

/// How far apart the API's and the raw row's calls per operation of a command may be.
const TOLERANCE: f64 = 0.02;

/// Whether Redis ran the same commands per operation for the raw row as for the API row:
/// same command names, calls per operation within [`TOLERANCE`]; the API may add
/// [`PER_HANDLE_EXTRAS`], once.
pub(crate) fn same_work(name: &str, n: u64, api: &Stats, raw: &Stats) -> Result<(), String> {
    let (a, r) = (api.calls_per_op(n), raw.calls_per_op(n));
    let mut wrong = Vec::new();
    for command in a
        .keys()
        .chain(r.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (x, y) = (
            a.get(command).copied().unwrap_or(0.0),
            r.get(command).copied().unwrap_or(0.0),
        );
        if PER_HANDLE_EXTRAS.contains(command) && y == 0.0 && x * n as f64 <= 1.0 {
            continue;
        }
        if (x - y).abs() > TOLERANCE {
            wrong.push(format!("{command}: API {x:.2}/op, raw {y:.2}/op"));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{name}: the raw EVALSHA baseline does not make Redis do the runtime API's work \
             ({n} ops each; {}). Fix its keys and arguments to match what the runtime sends.",
            wrong.join("; ")
        ))
    }
}

/// The raw/API pairs' names, in [`pairs`]'s order (the cases their rows are named after).
pub(crate) const PAIRS: [&str; 3] = [
    "lock acquire+release random keys",
    "rate gcra random keys",
    "idempotency replay",
];

/// The raw/API pairs of rows in the bench: (name, runtime API, raw EVALSHA).
pub(crate) fn pairs(rg: &Redguard, conn: &ConnectionManager) -> Vec<(&'static str, Op, Op)> {
    let lock_shas = Arc::new(lock::shas());
    let (rg1, conn1) = (rg.clone(), conn.clone());
    let built = Arc::new(rate::limiter(Algorithm::Gcra, 0).on(rg));
    let (rg2, conn2, gcra) = (rg.clone(), conn.clone(), rate::gcra_sha());
    let (rg3, conn3, begin) = (rg.clone(), conn.clone(), idem::replay_sha());
    let [lock_name, gcra_name, replay_name] = PAIRS;
    vec![
        (
            lock_name,
            op(move |i| lock::section(rg1.clone(), i)),
            op(move |i| {
                let (conn, shas) = (conn1.clone(), lock_shas.clone());
                async move { lock::raw_cycle(conn, &shas, i).await }
            }),
        ),
        (
            gcra_name,
            op(move |i| rg2.clone().scope(rate::gcra_check(&built, i))),
            op(move |i| rate::raw_gcra(conn2.clone(), gcra.clone(), i)),
        ),
        (
            replay_name,
            op(move |i| rg3.clone().scope(idem::replay(i))),
            op(move |i| idem::raw_replay(conn3.clone(), begin.clone(), i)),
        ),
    ]
}

/// Operations per side in [`self_check`].
pub(crate) const CHECK_OPS: u64 = 200;

/// Keys of the self-check, far above any closed loop's `i`.
const CHECK_KEYS: u64 = 1 << 40;

/// Every raw/API pair: [`CHECK_OPS`] operations each on fresh keys, and [`same_work`].
pub(crate) async fn self_check(
    conn: &mut ConnectionManager,
    pairs: &[(&'static str, Op, Op)],
) -> Result<(), String> {
    for (k, (name, api, raw)) in pairs.iter().enumerate() {
        let base = CHECK_KEYS + (k as u64) * 4 * CHECK_OPS;
        // Warm-up, not counted: the API loads the scripts the raw row names by SHA.
        api(base).await;
        raw(base + 1).await;
        let api_stats = burst(conn, CHECK_OPS, base + 2, api).await;
        let raw_stats = burst(conn, CHECK_OPS, base + 2 + 2 * CHECK_OPS, raw).await;
        same_work(name, CHECK_OPS, &api_stats, &raw_stats)?;
    }
    Ok(())
}

pub(crate) const COST_CASE: &str = "lock acquire+release random keys, server cost per cycle";

/// Per idempotent first execution (begin + finish on a fresh key), ours beside the raw
/// scripts and a replay's.
pub(crate) const IDEM_COST_CASE: &str = "idempotency first execution, cost per execution";

/// Per GCRA check on random keys, ours (coalesced) beside one `rate_gcra.lua` call each.
pub(crate) const GCRA_COST_CASE: &str = "rate gcra random keys, cost per check";

/// Per acquire + release cycle at 16 and 64 in flight, ours beside the raw scripts and
/// rslock's (see [`per_op`]).
pub(crate) async fn lock_cycle(bench: &mut Bench, rows: Vec<(&'static str, Op)>) {
    per_op(bench, COST_CASE, "rslock", rows).await;
}

/// Per operation at 16 and 64 in flight, from Redis's counters and this process's: each
/// command's calls and µs, the scripts' total, Redis's main thread's CPU and this process's
/// (the client: every thread, the runtime's blocking pool included), for each row in the same
/// run, each divided by `baseline`'s. Printed, and kept in the bench's notes.
pub(crate) async fn per_op(
    bench: &mut Bench,
    case: &'static str,
    baseline: &str,
    rows: Vec<(&'static str, Op)>,
) {
    if !bench.selected(case, "redis") {
        return;
    }
    let mut conn = bench.conn.clone();
    let mut table = String::new();
    let mut totals: BTreeMap<(usize, &str), (f64, f64, f64)> = BTreeMap::new();
    for in_flight in [16, 64] {
        for (row, op) in &rows {
            let op = op.clone();
            let started = OPERATIONS.load(Ordering::Relaxed);
            let before = snapshot(&mut conn).await;
            let client_before = client_cpu_us();
            let sample = closed_loop(in_flight, bench.warmup, bench.window, move |i| op(i)).await;
            let client = client_cpu_us() - client_before;
            let stats = before.until(&snapshot(&mut conn).await);
            let ops = (OPERATIONS.load(Ordering::Relaxed) - started).max(1) as f64;
            // Top-level commands: what a client sent (scripts count their commands inside).
            let top: f64 = stats
                .commands
                .iter()
                .filter(|(name, _)| is_top_level(row, name))
                .map(|(_, &(_, usec))| usec as f64)
                .sum::<f64>()
                / ops;
            let (cpu, client) = (stats.cpu_us / ops, client / ops);
            totals.insert((in_flight, row), (top, cpu, client));
            let _ = write!(
                table,
                "| {row} | {in_flight} | {:.0} | {top:.2} | {cpu:.2} | {client:.2} |",
                sample.ops_per_sec
            );
            for (name, &(calls, usec)) in &stats.commands {
                let _ = write!(
                    table,
                    " {name} {:.2}×{:.2}µs",
                    calls as f64 / ops,
                    usec as f64 / calls.max(1) as f64
                );
            }
            table.push_str(" |\n");
        }
    }
    println!(
        "\n{case}\n| row | N | ops/s | commands µs/op | server CPU µs/op | client CPU µs/op | per command: calls/op × µs/call |\n|---|---|---|---|---|---|---|\n{table}"
    );
    for ((in_flight, row), (top, cpu, client)) in &totals {
        if let Some((btop, bcpu, bclient)) = totals.get(&(*in_flight, baseline)).copied()
            && *row != baseline
        {
            bench.notes.push(format!(
                "{case}: {row} ÷ {baseline} at {in_flight}: commands µs {:.2}, server CPU µs {:.2}, client CPU µs {:.2}",
                top / btop,
                cpu / bcpu,
                client / bclient
            ));
            println!("{}", bench.notes.last().expect("pushed"));
        }
    }
}

/// This process's CPU time so far (user + system, every thread), in µs.
#[allow(unsafe_code)]
fn client_cpu_us() -> f64 {
    // SAFETY: `getrusage` writes the struct it is given and nothing else.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

/// Whether `command` is one a client of `row` sends itself (its µs include nothing counted
/// twice): scripts and their loading, rslock's `SET NX PX`, and the native design's `SET`
/// and `DEL`.
fn is_top_level(row: &str, command: &str) -> bool {
    matches!(command, "evalsha" | "eval" | "script|load" | "psubscribe")
        || (row == "rslock" && command == "set")
        || (row.starts_with("design: SET") && matches!(command, "set" | "del"))
}
