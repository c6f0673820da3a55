//! Every metric the runtime emits is described (type, unit, help) and listed in the guide's
//! table (`runtime/docs/operations.md`), and nothing is emitted that is not: the emitting
//! code is read for metric names, and a workload runs under a recorder that captures what is
//! registered and described.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use redguard::admin::Admin;
use redguard::{
    Redguard, key::GuardKind, key::KeyBuilder, telemetry::METRICS, telemetry::MetricKind,
};
use redguard_tests::RedisServer;

#[derive(Debug, Default)]
struct Capture {
    described: Mutex<BTreeMap<String, (&'static str, Option<Unit>)>>,
    emitted: Mutex<BTreeMap<String, (&'static str, BTreeSet<String>)>>,
}

impl Capture {
    fn emit(&self, kind: &'static str, key: &Key) {
        let mut emitted = self.emitted.lock().unwrap();
        let entry = emitted
            .entry(key.name().to_owned())
            .or_insert((kind, BTreeSet::new()));
        entry.1.extend(key.labels().map(|l| l.key().to_owned()));
    }

    fn describe(&self, kind: &'static str, name: KeyName, unit: Option<Unit>) {
        let mut described = self.described.lock().unwrap();
        described.insert(name.as_str().to_owned(), (kind, unit));
    }
}

impl Recorder for Capture {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe("counter", name, unit);
    }
    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe("gauge", name, unit);
    }
    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe("histogram", name, unit);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.emit("counter", key);
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.emit("gauge", key);
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.emit("histogram", key);
        Histogram::noop()
    }
}

fn kind_name(kind: MetricKind) -> &'static str {
    match kind {
        MetricKind::Counter => "counter",
        MetricKind::Histogram => "histogram",
        MetricKind::Gauge => "gauge",
    }
}

/// Metric names in `metrics::counter!("..")`-style calls of the runtime's source (and
/// `telemetry::counter(".."`, its cached form), with their kind.
fn emitted_in_source() -> BTreeMap<String, &'static str> {
    fn walk(dir: &Path, out: &mut BTreeMap<String, &'static str>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (macro_name, kind) in [
                    ("counter!(", "counter"),
                    ("histogram!(", "histogram"),
                    ("gauge!(", "gauge"),
                    // Its cached registration, for hot paths.
                    ("telemetry::counter(", "counter"),
                    ("telemetry::histogram(", "histogram"),
                ] {
                    for (at, _) in text.match_indices(macro_name) {
                        let call = &text[at + macro_name.len()..];
                        let call = call.trim_start();
                        if let Some(rest) = call.strip_prefix('"') {
                            let name = &rest[..rest.find('"').unwrap()];
                            out.insert(name.to_owned(), kind);
                        }
                    }
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime/src"),
        &mut out,
    );
    out
}

#[test]
fn every_metric_in_the_code_is_in_the_table() {
    let emitted = emitted_in_source();
    assert!(emitted.len() >= 10, "{emitted:?}");
    let table: BTreeMap<&str, &str> = METRICS
        .iter()
        .map(|m| (m.name, kind_name(m.kind)))
        .collect();
    for (name, kind) in &emitted {
        assert_eq!(
            table.get(name.as_str()),
            Some(kind),
            "{name} emitted as a {kind}"
        );
    }
    for name in table.keys() {
        assert!(
            emitted.contains_key(*name),
            "{name} is in METRICS but never emitted"
        );
    }
}

#[test]
fn every_metric_is_listed_in_the_guide() {
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../runtime/docs/operations.md"
    ))
    .unwrap();
    for metric in METRICS {
        let row = guide
            .lines()
            .find(|line| line.starts_with(&format!("| `{}` |", metric.name)))
            .unwrap_or_else(|| panic!("runtime/docs/operations.md has no row for {}", metric.name));
        assert!(row.contains(kind_name(metric.kind)), "{row}");
        for label in metric.labels {
            assert!(row.contains(&format!("`{label}`")), "{row} lacks {label}");
        }
    }
}

#[test]
fn every_metric_emitted_is_described() {
    let capture = Arc::new(Capture::default());
    let server = RedisServer::start();
    let url = server.url();
    metrics::with_local_recorder(capture.as_ref(), || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(workload(url, server))
    });
    let described = capture.described.lock().unwrap().clone();
    for metric in METRICS {
        let (kind, unit) = described
            .get(metric.name)
            .unwrap_or_else(|| panic!("{} not described", metric.name));
        assert_eq!(*kind, kind_name(metric.kind));
        assert_eq!(*unit, Some(metric.unit), "{}", metric.name);
    }
    let emitted = capture.emitted.lock().unwrap().clone();
    for (name, (kind, labels)) in &emitted {
        let metric = METRICS
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} emitted but not described"));
        assert_eq!(*kind, kind_name(metric.kind), "{name}");
        for label in labels {
            assert!(
                metric.labels.contains(&label.as_str()),
                "{name}: label {label}"
            );
        }
    }
    // The workload reaches every metric but the ACL one (tests/global/acl.rs).
    let missing: Vec<&str> = METRICS
        .iter()
        .map(|m| m.name)
        .filter(|name| !emitted.contains_key(*name))
        .collect();
    assert_eq!(missing, ["redguard_lock_subscription_refused_total"]);
}

