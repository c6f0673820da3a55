//! Deciding resolved limits: the local tier, the store (with the rate-limit fail mode), and
//! the outcome's metrics; a call that may wait is paced by `pace.rs`.

use std::time::Duration;

use tracing::Instrument;

use super::{fallback, local, top};
use crate::degrade::Degrade;
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, Key};
use crate::store::{RateCheck, RateMode};
use crate::telemetry::Value;
use crate::values::{Decision, Limit};

/// Checks `limits`; when rejected and some limit may wait, waits in arrival order until they
/// admit or a wait runs out ([`super::pace`]).
pub(super) async fn enforce_resolved(
    handle: &Redguard,
    limits: &[Resolved<'_>],
    waits: &[Duration],
) -> Result<Vec<Decision>> {
    if waits.iter().any(|wait| !wait.is_zero()) {
        return super::pace::paced(handle, limits, waits).await;
    }
    let decisions = decide(handle, limits, RateMode::Consume).await?;
    match most_restrictive(&decisions) {
        Some(rejected) => Err(Error::RateLimited(rejected)),
        None => Ok(decisions),
    }
}

/// The rejecting decision that asks to wait longest, if any limit rejected.
pub(super) fn most_restrictive(decisions: &[Decision]) -> Option<Decision> {
    decisions
        .iter()
        .filter(|d| !d.allowed)
        .max_by_key(|d| d.retry_after)
        .copied()
}

/// One limit ready for the store.
#[derive(Debug)]
pub(super) struct Resolved<'a> {
    pub(super) key: Key,
    pub(super) limit: Limit,
    pub(super) scope: &'a metrics::SharedString,
    pub(super) local: bool,
    /// Shadow mode: decided as if enforced, admitted anyway (`Limiter::shadow`).
    pub(super) shadow: bool,
    /// The near-limit signal's threshold in units (0: off; `Limiter::near_limit`).
    pub(super) near_limit: u64,
}

