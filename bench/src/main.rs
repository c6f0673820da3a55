//! `cargo run --release -p redguard-bench [-- --quick]`
//!
//! Starts its own `redis-server` (pinned to core 0 when the machine has two or more cores;
//! the load runs on core 1). For each case
//! it runs a closed loop of N operations in flight (N = 1, 16, 64), and measures Redis's own
//! ceiling for the same script with `redis-benchmark` in the same run, and peer libraries
//! (`peers/`, when node is there) next to the matching cases. Prints a table and writes
//! `target/bench/results.{json,md}`. `--only TEXT` runs only the rows whose "<case> @<store>"
//! contains TEXT (for profiling one path: `--only "gcra random keys (runtime API) @redis"`),
//! without the redis-benchmark baselines; `--no-peers` leaves the peer libraries' rows out.
//! `--guard` runs only the regression guard (`regression.rs`) after the self-check.

mod baseline;
mod batch;
mod charts;
mod cost;
mod idem;
mod idem_wait;
mod inproc;
mod lock;
mod lock_designs;
mod measure;
mod operators;
mod pace;
mod peers;
mod quota;
mod rate;
mod raw;
mod regression;
mod replicas;
mod scale;
mod txn;

use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use redguard::Redguard;
use redis::aio::ConnectionManager;
use serde::Serialize;

use crate::measure::{Latency, Sample, closed_loop, contended};

/// Core for the load (this process, redis-benchmark, the peers); Redis gets core 0.
pub(crate) const LOAD_CORE: Option<&str> = Some("1");

/// Contenders in the one-key lock cases.
const CONTENDERS: [usize; 2] = [16, 64];

/// `program`, run on [`LOAD_CORE`].
pub(crate) fn on_load_core(program: &str) -> std::process::Command {
    let Some(core) = LOAD_CORE else {
        return std::process::Command::new(program);
    };
    let mut command = std::process::Command::new("taskset");
    command.args(["-c", core, program]);
    command
}

#[derive(Debug, Serialize)]
struct Row {
    case: String,
    store: &'static str,
    in_flight: usize,
    #[serde(flatten)]
    sample: Sample,
    /// Contended locks: the previous holder starting its release to the next one's entry.
    handoff: Option<Latency>,
    /// redis-benchmark of the same script at the same concurrency.
    baseline: Option<f64>,
    /// redis-benchmark `-c 16 -P 16`: the server's ceiling for the script.
    ceiling: Option<f64>,
    /// ops/s of the matching peer row (store `peer`) at the same N.
    peer: Option<f64>,
}

impl Row {
    /// A row with no baselines or peer to divide by.
    fn plain(case: &str, store: &'static str, in_flight: usize, sample: Sample) -> Row {
        Row {
            case: case.to_owned(),
            store,
            in_flight,
            sample,
            handoff: None,
            baseline: None,
            ceiling: None,
            peer: None,
        }
    }
}

pub(crate) struct Bench {
    rows: Vec<Row>,
    warmup: Duration,
    window: Duration,
    levels: Vec<usize>,
    port: u16,
    requests: usize,
    /// `--only`: run only the rows whose "<case> @<store>" contains this.
    only: Option<String>,
    /// `--no-peers`: no peer rows, for counting our instructions alone (a Rust peer runs in
    /// this process, on the same `redis` crate: its calls would be counted as ours).
    no_peers: bool,
    /// Whether the peers can run; found out when the first one is selected.
    peers: Option<bool>,
    /// Same-run ratios to the Rust peers, printed under the table.
    notes: Vec<String>,
    /// The kind of connection the runtime uses, for the raw EVALSHA cases.
    pub(crate) conn: ConnectionManager,
}

impl Bench {
    /// `op(i)` in a closed loop at every level of concurrency.
    pub(crate) async fn run<F, Fut>(
        &mut self,
        case: &str,
        store: &'static str,
        baseline: Option<&[f64]>,
        ceiling: Option<f64>,
        peer: &[Option<f64>],
        op: F,
    ) where
        F: Fn(u64) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = ()> + Send,
    {
        if self.selected(case, store) {
            self.run_levels(case, store, baseline, ceiling, peer, op)
                .await;
        }
    }