async fn workload(url: String, mut server: RedisServer) {
    let rg = Redguard::redis(&url)
        .top_metrics(10)
        .connect()
        .await
        .unwrap();
    let admin = Admin::new(rg.clone());
    // Locks: acquired, timeout, renewed, lost, held time, a release that is not the owner's.
    let held = rg
        .lock("w:1")
        .scope("w::lock")
        .lease(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    let timeout = rg
        .lock("w:1")
        .scope("w::lock")
        .wait(Duration::from_millis(20));
    assert!(timeout.acquire().await.is_err());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let key = admin.key(GuardKind::Lock, "w::lock", "w:1").unwrap();
    admin.unlock(&key, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(held.release().await.is_err());
    // Idempotency: started, replayed, and an execution whose record was forgotten.
    for _ in 0..2 {
        let body = KeyBuilder::new().text("w:2").finish().unwrap();
        rg.scope(
            redguard::idempotency(body)
                .scope("w::idem")
                .run(async { Ok::<_, redguard::Error>(1u8) }),
        )
        .await
        .unwrap();
    }
    let body = KeyBuilder::new().text("w:3").finish().unwrap();
    let key = admin.key(GuardKind::Idempotency, "w::idem", "w:3").unwrap();
    let forget = admin.clone();
    rg.scope(
        redguard::idempotency(body)
            .scope("w::idem")
            .run(async move {
                forget.forget(&key).await?;
                Ok::<_, redguard::Error>(1u8)
            }),
    )
    .await
    .unwrap();
    // Rate decisions, then the store gone: a backend error, failing open.
    let limiter = || {
        redguard::limiter("w:4")
            .scope("w::rate")
            .rate("1/s")
            .near_limit(1)
            .on(&rg)
    };
    let _ = limiter().decide().await.unwrap();
    let _ = limiter().decide().await.unwrap();
    // A quota override written by hand that is not one: ignored, counted.
    let _: () = redis::cmd("SET")
        .arg("redguard:rate:{w::rate:w:4}:quota")
        .arg("unlimited")
        .arg("EX")
        .arg(60)
        .query(&mut server.connection())
        .unwrap();
    let _ = limiter().decide().await.unwrap();
    // A denied key: refused, counted.
    let denied = redguard::admin::QuotaTtl::For(std::time::Duration::from_secs(60));
    admin
        .deny_add("w::rate", "w:4", None, denied)
        .await
        .unwrap();
    assert!(limiter().decide().await.is_err());
    admin.deny_remove("w::rate", "w:4").await.unwrap();
    // Units charged and given back after the call.
    let mut charge = redguard::limiter("w:5")
        .scope("w::rate")
        .rate("100/s")
        .on(&rg)
        .reserve()
        .await
        .unwrap();
    charge.charge(2).await.unwrap();
    charge.refund(1).await.unwrap();
    // A cost reported after the store went away: the settlement fails, the value stands.
    assert_eq!(rg.scope(settled_after(&mut server)).await.unwrap(), 5);
    let _ = limiter().decide().await.unwrap();
    // Calls that cannot reach it open the store's breaker; the next fail at once.
    for _ in 0..4 {
        let _ = limiter().decide().await.unwrap();
    }
    // The tally's gauges, set by its flusher once a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
}

/// Kills the store while it runs, so the cost it reports cannot be settled.
#[redguard::rate_limit(key = "w:6", rate = "100/s", charge = after)]
async fn settled_after(server: &mut RedisServer) -> redguard::Result<u64> {
    server.kill();
    Ok(5)
}

#[test]
fn dashboard_queries_exactly_the_exported_metrics() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/order-service/grafana/redguard.json"
    );
    let dashboard = std::fs::read_to_string(path).unwrap();
    let mut queried = BTreeSet::new();
    for line in dashboard
        .lines()
        .filter(|l| l.trim_start().starts_with("\"expr\""))
    {
        for (at, _) in line.match_indices("redguard_") {
            let name: String = line[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix).filter(|base| {
                        METRICS
                            .iter()
                            .any(|m| m.name == *base && m.kind == MetricKind::Histogram)
                    })
                })
                .unwrap_or(&name)
                .to_owned();
            queried.insert(base);
        }
    }
    let exported: BTreeSet<String> = METRICS.iter().map(|m| m.name.to_owned()).collect();
    assert_eq!(
        queried, exported,
        "panels query exactly what redguard exports"
    );
}
