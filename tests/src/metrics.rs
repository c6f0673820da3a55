//! A `metrics` recorder that counts what the guards report, for tests that assert on
//! counters. Installed process-wide on first use (one per test binary).
//!
//! ```no_run
//! let before = redguard_tests::metrics::counter("redguard_lock_lost_total", &[]);
//! // ... provoke a lost lock ...
//! assert!(redguard_tests::metrics::counter("redguard_lock_lost_total", &[]) > before);
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};

/// A counter's name and its labels, sorted.
type CounterKey = (String, Vec<(String, String)>);

/// Every counter registered so far.
#[derive(Debug, Default)]
struct Counting {
    counters: Mutex<BTreeMap<CounterKey, Arc<AtomicU64>>>,
}

#[derive(Debug)]
struct Count(Arc<AtomicU64>);

impl CounterFn for Count {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::SeqCst);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::SeqCst);
    }
}

impl Recorder for Counting {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|label| (label.key().to_owned(), label.value().to_owned()))
            .collect();
        labels.sort();
        let mut counters = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        let count = counters
            .entry((key.name().to_owned(), labels))
            .or_default()
            .clone();
        Counter::from_arc(Arc::new(Count(count)))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn recorder() -> &'static Counting {
    static RECORDER: OnceLock<&'static Counting> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder: &'static Counting = Box::leak(Box::default());
        metrics::set_global_recorder(recorder)
            .expect("install the counting recorder (another recorder is installed)");
        recorder
    })
}

/// Installs the recorder (if not yet) so counters from now on are counted.
pub fn install() {
    recorder();
}

/// The sum of counter `name` over every label set that contains all of `labels`.
pub fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    let counters = recorder()
        .counters
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    counters
        .iter()
        .filter(|((counted, have), _)| {
            counted == name
                && labels
                    .iter()
                    .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
        })
        .map(|(_, count)| count.load(Ordering::SeqCst))
        .sum()
}