    /// A Rust peer library's `op(i)` in the same closed loops, as rows named `case`, when it
    /// or one of the cases it is the peer of (`ours`, on Redis) is selected. Its ops/s at
    /// each level.
    pub(crate) async fn run_rust_peer<F, Fut>(
        &mut self,
        case: &str,
        ours: &[String],
        op: F,
    ) -> Vec<Option<f64>>
    where
        F: Fn(u64) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let wanted = self.peer_wanted(case, ours);
        if !wanted {
            return Vec::new();
        }
        let first = self.rows.len();
        self.run_levels(case, "peer", None, None, &[], op).await;
        self.rows[first..]
            .iter()
            .map(|row| Some(row.sample.ops_per_sec))
            .collect()
    }

    /// "Ours ÷ peer" for every level at which both rows ran, noted under the table.
    pub(crate) fn compare(&mut self, ours: &str, store: &str, peer: &str) {
        let mut notes = Vec::new();
        for row in self
            .rows
            .iter()
            .filter(|r| r.case == ours && r.store == store)
        {
            let theirs = self
                .rows
                .iter()
                .find(|r| r.case == peer && r.in_flight == row.in_flight);
            if let Some(theirs) = theirs.filter(|t| t.sample.ops_per_sec > 0.0) {
                notes.push(format!(
                    "{ours} @{store} ÷ {peer} at {}: {:.2}",
                    row.in_flight,
                    row.sample.ops_per_sec / theirs.sample.ops_per_sec
                ));
            }
        }
        for note in notes {
            println!("{note}");
            self.notes.push(note);
        }
    }

    /// The bench's Redis, for peers that connect on their own.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    async fn run_levels<F, Fut>(
        &mut self,
        case: &str,
        store: &'static str,
        baseline: Option<&[f64]>,
        ceiling: Option<f64>,
        peer: &[Option<f64>],
        op: F,
    ) where
        F: Fn(u64) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = ()> + Send,
    {
        for (i, &in_flight) in self.levels.clone().iter().enumerate() {
            let sample = closed_loop(in_flight, self.warmup, self.window, op.clone()).await;
            self.push(Row {
                case: case.to_owned(),
                store,
                in_flight,
                sample,
                handoff: None,
                baseline: baseline.and_then(|b| b.get(i).copied()),
                ceiling,
                peer: peer.get(i).copied().flatten(),
            });
        }
    }

    /// [`Bench::run`] with `op` inside `memory`'s scope (no Redis baselines).
    pub(crate) async fn run_memory<F, Fut>(&mut self, case: &str, memory: &Redguard, op: F)
    where
        F: Fn(u64) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let memory = memory.clone();
        let scoped = move |i| memory.clone().scope(op(i));
        self.run(case, "memory", None, None, &[], scoped).await;
    }

    /// 16 and 64 contenders on one lock; `peer` at each of them.
    pub(crate) async fn run_contended<A, AF, G, R, RF>(
        &mut self,
        case: &str,
        store: &'static str,
        peer: &[Option<f64>],
        acquire: A,
        release: R,
    ) where
        A: Fn() -> AF + Send + Sync + Clone + 'static,
        AF: Future<Output = G> + Send,
        G: Send + 'static,
        R: Fn(G) -> RF + Send + Sync + Clone + 'static,
        RF: Future<Output = ()> + Send,
    {
        if self.selected(case, store) {
            self.contended_levels(case, store, peer, acquire, release)
                .await;
        }
    }

    /// [`Bench::run_contended`] for a Rust peer library, as rows named `case`, when it or
    /// one of the cases it is the peer of (`ours`, on Redis) is selected.
    pub(crate) async fn run_contended_peer<A, AF, G, R, RF>(
        &mut self,
        case: &str,
        ours: &[String],
        acquire: A,
        release: R,
    ) where
        A: Fn() -> AF + Send + Sync + Clone + 'static,
        AF: Future<Output = G> + Send,
        G: Send + 'static,
        R: Fn(G) -> RF + Send + Sync + Clone + 'static,
        RF: Future<Output = ()> + Send,
    {
        if self.peer_wanted(case, ours) {
            self.contended_levels(case, "peer", &[], acquire, release)
                .await;
        }
    }

    async fn contended_levels<A, AF, G, R, RF>(
        &mut self,
        case: &str,
        store: &'static str,
        peer: &[Option<f64>],
        acquire: A,
        release: R,
    ) where
        A: Fn() -> AF + Send + Sync + Clone + 'static,
        AF: Future<Output = G> + Send,
        G: Send + 'static,
        R: Fn(G) -> RF + Send + Sync + Clone + 'static,
        RF: Future<Output = ()> + Send,
    {
        for (i, in_flight) in CONTENDERS.into_iter().enumerate() {
            let (sample, handoff) = contended(
                in_flight,
                self.warmup,
                self.window,
                acquire.clone(),
                release.clone(),
            )
            .await;
            self.push(Row {
                case: case.to_owned(),
                store,
                in_flight,
                sample,
                handoff: Some(handoff),
                baseline: None,
                ceiling: None,
                peer: peer.get(i).copied().flatten(),
            });
        }
    }

    /// The peer `script_case` of `peers.mjs` at every level of closed loops, as rows named
    /// `case`, when it or one of the cases it is the peer of (`ours`) is selected. Its ops/s
    /// at each level, for our rows' "÷ peer".
    pub(crate) fn run_peer(
        &mut self,
        case: &str,
        script_case: &str,
        ours: &[String],
    ) -> Vec<Option<f64>> {
        self.peer_at(case, script_case, ours, self.levels.clone())
    }

    /// [`Bench::run_peer`] for a contended case: at each number of contenders.
    pub(crate) fn run_peer_contended(
        &mut self,
        case: &str,
        script_case: &str,
        ours: &[String],
    ) -> Vec<Option<f64>> {
        self.peer_at(case, script_case, ours, CONTENDERS.to_vec())
    }

    fn peer_at(
        &mut self,
        case: &str,
        script_case: &str,
        ours: &[String],
        levels: Vec<usize>,
    ) -> Vec<Option<f64>> {
        let wanted = self.peer_wanted(case, ours);
        if !wanted || !*self.peers.get_or_insert_with(peers::ready) {
            return Vec::new();
        }
        let mut figures = Vec::new();
        for in_flight in levels {
            let sample = peers::run(self.port, script_case, in_flight, self.warmup, self.window);
            figures.push(sample.as_ref().map(|s| s.ops_per_sec));
            if let Some(sample) = sample {
                self.push(Row::plain(case, "peer", in_flight, sample));
            }
        }
        figures
    }

    /// redis-benchmark running `args` at every level (`-c N`), and its ceiling
    /// (`-c 16 -P 16`).
    /// Redis's own figures for `args` at each level and its ceiling, when a row divided by
    /// them is selected: a row of `cases` on Redis.
    pub(crate) fn baselines(&self, cases: &[&str], args: &[String]) -> (Vec<f64>, Option<f64>) {
        if !cases.iter().any(|case| {
            Ways::names(case)
                .iter()
                .chain(std::iter::once(&(*case).to_owned()))
                .any(|name| self.selected(name, "redis"))
        }) {
            return (Vec::new(), None);
        }
        let rb = |clients, pipeline| {
            baseline::redis_benchmark(self.port, clients, pipeline, self.requests, args)
        };
        let levels = self.levels.iter().map(|&n| rb(n, 1).unwrap_or(0.0));
        (levels.collect(), rb(16, 16))
    }

    /// Whether to run the peer rows `case`: selected themselves, or a case they are the peer
    /// of (`ours`, on Redis) is; never with `--no-peers`.
    fn peer_wanted(&self, case: &str, ours: &[String]) -> bool {
        !self.no_peers
            && (self.selected(case, "peer") || ours.iter().any(|c| self.selected(c, "redis")))
    }

    /// `--only TEXT`: the rows whose "<case> @<store>" contains TEXT.
    fn selected(&self, case: &str, store: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| format!("{case} @{store}").contains(only.as_str()))
    }

    fn push(&mut self, row: Row) {
        print_row(&row);
        self.rows.push(row);
    }
}

