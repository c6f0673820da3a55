//! Text output: one line per fact, labels aligned, durations and times a person reads.

use std::fmt::Write as _;

use redguard::admin::{
    DenyEntry, Inspection, LimitSource, LockState, QuotaEntry, QuotaList, RecordState, Resolve,
    ScanReport, TopList, Unlock, Usage,
};
use serde::Serialize;

use crate::metrics::Sample;

/// What `forget` prints.
#[derive(Debug, Serialize)]
pub(crate) struct Forgot {
    pub(crate) key: String,
    pub(crate) record: Option<RecordState>,
}

/// What `reset` and `refund` print.
#[derive(Debug, Serialize)]
pub(crate) struct Repaired {
    pub(crate) key: String,
    pub(crate) count: u64,
}

/// What `stats` prints.
#[derive(Debug, Serialize)]
pub(crate) struct Stats {
    pub(crate) store: ScanReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) metrics: Option<Vec<Sample>>,
}

/// `1.5s`, `350ms`, `2m03s`, `1h05m`, `3d04h`.
pub(crate) fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `2026-12-01T10:50:01.123Z` for ms since the Unix epoch.
pub(crate) fn utc(ms: u64) -> String {
    let days = (ms / 86_400_000) as i64;
    let in_day = ms % 86_400_000;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000
    )
}

struct Lines(String);

impl Lines {
    fn new(head: String) -> Lines {
        Lines(head + "\n")
    }

    fn add(&mut self, label: &str, value: impl std::fmt::Display) {
        let _ = writeln!(self.0, "  {label:<14}{value}");
    }

    fn opt(&mut self, label: &str, value: Option<impl std::fmt::Display>) {
        if let Some(value) = value {
            self.add(label, value);
        }
    }
}

fn lock_lines(out: &mut Lines, lock: &LockState) {
    out.add("kind", lock.kind.as_str());
    let held = match (&lock.owner, lock.held) {
        (Some(owner), _) if owner.is_empty() => {
            "kept by nobody until its hold_at_least ends".to_owned()
        }
        (Some(owner), _) => match lock.depth {
            Some(depth) => format!("yes, by {owner} (depth {depth})"),
            None => format!("yes, by {owner}"),
        },
        (None, true) => format!("yes, {} holder(s)", lock.holders.len()),
        (None, false) => "no".to_owned(),
    };
    out.add("held", held);
    out.opt("fence", lock.fence);
    if let (Some(at), Some(ago)) = (lock.acquired_at_ms, lock.held_for_ms) {
        out.add("since", format!("{} ({} ago)", utc(at), duration(ago)));
    }
    out.opt("lease left", lock.lease_left_ms.map(duration));
    for holder in &lock.holders {
        out.add(
            "holder",
            format!(
                "{} (lease left {})",
                holder.owner,
                duration(holder.lease_left_ms)
            ),
        );
    }
    out.opt("waiters", lock.waiters);
    out.opt("writer waiting", lock.writer_waiting.as_deref());
    out.opt("fence counter", lock.fence_counter);
}

