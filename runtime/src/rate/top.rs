//! Who is being limited: the keys each scope admits and refuses most, for `redguard top`.
//!
//! A decision adds its key to an in-process sketch of its handle, per scope and outcome
//! (Misra–Gries: at most [`SKETCH`] keys, each count low by at most calls ÷ [`SKETCH`], so a
//! key with more than that share of a second's calls is always there). Once a second a task
//! of the handle merges the sketches into the store: a sorted set per scope, outcome and
//! minute (`<prefix>:rate:{<scope>}:top:<admitted|refused>:<minute>`, kept [`KEEP`], its
//! [`MAX_MEMBERS`] highest counts only), one call per scope and outcome that had calls. A
//! check itself sends nothing more and waits for nothing: the tally costs a map update in
//! process, and a store call per second per instance.
//!
//! The minute is the instance's clock: a skew between instances moves calls to a neighbouring
//! minute, which a window of several minutes reads anyway.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::SharedString;

use crate::handle::{Redguard, WeakRedguard};
use crate::key::Key;

/// Keys one sketch counts at most (per scope and outcome, per handle, per second).
pub(crate) const SKETCH: usize = 64;

/// Members a stored tally keeps: its highest counts.
pub const MAX_MEMBERS: usize = 256;

/// How long a minute's tally is kept: the longest window `top` reads.
pub const KEEP: Duration = Duration::from_secs(15 * 60);

/// How often the sketches go to the store.
const FLUSH: Duration = Duration::from_secs(1);

/// A flusher with nothing to send for this long stops (the next decision starts another).
const IDLE: Duration = Duration::from_secs(30);

/// What a decision did, as the tally names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Outcome {
    Admitted,
    Refused,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Admitted => "admitted",
            Outcome::Refused => "refused",
        }
    }
}

/// A handle's sketches, and whether its flusher runs.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    inner: Mutex<Sketches>,
}

#[derive(Debug, Default)]
struct Sketches {
    /// Per scope and outcome: the prefix of their state keys' handle, and the counts.
    counts: HashMap<(SharedString, Outcome), Sketch>,
    flushing: bool,
}

#[derive(Debug, Default)]
struct Sketch {
    prefix: String,
    counts: HashMap<Box<str>, u64>,
}

impl Sketch {
    /// Misra–Gries: a key counted is counted on; a new key takes a free counter, or, when
    /// none is free, every counter drops by one (the new key's call among them).
    fn add(&mut self, key: &str) {
        if let Some(count) = self.counts.get_mut(key) {
            *count += 1;
        } else if self.counts.len() < SKETCH {
            self.counts.insert(key.into(), 1);
        } else {
            self.counts.retain(|_, count| {
                *count -= 1;
                *count > 0
            });
        }
    }
}

/// Counts one decision of `key` (a rate-limit state key) in `scope`.
pub(crate) fn record(handle: &Redguard, scope: &SharedString, key: &Key, outcome: Outcome) {
    if !handle.top_tally() {
        return;
    }
    let Some(body) = body(key, scope) else {
        return;
    };
    let start = {
        let mut sketches = handle
            .state()
            .tally
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let sketch = sketches
            .counts
            .entry((scope.clone(), outcome))
            .or_insert_with(|| Sketch {
                prefix: prefix(key).to_owned(),
                counts: HashMap::new(),
            });
        sketch.add(body);
        !std::mem::replace(&mut sketches.flushing, true)
    };
    if start {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(flush(handle.downgrade()));
            }
            // No runtime to run the flusher on: counted again by the next call that has one.
            Err(_) => handle.state().tally.stopped(),
        }
    }
}

impl Tally {
    fn stopped(&self) {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .flushing = false;
    }

    fn take(&self) -> HashMap<(SharedString, Outcome), Sketch> {
        std::mem::take(
            &mut self
                .inner
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .counts,
        )
    }
}

/// The flusher: every [`FLUSH`], the sketches to the store, until the handle is gone or has
/// had nothing to send for [`IDLE`].
async fn flush(handle: WeakRedguard) {
    let mut idle = Duration::ZERO;
    let mut exported = Exported::default();
    loop {
        tokio::time::sleep(FLUSH).await;
        let Some(handle) = handle.upgrade() else {
            exported.clear();
            return;
        };
        let sketches = handle.state().tally.take();
        exported.set(&sketches, handle.top_metrics());
        if sketches.is_empty() {
            idle += FLUSH;
            if idle >= IDLE {
                handle.state().tally.stopped();
                // A decision that came in between found the flag set and started nothing.
                if handle.state().tally.take_pending() {
                    continue;
                }
                return;
            }
            continue;
        }
        idle = Duration::ZERO;
        let minute = minute(SystemTime::now());
        for ((scope, outcome), sketch) in sketches {
            let counts: Vec<(String, u64)> = sketch
                .counts
                .into_iter()
                .map(|(key, count)| (key.into_string(), count))
                .collect();
            let tally = tally_key(&sketch.prefix, &scope, outcome, minute);
            // Analytics beside the decisions: a store that cannot take it now loses this
            // second's counts, and says so at debug.
            if let Err(err) = handle
                .store()
                .rate_top_merge(&tally, &counts, KEEP, MAX_MEMBERS)
                .await
            {
                tracing::debug!(%tally, error = %err, "redguard: a rate-limit tally was not stored");
            }
        }
    }
}