/// Asks the store (or the local tier), applying the fail mode, and records the outcome.
pub(super) async fn decide(
    handle: &Redguard,
    limits: &[Resolved<'_>],
    mode: RateMode,
) -> Result<Vec<Decision>> {
    let scope = limits.first().map_or("", |r| r.scope.as_ref());
    let span = crate::trace::rate_limit(scope, limits.len(), handle.store().kind().as_str());
    let result = decide_traced(handle, limits, mode)
        .instrument(span.clone())
        .await;
    match &result {
        Ok(decisions) => {
            let rejected = most_restrictive(decisions);
            span.record(
                "decision",
                if rejected.is_some() {
                    "rejected"
                } else {
                    "allowed"
                },
            );
            if let Some(remaining) = decisions.iter().map(|d| d.remaining).min() {
                span.record("remaining", remaining);
            }
            if let Some(rejected) = rejected {
                span.record(
                    "retry_after_ms",
                    rejected.retry_after.as_secs_f64() * 1000.0,
                );
            }
        }
        Err(err) => {
            span.record("decision", crate::trace::error_name(err));
            if let Error::Denied { key, reason } = err
                && let Some(r) = limits.iter().find(|r| r.key.as_str() == key)
            {
                handle.state().denials.insert(key, reason.clone());
                crate::telemetry::counter(
                    "redguard_rate_denied_total",
                    [("scope", r.scope.into())],
                )
                .increment(1);
            }
        }
    }
    result
}

async fn decide_traced<'a>(
    handle: &Redguard,
    limits: &'a [Resolved<'_>],
    mode: RateMode,
) -> Result<Vec<Decision>> {
    let Some(first) = limits.first() else {
        return Ok(Vec::new());
    };
    // The same key twice in one call would be decided twice on the same state and charged
    // once: refuse it rather than under-count.
    for (i, r) in limits.iter().enumerate() {
        if limits[..i].iter().any(|other| other.key == r.key) {
            return Err(Error::InvalidLimit(format!(
                "two limits of one call use the key `{}`; give them different keys or scopes",
                r.key
            )));
        }
    }
    if mode == RateMode::Consume
        && let Some(decisions) = local_rejection(handle, limits)
    {
        return Ok(decisions);
    }
    let check = |r: &'a Resolved<'_>| RateCheck {
        key: &r.key,
        limit: &r.limit,
    };
    // Most calls decide one limit: no `Vec` for it.
    let (one, many): ([RateCheck<'_>; 1], Vec<RateCheck<'_>>);
    let checks: &[RateCheck<'_>] = match limits {
        [r] => {
            one = [check(r)];
            &one
        }
        _ => {
            many = limits.iter().map(check).collect();
            &many
        }
    };
    let op = match mode {
        RateMode::Consume | RateMode::Reserve(_) => "rate_check",
        RateMode::Peek => "rate_peek",
    };
    let outcome = handle.store().rate_check(checks, mode).await;
    let Some(mut outcome) = outcome.or_degrade(handle, GuardKind::RateLimit, op, &first.key)?
    else {
        // An outage does not lift a deny entry this instance saw: failing open (or to the
        // local share) is for limits, not for callers an operator shut out.
        if mode != RateMode::Peek
            && let Some((key, reason)) = limits.iter().find_map(|r| {
                let reason = handle.state().denials.get(&r.key)?;
                Some((r.key.as_str(), reason))
            })
        {
            return Err(Error::Denied {
                key: key.to_owned(),
                reason,
            });
        }
        if let Some(decisions) = fallback::outage(handle, limits, mode) {
            return Ok(decisions);
        }
        return Ok(limits
            .iter()
            .map(|r| Decision::degraded(r.limit.burst, r.limit.window()))
            .collect());
    };
    for r in limits {
        handle.state().denials.forget(&r.key);
    }
    if let Some(refused) = fallback::gate(handle, limits, mode, &outcome) {
        return Ok(refused);
    }
    // Refused by shadow limits only: the call goes ahead, so the enforced limits, which the
    // all-or-nothing call left uncharged, are charged now (a second call, only then).
    let refused_by_shadow =
        |d: &[Decision]| limits.iter().zip(d).all(|(r, d)| d.allowed || r.shadow);
    if mode.charges()
        && !outcome.allowed()
        && refused_by_shadow(&outcome.decisions)
        && limits.iter().any(|r| !r.shadow)
    {
        let enforced: Vec<RateCheck<'_>> = limits
            .iter()
            .zip(checks)
            .filter(|(r, _)| !r.shadow)
            .map(|(_, c)| *c)
            .collect();
        let charged = handle.store().rate_check(&enforced, mode).await;
        if let Some(charged) = charged.or_degrade(handle, GuardKind::RateLimit, op, &first.key)? {
            let mut charged = charged.decisions.into_iter();
            for (r, d) in limits.iter().zip(outcome.decisions.iter_mut()) {
                if !r.shadow {
                    *d = charged.next().unwrap_or(*d);
                }
            }
        }
    }
    if mode.charges() {
        let allowed = refused_by_shadow(&outcome.decisions);
        for (i, (r, decision)) in limits.iter().zip(&outcome.decisions).enumerate() {
            let (key, scope) = (&r.key, r.scope);
            // A shadow limit's refusals are not enforced, so the local tier never repeats them.
            if r.local && !r.shadow {
                if decision.allowed {
                    local::forget(handle, key);
                } else {
                    local::remember(handle, key, r.limit.cost, *decision);
                }
            }
            let result = match (allowed, decision.allowed) {
                (_, false) if r.shadow => "shadow_rejected",
                (true, true) => "allowed",
                (_, false) => "rejected",
                // Admitted by this limit, turned away by another: not charged.
                (false, true) => "not_charged",
            };
            crate::telemetry::counter(
                "redguard_rate_decisions_total",
                [
                    ("scope", scope.into()),
                    ("limit", Value::Static(crate::telemetry::limit_label(i))),
                    ("outcome", Value::Static(result)),
                ],
            )
            .increment(1);
            let tallied = match result {
                "allowed" => Some(top::Outcome::Admitted),
                "rejected" => Some(top::Outcome::Refused),
                _ => None,
            };
            if let Some(outcome) = tallied {
                top::record(handle, scope, key, outcome);
            }
            if allowed && decision.allowed && decision.remaining < r.near_limit {
                crate::telemetry::counter(
                    "redguard_rate_near_limit_total",
                    [
                        ("scope", scope.into()),
                        ("limit", Value::Static(crate::telemetry::limit_label(i))),
                    ],
                )
                .increment(1);
                tracing::Span::current().record("near_limit", true);
            }
            if !decision.allowed {
                tracing::debug!(
                    guard = "rate",
                    %key,
                    outcome = result,
                    retry_after_ms = decision.retry_after.as_millis() as u64,
                    "rate limited"
                );
            }
        }
    }
    // Admitted anyway: what a shadow limit would have refused is in the metric and the span.
    let shadowed = limits
        .iter()
        .zip(&outcome.decisions)
        .filter(|(r, d)| r.shadow && !d.allowed)
        .count();
    if shadowed > 0 {
        tracing::Span::current().record("shadow_rejected", shadowed as u64);
    }
    Ok(outcome
        .decisions
        .into_iter()
        .zip(limits)
        .map(|(mut d, r)| {
            if r.shadow && !d.allowed {
                d.allowed = true;
                d.retry_after = Duration::ZERO;
            }
            d
        })
        .collect())
}

/// Decisions when the local tier already knows a limit is exhausted: the known rejection for
/// those limits, and for the others an "admitted, not charged" decision (they were not asked).
fn local_rejection(handle: &Redguard, limits: &[Resolved<'_>]) -> Option<Vec<Decision>> {
    // Most calls have no local tier: nothing to collect.
    if !limits.iter().any(|r| r.local) {
        return None;
    }
    let known: Vec<Option<Decision>> = limits
        .iter()
        .map(|r| {
            r.local
                .then(|| local::rejected(handle, &r.key, r.limit.cost))
                .flatten()
        })
        .collect();
    if known.iter().all(Option::is_none) {
        return None;
    }
    Some(
        limits
            .iter()
            .zip(known)
            .enumerate()
            .map(|(i, (r, known))| {
                let outcome = if known.is_some() {
                    top::record(handle, r.scope, &r.key, top::Outcome::Refused);
                    "rejected_local"
                } else {
                    "not_charged"
                };
                crate::telemetry::counter(
                    "redguard_rate_decisions_total",
                    [
                        ("scope", r.scope.into()),
                        ("limit", Value::Static(crate::telemetry::limit_label(i))),
                        ("outcome", Value::Static(outcome)),
                    ],
                )
                .increment(1);
                known.unwrap_or_else(|| Decision::degraded(r.limit.burst, r.limit.window()))
            })
            .collect(),
    )
}
