//! Every metric redguard emits, described once for the recorder, and the table the guide lists.
//!
//! Labels are bounded: `scope` is a fn path or a configured name, never a key; `limit` is a
//! limit's position in a stacked call, not its key. The one exception is opt-in:
//! `redguard_rate_top_calls` names keys, at most [`Builder::top_metrics`] of them per scope
//! and outcome at a time.
//!
//! [`Builder::top_metrics`]: crate::handle::Builder::top_metrics

use metrics::Unit;

/// A metric's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A monotonic counter (`_total`).
    Counter,
    /// A histogram.
    Histogram,
    /// A gauge: a value set, not added to.
    Gauge,
}

/// One metric redguard emits.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Its name.
    pub name: &'static str,
    /// Counter, histogram or gauge.
    pub kind: MetricKind,
    /// Its unit.
    pub unit: Unit,
    /// The labels it carries.
    pub labels: &'static [&'static str],
    /// What it counts.
    pub help: &'static str,
}

const fn counter_metric(
    name: &'static str,
    labels: &'static [&'static str],
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind: MetricKind::Counter,
        unit: Unit::Count,
        labels,
        help,
    }
}

/// Every metric redguard emits (`tests/tests/it/metrics.rs` checks the code emits no other,
/// and the guide's operations page lists each).
pub const METRICS: &[Metric] = &[
    counter_metric(
        "redguard_idempotency_total",
        &["scope", "outcome"],
        "Idempotent calls by what the record said: started (first execution), retried (after a \
         business failure), replayed, in_progress, key_reuse, unreplayable (a result that would \
         not read back), fail_open, fail_closed.",
    ),
    counter_metric(
        "redguard_idempotency_lost_total",
        &["scope"],
        "Executions whose record was no longer theirs when they finished or renewed it (expired \
         or taken over): their outcome is unknown to the record.",
    ),
    counter_metric(
        "redguard_lock_acquire_total",
        &["scope", "outcome"],
        "Lock acquisitions by outcome: acquired, timeout (waited `wait` in vain), held \
         (skip_if_held), too_deep (reentrancy limit), lost (a nested entry whose outer lock \
         was gone).",
    ),
    Metric {
        name: "redguard_lock_wait_seconds",
        kind: MetricKind::Histogram,
        unit: Unit::Seconds,
        labels: &["scope"],
        help: "Time from asking for a lock to the acquisition's outcome.",
    },
    Metric {
        name: "redguard_lock_held_seconds",
        kind: MetricKind::Histogram,
        unit: Unit::Seconds,
        labels: &["scope"],
        help: "Time a lock guard was held, from acquisition to its release (or drop).",
    },
    counter_metric(
        "redguard_lock_renewals_total",
        &["scope", "outcome"],
        "Lease renewals by the watchdog: renewed, lost (another owner or none), error (the \
         store did not answer; retried while the lease lasts).",
    ),
    counter_metric(
        "redguard_lock_lost_total",
        &["scope"],
        "Locks lost while held: a renewal found another owner or none, or the lease ran out \
         before one succeeded.",
    ),
    counter_metric(
        "redguard_lock_release_not_owner_total",
        &["scope"],
        "Releases of a lock that was no longer the releaser's (nothing was changed).",
    ),
    counter_metric(
        "redguard_lock_subscription_refused_total",
        &[],
        "Release-notification subscriptions the server refused (an ACL without the channel \
         grant): waiters poll instead.",
    ),
    counter_metric(
        "redguard_rate_decisions_total",
        &["scope", "limit", "outcome", "mode"],
        "Rate decisions per limit (limit: its position in a stacked call, 0 the first): \
         allowed, rejected, rejected_local (by the in-process tier), not_charged (admitted \
         by this limit, refused by another), shadow_rejected (a shadow limit would have \
         refused: admitted anyway); mode=\"local\" when the local fallback decided \
         (FailMode::Local), absent when the store did.",
    ),
    counter_metric(
        "redguard_rate_near_limit_total",
        &["scope", "limit"],
        "Admitted rate decisions that left fewer units than the limit's near-limit threshold \
         (`Limiter::near_limit`): the key is close to refusing.",
    ),
    counter_metric(
        "redguard_rate_adjusted_units_total",
        &["op"],
        "Rate-limit units charged (`op=\"charge\"`) or given back (`op=\"refund\"`) after \
         the call, through `rate::Charge` or `#[rate_limit(charge = after)]`.",
    ),
    counter_metric(
        "redguard_rate_settle_errors_total",
        &[],
        "`#[rate_limit(charge = after)]` calls whose reported cost could not be settled (the \
         store failed): the units charged so far stand, the call's value was returned.",
    ),
    counter_metric(
        "redguard_rate_denied_total",
        &["scope"],
        "Rate-limited calls refused because their key is on the scope's deny list \
         (`redguard deny add`): nothing was charged.",
    ),
    Metric {
        name: "redguard_rate_top_calls",
        kind: MetricKind::Gauge,
        unit: Unit::Count,
        labels: &["scope", "outcome", "key"],
        help: "Calls in the last second of this instance's most admitted and most refused keys \
               per scope (outcome admitted or refused), set once a second: opt-in \
               (`Builder::top_metrics`), at most that many keys per scope and outcome; a key \
               that left the top is set to 0 once, then left to the exporter's idle timeout.",
    },
    counter_metric(
        "redguard_rate_quota_invalid_total",
        &[],
        "Rate decisions that found a value at the key's quota override (`<key>:quota`) that \
         is not one (written by hand, or by another version): ignored, the limit in the code \
         decided.",
    ),
    counter_metric(
        "redguard_backend_errors_total",
        &["guard", "op", "outcome"],
        "Store calls that failed or timed out, by guard, operation and the FailMode applied \
         (fail_open, fail_closed, fail_local; unrecorded: an idempotent outcome that could not be stored).",
    ),
    counter_metric(
        "redguard_store_breaker_total",
        &["event"],
        "The Redis store's circuit breaker: opened (consecutive calls could not reach Redis), \
         closed (a call reached it again), refused (a call failed at once while open).",
    ),
];

