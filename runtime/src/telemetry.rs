//! Every metric redguard emits, described once for the recorder, and the table the guide lists.
//!
//! Labels are bounded: `scope` is a fn path or a configured name, never a key; `limit` is a
//! limit's position in a stacked call, not its key.

use metrics::Unit;

/// A metric's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A monotonic counter (`_total`).
    Counter,
    /// A histogram.
    Histogram,
}

/// One metric redguard emits.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Its name.
    pub name: &'static str,
    /// Counter or histogram.
    pub kind: MetricKind,
    /// Its unit.
    pub unit: Unit,
    /// The labels it carries.
    pub labels: &'static [&'static str],
    /// What it counts.
    pub help: &'static str,
}

const fn counter(
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
    counter(
        "redguard_idempotency_total",
        &["scope", "outcome"],
        "Idempotent calls by what the record said: started (first execution), retried (after a \
         business failure), replayed, in_progress, key_reuse, unreplayable (a result that would \
         not read back), fail_open, fail_closed.",
    ),
    counter(
        "redguard_idempotency_lost_total",
        &["scope"],
        "Executions whose record was no longer theirs when they finished or renewed it (expired \
         or taken over): their outcome is unknown to the record.",
    ),
    counter(
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
    counter(
        "redguard_lock_renewals_total",
        &["scope", "outcome"],
        "Lease renewals by the watchdog: renewed, lost (another owner or none), error (the \
         store did not answer; retried while the lease lasts).",
    ),
    counter(
        "redguard_lock_lost_total",
        &["scope"],
        "Locks lost while held: a renewal found another owner or none, or the lease ran out \
         before one succeeded.",
    ),
    counter(
        "redguard_lock_release_not_owner_total",
        &["scope"],
        "Releases of a lock that was no longer the releaser's (nothing was changed).",
    ),
    counter(
        "redguard_lock_subscription_refused_total",
        &[],
        "Release-notification subscriptions the server refused (an ACL without the channel \
         grant): waiters poll instead.",
    ),
    counter(
        "redguard_rate_decisions_total",
        &["scope", "limit", "outcome", "mode"],
        "Rate decisions per limit (limit: its position in a stacked call, 0 the first): \
         allowed, rejected, rejected_local (by the in-process tier), not_charged (admitted \
         by this limit, refused by another), shadow_rejected (a shadow limit would have \
         refused: admitted anyway); mode=\"local\" when the local fallback decided \
         (FailMode::Local), absent when the store did.",
    ),
    counter(
        "redguard_rate_near_limit_total",
        &["scope", "limit"],
        "Admitted rate decisions that left fewer units than the limit's near-limit threshold \
         (`Limiter::near_limit`): the key is close to refusing.",
    ),
    counter(
        "redguard_rate_adjusted_units_total",
        &["op"],
        "Rate-limit units charged (`op=\"charge\"`) or given back (`op=\"refund\"`) after \
         the call, through `rate::Charge` or `#[rate_limit(charge = after)]`.",
    ),
    counter(
        "redguard_rate_settle_errors_total",
        &[],
        "`#[rate_limit(charge = after)]` calls whose reported cost could not be settled (the \
         store failed): the units charged so far stand, the call's value was returned.",
    ),
    counter(
        "redguard_rate_quota_invalid_total",
        &[],
        "Rate decisions that found a value at the key's quota override (`<key>:quota`) that \
         is not one (written by hand, or by another version): ignored, the limit in the code \
         decided.",
    ),
    counter(
        "redguard_backend_errors_total",
        &["guard", "op", "outcome"],
        "Store calls that failed or timed out, by guard, operation and the FailMode applied \
         (fail_open, fail_closed, fail_local; unrecorded: an idempotent outcome that could not be stored).",
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
        }
    }
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
