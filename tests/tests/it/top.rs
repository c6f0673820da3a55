//! Who is being limited (issue 47): every instance tallies the keys its rate limits admit and
//! refuse, and `Admin::top` names the key hammering a scope among 100,000 others — on every
//! store, with two handles (two instances) sharing the tally, in bounded memory.

use std::time::Duration;

use futures_util::StreamExt as _;
use redguard::Redguard;
use redguard::admin::Admin;

const SCOPE: &str = "api::top";

redguard_tests::conformance!(top_names_the_hammering_key_among_many_others);

/// The calls a test makes: `others` distinct keys once each, and every 20th call the same
/// key, on two handles of one store (on memory, one handle: a memory store is one instance).
async fn top_names_the_hammering_key_among_many_others(rg: Redguard) {
    // The Done-when's 100,000 on every store (a Cluster and Sentinel take about a minute of a
    // loaded 2-core machine).
    let others: u32 = 100_000;
    let limiter = |key: String| redguard::limiter(key).scope(SCOPE).rate("1/h").on(&rg);
    let calls = futures_util::stream::iter(0..others)
        .map(|i| {
            let (other, hammer) = (limiter(format!("user:{i}")), limiter("user:hammer".into()));
            async move {
                other.decide().await.unwrap();
                if i % 20 == 0 {
                    hammer.decide().await.unwrap();
                }
            }
        })
        .buffer_unordered(64);
    calls.collect::<Vec<()>>().await;
    let hammered = u64::from(others / 20);
    // Every instance sends its counts once a second.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let admin = Admin::new(rg.clone());
    let window = Duration::from_secs(5 * 60);
    let refused = admin.top(SCOPE, true, 5, window).await.unwrap();
    let first = &refused.entries[0];
    assert_eq!(first.key, "user:hammer", "{refused:?}");
    // Its first call was admitted; the sketch may undercount it by its share of each second.
    assert!(first.calls < hammered, "{refused:?}");
    assert!(first.calls >= (hammered - 1) / 2, "{refused:?}");
    // Nothing else was refused.
    assert_eq!(refused.entries.len(), 1, "{refused:?}");

    let admitted = admin.top(SCOPE, false, 256, window).await.unwrap();
    assert!(
        admitted.entries.len() <= 256 * 5,
        "{}",
        admitted.entries.len()
    );
    assert!(admitted.entries.iter().all(|e| e.calls >= 1));

    // Bad input is refused before the store is asked.
    assert!(admin.top(SCOPE, true, 0, window).await.is_err());
    assert!(
        admin
            .top(SCOPE, true, 5, Duration::from_secs(16 * 60))
            .await
            .is_err()
    );
    assert!(admin.top("bad scope{", true, 5, window).await.is_err());
}

/// One minute's tally holds at most 256 keys whatever the number of keys limited: measured
/// with `MEMORY USAGE` after 100,000 distinct keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tally_stays_bounded_under_many_distinct_keys() {
    let server = redguard_tests::RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let calls = futures_util::stream::iter(0..100_000u32)
        .map(|i| {
            let limiter =
                redguard::limiter(format!("ip:10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
                    .scope(SCOPE)
                    .rate("1/h")
                    .on(&rg);
            async move {
                limiter.decide().await.unwrap();
            }
        })
        .buffer_unordered(64);
    calls.collect::<Vec<()>>().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut conn = server.connection();
    let tallies: Vec<String> = ::redis::cmd("KEYS")
        .arg(format!("redguard:rate:{{{SCOPE}}}:top:*"))
        .query(&mut conn)
        .unwrap();
    assert!(!tallies.is_empty());
    for tally in &tallies {
        let members: u64 = ::redis::cmd("ZCARD").arg(tally).query(&mut conn).unwrap();
        let bytes: u64 = ::redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(tally)
            .query(&mut conn)
            .unwrap();
        let ttl: i64 = ::redis::cmd("PTTL").arg(tally).query(&mut conn).unwrap();
        assert!(members <= 256, "{tally}: {members}");
        assert!(bytes <= 48 * 1024, "{tally}: {bytes} bytes");
        assert!(ttl > 0 && ttl <= 15 * 60 * 1000, "{tally}: {ttl}");
        eprintln!("{tally}: {members} members, {bytes} bytes");
    }
    server.assert_every_key_has_ttl();
}

/// Every gauge value set: when, its `key` and `outcome` labels and the value, in order.
#[derive(Debug, Default)]
struct Gauges(std::sync::Mutex<Vec<(std::time::Instant, String, String, f64)>>);

struct Set {
    labels: (String, String),
    log: std::sync::Arc<Gauges>,
}

impl metrics::GaugeFn for Set {
    fn increment(&self, _: f64) {}
    fn decrement(&self, _: f64) {}
    fn set(&self, value: f64) {
        let (key, outcome) = self.labels.clone();
        let at = std::time::Instant::now();
        self.log.0.lock().unwrap().push((at, key, outcome, value));
    }
}

#[derive(Debug, Default)]
struct Capture(std::sync::Arc<Gauges>);

impl metrics::Recorder for Capture {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        assert_eq!(key.name(), "redguard_rate_top_calls");
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        metrics::Gauge::from_arc(std::sync::Arc::new(Set {
            labels: (label("key"), label("outcome")),
            log: self.0.clone(),
        }))
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// `Builder::top_metrics(3)`: once a second, the gauge of each of the 3 keys refused most
/// (the hammering one among them, among 2,000 others) and admitted most; never more than 3
/// keys per outcome set non-zero in one flush, and a key that left the top set to 0.
#[test]
fn top_metrics_export_the_hammering_key_and_no_more_than_k() {
    let capture = Capture::default();
    let log = capture.0.clone();
    metrics::with_local_recorder(&capture, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let rg = Redguard::memory_builder()
                    .top_metrics(3)
                    .connect()
                    .await
                    .unwrap();
                let limiter = |key: String| redguard::limiter(key).scope(SCOPE).rate("1/h").on(&rg);
                for i in 0..2_000 {
                    limiter(format!("user:{i}")).decide().await.unwrap();
                    if i % 10 == 0 {
                        limiter("user:hammer".into()).decide().await.unwrap();
                    }
                }
                // One flush with these counts, then one with none.
                tokio::time::sleep(Duration::from_millis(3500)).await;
            });
    });
    let log = log.0.lock().unwrap().clone();
    let hammer: Vec<f64> = log
        .iter()
        .filter(|(_, key, outcome, _)| key == "user:hammer" && outcome == "refused")
        .map(|(.., v)| *v)
        .collect();
    // 200 calls, the first admitted: the refused sketch holds no other key, so its counts
    // are exact, whichever flushes they fell in.
    assert_eq!(hammer.iter().sum::<f64>(), 199.0, "{hammer:?}");
    // Its last value: 0, once it left the top (no calls in the last second).
    assert_eq!(hammer.last(), Some(&0.0), "{hammer:?}");
    // A flush sets its gauges at once; flushes are a second apart.
    let mut flushes: Vec<Vec<&(std::time::Instant, String, String, f64)>> = Vec::new();
    for set in &log {
        match flushes.last_mut() {
            Some(flush) if set.0 - flush[0].0 < Duration::from_millis(300) => flush.push(set),
            _ => flushes.push(vec![set]),
        }
    }
    assert!(flushes.len() >= 2, "{flushes:?}");
    for flush in &flushes {
        for outcome in ["admitted", "refused"] {
            let non_zero = flush
                .iter()
                .filter(|(_, _, o, v)| o == outcome && *v > 0.0)
                .count();
            assert!(non_zero <= 3, "{outcome}: {flush:?}");
        }
    }
}