pub(crate) fn inspection(seen: &Inspection) -> String {
    let mut out = Lines::new(format!("{} {}", seen.guard, seen.key));
    if let Some(record) = &seen.record {
        let status = match record.status.as_str() {
            "processing" => "processing (running, or crashed: it expires when no longer renewed)",
            "unknown" => "unknown (ended with an unknown outcome: `redguard resolve` once checked)",
            other => other,
        };
        out.add("status", status);
        out.add("owner", &record.owner);
        out.opt("fingerprint", record.fingerprint.as_deref());
        out.opt("age", record.age_ms.map(duration));
        out.opt(
            "finished",
            record
                .finished_ago_ms
                .map(|ms| format!("{} ago", duration(ms))),
        );
        out.opt("ttl", record.ttl_ms.map(duration));
        out.opt("result", record.result_bytes.map(|b| format!("{b} bytes")));
    }
    for (i, lock) in seen.locks.iter().enumerate() {
        if i > 0 {
            out.0.push('\n');
        }
        lock_lines(&mut out, lock);
    }
    if seen.guard == "lock" && seen.locks.is_empty() {
        out.add("held", "no (free)");
        out.opt("fence counter", seen.fence_counter);
    }
    if let Some(rate) = &seen.rate {
        out.add("algorithm", &rate.algorithm);
        out.opt("used", rate.used.map(|u| format!("{u} unit(s)")));
        out.opt(
            "previous",
            rate.previous
                .map(|u| format!("{u} unit(s) in the previous window")),
        );
        out.opt("entries", rate.entries);
        out.opt("interval", rate.interval_ns.map(|ns| format!("{ns}ns")));
        out.opt("empty in", rate.empty_in_ms.map(duration));
        out.opt("penalty left", rate.penalty_left_ms.map(duration));
    }
    if let Some(decision) = &seen.decision {
        out.add(
            "a call now",
            if decision.allowed {
                "allowed"
            } else {
                "rejected"
            },
        );
        out.add(
            "remaining",
            format!("{} of {}", decision.remaining, decision.limit),
        );
        out.add("reset after", duration(decision.reset_after_ms));
        if !decision.allowed {
            out.add("retry after", duration(decision.retry_after_ms));
        }
    }
    if seen.is_empty() && seen.guard != "lock" {
        out.add("state", "nothing stored");
    }
    for problem in &seen.problems {
        out.add("PROBLEM", problem);
    }
    out.0
}

pub(crate) fn scan(report: &ScanReport) -> String {
    let truncated = if report.truncated {
        " (limit reached: there may be more)"
    } else {
        ""
    };
    let mut out = format!(
        "{} key(s) matching {}{truncated}\n",
        report.keys, report.pattern
    );
    let _ = writeln!(
        out,
        "  {:<6}{:<16}{:>7}  {:<12}ttl min..max",
        "guard", "role", "count", "oldest"
    );
    for g in &report.groups {
        let ttl = match (g.ttl_min_ms, g.ttl_max_ms) {
            (Some(min), Some(max)) => format!("{}..{}", duration(min), duration(max)),
            _ => "-".to_owned(),
        };
        let oldest = g.oldest_ms.map_or("-".to_owned(), duration);
        let _ = writeln!(
            out,
            "  {:<6}{:<16}{:>7}  {:<12}{}",
            g.guard, g.role, g.count, oldest, ttl
        );
        if let Some(key) = &g.oldest_key {
            let _ = writeln!(out, "        oldest: {key}");
        }
    }
    for problem in &report.problems {
        let _ = writeln!(out, "  PROBLEM {problem}");
    }
    out
}

pub(crate) fn unlock(done: &Unlock) -> String {
    if done.removed == 0 {
        return format!("{}: nothing held, nothing changed\n", done.key);
    }
    let mut out = Lines::new(format!("unlocked {}", done.key));
    for lock in &done.before {
        let holder = match &lock.owner {
            Some(owner) => owner.clone(),
            None => format!("{} holder(s)", lock.holders.len()),
        };
        out.add("was", format!("{} held by {holder}", lock.kind.as_str()));
        out.opt("old fence", lock.fence);
    }
    out.add("removed", format!("{} holder(s)", done.removed));
    out.opt("fence now", done.fence);
    out.add(
        "next",
        "the next holder's fence is larger: writes with the old one are stale",
    );
    out.0
}

pub(crate) fn forget(done: &Forgot) -> String {
    match &done.record {
        None => format!("{}: no record, nothing changed\n", done.key),
        Some(record) => format!(
            "forgot {} ({} by {}); a retry runs again\n",
            done.key, record.status, record.owner
        ),
    }
}

pub(crate) fn resolve(done: &Resolve) -> String {
    let next = match done.now {
        "success" => "retries replay the value",
        _ => "the next retry runs the body",
    };
    format!(
        "resolved {}: {} -> {}; {next}\n",
        done.key, done.was, done.now
    )
}