/// Describes every metric to the installed `metrics` recorder (type, unit, help text), so an
/// exporter such as Prometheus shows them with `# HELP` and the right unit. Call it after
/// installing the recorder; [`Builder::connect`](crate::handle::Builder::connect) calls it too.
///
/// ```
/// for metric in redguard::telemetry::METRICS {
///     assert!(metric.name.starts_with("redguard_"));
/// }
/// redguard::telemetry::describe_metrics(); // no recorder installed: nothing happens
/// ```
pub fn describe_metrics() {
    for metric in METRICS {
        match metric.kind {
            MetricKind::Counter => {
                metrics::describe_counter!(metric.name, metric.unit, metric.help);
            }
            MetricKind::Histogram => {
                metrics::describe_histogram!(metric.name, metric.unit, metric.help);
            }
            MetricKind::Gauge => {
                metrics::describe_gauge!(metric.name, metric.unit, metric.help);
            }
        }
    }
}

/// Registers counter `name` with `labels` on the current recorder, as `metrics::counter!`
/// does. The metric's [`Key`](metrics::Key) is built once per thread while its labels
/// repeat: building one per call is a `Vec` of labels and a hash of every label's text,
/// 8% of an in-process rate check. Only the key is kept, never the handle, so a recorder
/// installed later (or a local one in a test) registers every call as before.
pub(crate) fn counter<const N: usize>(
    name: &'static str,
    labels: [(&'static str, Value<'_>); N],
) -> metrics::Counter {
    with_key(name, &labels, |recorder, key| {
        recorder.register_counter(key, &METADATA)
    })
}

/// [`counter`] for a histogram.
pub(crate) fn histogram<const N: usize>(
    name: &'static str,
    labels: [(&'static str, Value<'_>); N],
) -> metrics::Histogram {
    with_key(name, &labels, |recorder, key| {
        recorder.register_histogram(key, &METADATA)
    })
}

/// A label's value for [`counter`]: text kept by reference in the metric's key when it lives
/// as long as the program, and then compared by its pointer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Value<'a> {
    Static(&'static str),
    Shared(&'a metrics::SharedString),
    Text(&'a str),
}

impl Value<'_> {
    fn as_str(&self) -> &str {
        match self {
            Value::Static(text) | Value::Text(text) => text,
            Value::Shared(text) => text,
        }
    }

    fn to_shared(self) -> metrics::SharedString {
        match self {
            Value::Static(text) => metrics::SharedString::const_str(text),
            Value::Shared(text) => text.clone(),
            Value::Text(text) => metrics::SharedString::from(text.to_owned()),
        }
    }
}

impl<'a> From<&'a metrics::SharedString> for Value<'a> {
    fn from(text: &'a metrics::SharedString) -> Self {
        Value::Shared(text)
    }
}

/// What `metrics::counter!` passes for a call in this crate.
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// Metric keys a thread registered last, the latest first: a hot path's few label sets.
const KEPT: usize = 16;