/// The keys a flusher exported as gauges last second ([`Builder::top_metrics`]), per scope
/// and outcome: the ones that leave the top are set to 0 once, so a sum over instances does
/// not count a stale second, and then left to the exporter's idle timeout.
///
/// [`Builder::top_metrics`]: crate::handle::Builder::top_metrics
#[derive(Debug, Default)]
struct Exported {
    keys: HashMap<(SharedString, Outcome), Vec<Box<str>>>,
}

impl Exported {
    /// Sets the gauges of this second's `keys` highest counts of each sketch.
    fn set(&mut self, sketches: &HashMap<(SharedString, Outcome), Sketch>, keys: usize) {
        if keys == 0 {
            return;
        }
        let mut now: HashMap<(SharedString, Outcome), Vec<Box<str>>> = HashMap::new();
        for ((scope, outcome), sketch) in sketches {
            let mut top: Vec<(&Box<str>, &u64)> = sketch.counts.iter().collect();
            top.sort_unstable_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
            top.truncate(keys);
            let set = now.entry((scope.clone(), *outcome)).or_default();
            for (key, count) in top {
                gauge(scope, *outcome, key).set(*count as f64);
                set.push(key.clone());
            }
        }
        for ((scope, outcome), before) in &self.keys {
            let kept = now.get(&(scope.clone(), *outcome));
            for key in before {
                if !kept.is_some_and(|kept| kept.contains(key)) {
                    gauge(scope, *outcome, key).set(0.0);
                }
            }
        }
        self.keys = now;
    }

    /// The flusher stops: every gauge it set to 0.
    fn clear(&mut self) {
        for ((scope, outcome), keys) in std::mem::take(&mut self.keys) {
            for key in &keys {
                gauge(&scope, outcome, key).set(0.0);
            }
        }
    }
}

fn gauge(scope: &SharedString, outcome: Outcome, key: &str) -> metrics::Gauge {
    metrics::gauge!(
        "redguard_rate_top_calls",
        "scope" => scope.clone(),
        "outcome" => outcome.as_str(),
        "key" => key.to_owned()
    )
}

impl Tally {
    /// After the flusher stopped: whether a decision counted since, which then needs it.
    fn take_pending(&self) -> bool {
        let mut sketches = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if sketches.counts.is_empty() {
            false
        } else {
            sketches.flushing = true;
            true
        }
    }
}

/// Minutes since the Unix epoch at `at`.
pub(crate) fn minute(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() / 60
}

/// The tally of `scope`'s `outcome` in `minute`, under the handle prefix `prefix`.
pub(crate) fn tally_key(prefix: &str, scope: &str, outcome: Outcome, minute: u64) -> Key {
    Key::stored(format!(
        "{prefix}:rate:{{{scope}}}:top:{}:{minute}",
        outcome.as_str()
    ))
}

/// The handle prefix of a rate-limit state key (`<prefix>:rate:{<scope>:<body>}`).
fn prefix(key: &Key) -> &str {
    let text = key.as_str();
    text.find(":rate:{").map_or(text, |at| &text[..at])
}

/// The rendered template of a rate-limit state key in `scope`: what `usage`, `quota` and
/// `top` name a key by.
fn body<'k>(key: &'k Key, scope: &str) -> Option<&'k str> {
    let text = key.as_str();
    let inside = &text[text.find(":rate:{")? + ":rate:{".len()..];
    inside
        .strip_prefix(scope)?
        .strip_prefix(':')?
        .strip_suffix('}')
        // A scope's path goes on with `::` (`api::v1` after `api`): another scope's key.
        .filter(|body| !body.starts_with(':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_with_more_than_its_share_survives_any_number_of_others() {
        let mut sketch = Sketch::default();
        // 10,000 distinct keys, and one key taking 5% of the calls, interleaved.
        for i in 0..10_000u32 {
            sketch.add(&format!("k{i}"));
            if i % 19 == 0 {
                sketch.add("hammer");
            }
        }
        assert!(sketch.counts.len() <= SKETCH);
        let hammer = sketch.counts.get("hammer").copied().unwrap_or(0);
        // At most calls / (SKETCH + 1) low: 527 calls, ≤ 10,527 / 65 = 162 lost.
        assert!(hammer >= 527 - 162, "{hammer}");
        assert!(sketch.counts.values().all(|&c| c <= hammer), "{sketch:?}");
    }

    #[test]
    fn bodies_and_prefixes_of_state_keys() {
        let key = Key::stored("redguard:rate:{api::v1:tenant:acme}");
        assert_eq!(body(&key, "api::v1"), Some("tenant:acme"));
        assert_eq!(body(&key, "api"), None);
        assert_eq!(prefix(&key), "redguard");
        assert_eq!(
            tally_key("redguard", "api::v1", Outcome::Refused, 7).as_str(),
            "redguard:rate:{api::v1}:top:refused:7"
        );
    }
}
