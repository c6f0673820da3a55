//! The `tracing` spans of guard calls: one per call with the fields a trace view needs, and
//! each Redis call as a child span with OpenTelemetry's database fields. Captured with a
//! subscriber layer on one thread (a current-thread runtime under a scoped default), in a test
//! binary of its own: tracing caches each callsite's interest process-wide, and a guard test
//! running on another thread of a shared binary could register a callsite while this
//! subscriber registered, so a span was missed (seen once in a parallel run of `it`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redguard::{Redguard, key::KeyBuilder};
use redguard_tests::RedisServer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Debug, Clone, Default)]
struct SpanData {
    name: String,
    parent: Option<String>,
    fields: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default)]
struct Spans(Arc<Mutex<Vec<(u64, SpanData)>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut data = SpanData {
            name: attrs.metadata().name().to_owned(),
            parent: ctx
                .span(id)
                .and_then(|span| span.parent())
                .map(|parent| parent.name().to_owned()),
            ..SpanData::default()
        };
        attrs.record(&mut Fields(&mut data.fields));
        self.0.lock().unwrap().push((id.into_u64(), data));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        if let Some((_, data)) = spans.iter_mut().rev().find(|(i, _)| *i == id.into_u64()) {
            values.record(&mut Fields(&mut data.fields));
        }
    }
}

impl Spans {
    fn named(&self, name: &str) -> Vec<SpanData> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, d)| d.name == name)
            .map(|(_, d)| d.clone())
            .collect()
    }
}

#[test]
fn guard_calls_and_store_calls_are_spans() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let server = RedisServer::start();
    let url = server.url();
    tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(workload(url))
    });

    let locks = spans.named("redguard.lock");
    let acquired = &locks[0].fields;
    assert_eq!(acquired["scope"], "spans::lock");
    assert_eq!(acquired["kind"], "exclusive");
    assert_eq!(acquired["store"], "redis");
    assert_eq!(acquired["outcome"], "acquired");
    assert!(
        acquired["fence"].parse::<u64>().unwrap() > 0,
        "{acquired:?}"
    );
    assert!(acquired["wait_ms"].parse::<f64>().is_ok(), "{acquired:?}");
    assert_eq!(locks[1].fields["outcome"], "timeout", "{:?}", locks[1]);

    let idem = spans.named("redguard.idempotent");
    assert_eq!(idem[0].fields["scope"], "spans::idem");
    assert_eq!(idem[0].fields["outcome"], "started");
    assert_eq!(idem[0].fields["recorded"], "success");
    assert_eq!(idem[1].fields["outcome"], "replayed");

    let rates = spans.named("redguard.rate_limit");
    assert_eq!(rates[0].fields["decision"], "allowed");
    assert_eq!(rates[0].fields["remaining"], "0");
    assert_eq!(rates[1].fields["decision"], "rejected");
    assert!(rates[1].fields["retry_after_ms"].parse::<f64>().unwrap() > 0.0);

    // Store calls: children of their guard's span, with OpenTelemetry's database fields.
    let store = spans.named("redguard.store");
    for (guard, op) in [
        ("redguard.lock", "lock_acquire"),
        ("redguard.idempotent", "idem_begin"),
        ("redguard.idempotent", "idem_finish"),
        ("redguard.rate_limit", "rate_check"),
    ] {
        let call = store
            .iter()
            .find(|s| s.fields.get("db.operation").map(String::as_str) == Some(op))
            .unwrap_or_else(|| panic!("no store span for {op}: {store:?}"));
        assert_eq!(call.fields["db.system"], "redis");
        assert_eq!(call.parent.as_deref(), Some(guard), "{op}");
    }
    // No request values in guard spans: the key's rendered values are not fields.
    for span in locks.iter().chain(&idem).chain(&rates) {
        assert!(
            span.fields
                .values()
                .all(|v| !v.contains("SK-1") && !v.contains("req-1")),
            "{span:?}"
        );
    }
}

async fn workload(url: String) {
    let rg = Redguard::redis(&url).connect().await.unwrap();
    let held = rg
        .lock("stock:SK-1")
        .scope("spans::lock")
        .acquire()
        .await
        .unwrap();
    let busy = rg
        .lock("stock:SK-1")
        .scope("spans::lock")
        .wait(Duration::from_millis(20));
    assert!(busy.acquire().await.is_err());
    held.release().await.unwrap();
    for _ in 0..2 {
        let body = KeyBuilder::new().text("req-1").finish().unwrap();
        rg.scope(
            redguard::idempotency(body)
                .scope("spans::idem")
                .run(async { Ok::<_, redguard::Error>(7u8) }),
        )
        .await
        .unwrap();
    }
    let limiter = || {
        redguard::limiter(redguard::key("ip:{ip}").part("ip", "10.0.0.1"))
            .scope("spans::rate")
            .rate("1/min")
            .on(&rg)
    };
    assert!(limiter().decide().await.unwrap().allowed);
    assert!(!limiter().decide().await.unwrap().allowed);
}