thread_local! {
    static KEYS: std::cell::RefCell<Vec<metrics::Key>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn with_key<T>(
    name: &'static str,
    labels: &[(&'static str, Value<'_>)],
    register: impl FnOnce(&dyn metrics::Recorder, &metrics::Key) -> T,
) -> T {
    let build = || {
        let labels: Vec<metrics::Label> = labels
            .iter()
            .map(|(key, value)| metrics::Label::new(*key, value.to_shared()))
            .collect();
        metrics::Key::from_parts(name, labels)
    };
    KEYS.with(|keys| {
        // A recorder that records a metric of ours while registering one finds the cache
        // borrowed: it gets a key of its own.
        let Ok(mut keys) = keys.try_borrow_mut() else {
            return metrics::with_recorder(|recorder| register(recorder, &build()));
        };
        let found = keys.iter().position(|key| is(key, name, labels));
        let at = match found {
            Some(at) => at,
            None => {
                keys.truncate(KEPT - 1);
                keys.push(build());
                keys.len() - 1
            }
        };
        // The latest to the front, where the next call of a hot path looks first.
        keys[..=at].rotate_right(1);
        metrics::with_recorder(|recorder| register(recorder, &keys[0]))
    })
}

/// Whether `key` is `name` with `labels`, in order.
fn is(key: &metrics::Key, name: &str, labels: &[(&'static str, Value<'_>)]) -> bool {
    same(key.name(), name)
        && key.labels().len() == labels.len()
        && key
            .labels()
            .zip(labels)
            .all(|(label, (k, v))| same(label.key(), k) && same(label.value(), v.as_str()))
}

/// String equality, deciding on the pointer when it can: these strings are mostly the same
/// `&'static str` each call (a name, a [`Value::Static`], a scope from `#[rate_limit]`).
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && (std::ptr::eq(a.as_ptr(), b.as_ptr()) || a == b)
}

/// The `limit` label of the n-th limit of a call: static, so labelling costs no allocation.
/// `scope` as a label value cheap to clone per call: a `&'static str` as it is, a `String`
/// behind an `Arc` (a `String` per metric would be an allocation per call).
pub(crate) fn shared(scope: std::borrow::Cow<'static, str>) -> metrics::SharedString {
    match scope {
        std::borrow::Cow::Borrowed(scope) => metrics::SharedString::const_str(scope),
        std::borrow::Cow::Owned(scope) => {
            metrics::SharedString::from_shared(std::sync::Arc::from(scope))
        }
    }
}

pub(crate) fn limit_label(index: usize) -> &'static str {
    const LABELS: [&str; 8] = ["0", "1", "2", "3", "4", "5", "6", "7"];
    LABELS.get(index).copied().unwrap_or("8+")
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    use super::*;

    /// Every key registered, as `name{k=v,..}`.
    #[derive(Default)]
    struct Registered(Mutex<Vec<String>>);

    impl Registered {
        fn push(&self, key: &Key) {
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let text = format!("{}{{{}}}", key.name(), labels.join(","));
            self.0.lock().unwrap().push(text);
        }

        fn take(&self) -> Vec<String> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    impl Recorder for Registered {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            self.push(key);
            Counter::noop()
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            self.push(key);
            Gauge::noop()
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            self.push(key);
            Histogram::noop()
        }
    }

    #[test]
    fn kept_keys_register_the_labels_given_on_every_recorder() {
        let shared = SharedString::const_str("orders");
        let owned = SharedString::from("orders".to_owned());
        let calls = |text: &str| {
            counter(
                "c",
                [("scope", (&shared).into()), ("outcome", Value::Static("a"))],
            )
            .increment(1);
            counter(
                "c",
                [("scope", (&owned).into()), ("outcome", Value::Static("a"))],
            )
            .increment(1);
            counter(
                "c",
                [
                    ("scope", Value::Text(text)),
                    ("outcome", Value::Static("b")),
                ],
            )
            .increment(1);
            histogram("h", [("scope", Value::Text(text))]).record(1.0);
            // More label sets than a thread keeps: the first ones are built again.
            for i in 0..2 * KEPT {
                counter("c", [("scope", Value::Text(&i.to_string()))]).increment(1);
            }
            counter(
                "c",
                [("scope", (&shared).into()), ("outcome", Value::Static("a"))],
            )
            .increment(1);
        };
        let mut expected = vec![
            "c{scope=orders,outcome=a}".to_owned(),
            "c{scope=orders,outcome=a}".to_owned(),
            "c{scope=payments,outcome=b}".to_owned(),
            "h{scope=payments}".to_owned(),
        ];
        expected.extend((0..2 * KEPT).map(|i| format!("c{{scope={i}}}")));
        expected.push("c{scope=orders,outcome=a}".to_owned());
        for _ in 0..2 {
            // A recorder after another, at the same address or not, sees every call.
            let recorder = Registered::default();
            metrics::with_local_recorder(&recorder, || calls(&String::from("payments")));
            assert_eq!(recorder.take(), expected);
        }
        let other = Registered::default();
        metrics::with_local_recorder(&other, || calls(&String::from("refunds")));
        assert_eq!(other.take()[2], "c{scope=refunds,outcome=b}");
        assert!(KEYS.with(|keys| keys.borrow().len()) <= KEPT);
    }
}