/// One operation three ways, against the same baselines: through the attribute, through the
/// runtime API, and as a raw `EVALSHA` of the same script.
pub(crate) struct Ways<'a> {
    pub(crate) case: &'a str,
    pub(crate) base: &'a [f64],
    pub(crate) ceiling: Option<f64>,
    /// The peer library's ops/s at each level (empty: no peer).
    pub(crate) peer: &'a [Option<f64>],
}

impl Ways<'_> {
    const WAYS: [&'static str; 3] = ["attribute", "runtime API", "raw EVALSHA"];

    /// The three rows' case names for `case`.
    pub(crate) fn names(case: &str) -> [String; 3] {
        Self::WAYS.map(|way| format!("{case} ({way})"))
    }

    pub(crate) async fn run<F1, Fut1, F2, Fut2, F3, Fut3>(
        &self,
        bench: &mut Bench,
        annotated: F1,
        api: F2,
        raw: F3,
    ) where
        F1: Fn(u64) -> Fut1 + Send + Sync + Clone + 'static,
        Fut1: Future<Output = ()> + Send,
        F2: Fn(u64) -> Fut2 + Send + Sync + Clone + 'static,
        Fut2: Future<Output = ()> + Send,
        F3: Fn(u64) -> Fut3 + Send + Sync + Clone + 'static,
        Fut3: Future<Output = ()> + Send,
    {
        let base = Some(self.base).filter(|b| !b.is_empty());
        let [attribute, runtime_api, raw_evalsha] = Self::names(self.case);
        let (ceiling, peer) = (self.ceiling, self.peer);
        bench
            .run(&attribute, "redis", base, ceiling, peer, annotated)
            .await;
        bench
            .run(&runtime_api, "redis", base, ceiling, peer, api)
            .await;
        bench
            .run(&raw_evalsha, "redis", base, ceiling, peer, raw)
            .await;
    }
}