pub(crate) fn stats(stats: &Stats) -> String {
    let mut out = scan(&stats.store);
    if let Some(samples) = &stats.metrics {
        let _ = writeln!(
            out,
            "\nservice metrics ({} redguard samples)",
            samples.len()
        );
        for s in samples {
            if s.labels.is_empty() {
                let _ = writeln!(out, "  {} {}", s.name, s.value);
            } else {
                let _ = writeln!(out, "  {}{{{}}} {}", s.name, s.labels, s.value);
            }
        }
    }
    out
}

/// One quota override, on one line.
pub(crate) fn quota(q: &QuotaEntry) -> String {
    let what = match (&q.rate, q.burst, &q.problem) {
        (Some(rate), Some(burst), _) => format!("{rate} burst {burst}"),
        (_, _, Some(problem)) => format!("IGNORED: {problem}"),
        _ => "IGNORED".to_owned(),
    };
    let until = match q.expires_in_ms {
        Some(ms) => format!("expires in {}", duration(ms)),
        None => "permanent".to_owned(),
    };
    format!("{} {what} ({until})\n", q.key)
}

/// Where one rate-limit key stands.
pub(crate) fn usage(u: &Usage) -> String {
    let mut out = Lines::new(format!("rate {}", u.key));
    let rule = match &u.source {
        LimitSource::Key => "the key's override".to_owned(),
        LimitSource::Prefix { prefix } => format!("the prefix override {prefix}"),
        _ => "the code's limit, --rate".to_owned(),
    };
    out.add(
        "limit",
        format!("{} burst {} (set by {rule})", u.rate, u.burst),
    );
    out.add("used", u.used.unwrap_or(0));
    out.add("remaining", u.next.remaining);
    out.add(
        "next call",
        match (&u.denied, u.next.allowed) {
            (Some(entry), _) => format!("DENIED by {}", deny(entry).trim_end()),
            (None, true) => "admitted".to_owned(),
            (None, false) => format!("refused, retry after {}", duration(u.next.retry_after_ms)),
        },
    );
    out.add("resets in", duration(u.next.reset_after_ms));
    for q in &u.ignored {
        out.add("ignored override", quota(q).trim_end());
    }
    out.0
}

/// One deny entry, on one line.
pub(crate) fn deny(e: &DenyEntry) -> String {
    let until = match e.expires_in_ms {
        Some(ms) => format!("expires in {}", duration(ms)),
        None => "permanent".to_owned(),
    };
    match &e.reason {
        Some(reason) => format!("{} ({until}): {reason}\n", e.entry),
        None => format!("{} ({until})\n", e.entry),
    }
}

/// The keys a scope refused or admitted most.
pub(crate) fn top(list: &TopList) -> String {
    let mut out = format!(
        "{} most in {} over the last {} min\n",
        list.outcome, list.scope, list.window_minutes
    );
    if list.entries.is_empty() {
        out.push_str("no calls counted\n");
    }
    let width = list.entries.iter().map(|e| e.key.len()).max().unwrap_or(0);
    for entry in &list.entries {
        let _ = writeln!(out, "{:<width$}  {}", entry.key, entry.calls);
    }
    out
}

/// The overrides of a scope.
pub(crate) fn quota_list(list: &QuotaList) -> String {
    let mut out: String = list.overrides.iter().map(quota).collect();
    if list.overrides.is_empty() {
        out.push_str("no overrides\n");
    }
    if list.truncated {
        out.push_str("(stopped at --limit keys: more may exist)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(1_796_121_001_123), "2026-12-01T10:30:01.123Z");
        assert_eq!(duration(350), "350ms");
        assert_eq!(duration(12_400), "12.4s");
        assert_eq!(duration(123_000), "2m03s");
        assert_eq!(duration(3_900_000), "1h05m");
    }
}