fn print_header() {
    println!(
        "{:<48} {:<6} {:>4} {:>11} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7} {:>10}",
        "case",
        "store",
        "N",
        "ops/s",
        "p50 µs",
        "p99 µs",
        "max µs",
        "÷rb -cN",
        "÷ceiling",
        "÷ peer",
        "hand p99"
    );
}

fn ratio(ops: f64, base: Option<f64>) -> String {
    base.filter(|b| *b > 0.0)
        .map_or("-".to_owned(), |b| format!("{:.2}", ops / b))
}

/// The hand-off's p50 / p99 / max, or "-".
fn handoff(row: &Row, sep: &str) -> String {
    row.handoff.as_ref().map_or("-".to_owned(), |h| {
        format!("{:.0}{sep}{:.0}{sep}{:.0}", h.p50_us, h.p99_us, h.max_us)
    })
}

fn print_row(row: &Row) {
    let s = &row.sample;
    println!(
        "{:<48} {:<6} {:>4} {:>11.0} {:>9.1} {:>9.1} {:>9.0} {:>8} {:>8} {:>7} {:>10}",
        row.case,
        row.store,
        row.in_flight,
        s.ops_per_sec,
        s.p50_us,
        s.p99_us,
        s.max_us,
        ratio(s.ops_per_sec, row.baseline),
        ratio(s.ops_per_sec, row.ceiling),
        ratio(s.ops_per_sec, row.peer),
        row.handoff
            .as_ref()
            .map_or("-".to_owned(), |h| format!("{:.0}", h.p99_us)),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let pin = cores >= 2;
    if pin {
        // This process is the load: keep it off Redis's core.
        let _ = std::process::Command::new("taskset")
            .args([
                "-a",
                "-cp",
                LOAD_CORE.unwrap_or("1"),
                &std::process::id().to_string(),
            ])
            .output();
    }
    let server = redguard_tests::RedisServer::start_pinned(pin.then_some("0"));
    let port = server.port();
    let rg = Redguard::redis(server.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await?
        .install()?;
    let memory = Redguard::memory();

    let mut bench = Bench {
        rows: Vec::new(),
        warmup: Duration::from_millis(if quick { 200 } else { 1000 }),
        window: Duration::from_millis(if quick { 500 } else { 3000 }),
        levels: vec![1, 16, 64],
        port,
        requests: if quick { 20_000 } else { 200_000 },
        only,
        no_peers: args.iter().any(|a| a == "--no-peers"),
        peers: None,
        notes: Vec::new(),
        conn: ConnectionManager::new(redis::Client::open(server.url())?).await?,
    };
    println!(
        "redguard-bench: redis-server {} on core 0, load on core 1 ({} cores), window {:?}",
        port, cores, bench.window
    );
    // Before measuring: every raw EVALSHA row makes Redis run what its runtime-API row does.
    let pairs = cost::pairs(&rg, &bench.conn);
    // An error, not an exit: `server` is dropped (stopped) on the way out.
    if let Err(wrong) = cost::self_check(&mut bench.conn.clone(), &pairs).await {
        return Err(format!("self-check failed, nothing measured: {wrong}").into());
    }
    if args.iter().any(|a| a == "--guard") {
        return regression::run(&pairs).await.map_err(Into::into);
    }
    print_header();
    idem::cases(&mut bench, &rg, &memory).await;
    batch::cases(&mut bench, &rg).await;
    idem_wait::cases(&mut bench, &rg).await;
    txn::cases(&mut bench, &rg).await;
    rate::cases(&mut bench, &rg, &memory).await;
    quota::cases(&mut bench, &rg).await;
    operators::cases(&mut bench, &rg).await;
    pace::cases(&mut bench, &rg).await;
    inproc::cases(&mut bench).await;
    lock::cases(&mut bench, &rg, &memory).await;
    replicas::cases(&mut bench).await;
    scale::cases(&mut bench, &rg, &server.url()).await;
    write_reports(&bench.rows, &bench.notes)?;
    println!(
        "operations: {}",
        measure::OPERATIONS.load(std::sync::atomic::Ordering::Relaxed)
    );
    Ok(())
}

fn write_reports(rows: &[Row], notes: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(rows)?,
    )?;
    let mut md = String::from(
        "| case | store | N | ops/s | p50 µs | p99 µs | max µs | ÷ redis-benchmark -c N | ÷ ceiling (-c 16 -P 16) | ÷ peer | hand-off p50 / p99 / max µs |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let s = &row.sample;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.0} | {} | {} | {} | {} |",
            row.case,
            row.store,
            row.in_flight,
            s.ops_per_sec,
            s.p50_us,
            s.p99_us,
            s.max_us,
            ratio(s.ops_per_sec, row.baseline),
            ratio(s.ops_per_sec, row.ceiling),
            ratio(s.ops_per_sec, row.peer),
            handoff(row, " / ")
        );
    }
    if !notes.is_empty() {
        md.push('\n');
        for note in notes {
            let _ = writeln!(md, "- {note}");
        }
    }
    std::fs::write(dir.join("results.md"), md)?;
    charts::write(&dir, rows)?;
    println!("wrote {}", dir.join("results.{json,md}").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redguard::Redguard;
    use redis::aio::ConnectionManager;

    use crate::{cost, lock, raw};

    async fn server() -> (redguard_tests::RedisServer, Redguard, ConnectionManager) {
        let server = redguard_tests::RedisServer::start();
        let rg = Redguard::redis(server.url())
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect");
        let client = redis::Client::open(server.url()).expect("client");
        let conn = ConnectionManager::new(client).await.expect("connection");
        (server, rg, conn)
    }

    /// Every raw EVALSHA row of the bench makes Redis run the same commands per operation as
    /// its runtime-API row (`INFO commandstats` around 200 operations of each).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn raw_baselines_do_the_runtime_apis_work() {
        let (_server, rg, mut conn) = server().await;
        let pairs = cost::pairs(&rg, &conn);
        cost::self_check(&mut conn, &pairs)
            .await
            .unwrap_or_else(|wrong| panic!("{wrong}"));
    }

    /// The lock's raw baseline as it was before issue 46 (ARGV[3], the level, given the
    /// depth 5; its replies unread): every acquire answered `{2,0,0}` after one `HGETALL`,
    /// every release -1. The self-check refuses it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_self_check_refuses_a_baseline_that_does_nothing() {
        let (_server, rg, mut conn) = server().await;
        let shas = std::sync::Arc::new(lock::shas());
        let conn2 = conn.clone();
        let old = cost::op(move |i| {
            let key = lock::key(i);
            let fence = format!("{key}:fence");
            let owner = format!("{i:032x}");
            let commands = vec![
                raw::command(
                    &shas.0,
                    &[&key, &fence],
                    &[&owner, "30000", "5", "604800000", "0"],
                ),
                raw::command(&shas.1, &[&key], &[&owner, "0"]),
            ];
            raw::send(conn2.clone(), commands)
        });
        let mut pairs = cost::pairs(&rg, &conn);
        pairs.truncate(1);
        pairs[0].2 = old;
        let wrong = cost::self_check(&mut conn, &pairs)
            .await
            .expect_err("the old lock baseline does no work");
        assert!(wrong.contains("hset"), "{wrong}");
    }
}
