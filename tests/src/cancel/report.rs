//! What each attempt found, and the table printed at the end.

use std::collections::BTreeMap;
use std::time::Duration;

use super::DropPoint;

/// What one attempt found: whether the operation completed before its drop point, and every
/// check that failed.
#[derive(Debug)]
#[must_use = "a verdict is only counted when the case returns it"]
pub struct Verdict {
    completed: bool,
    violations: Vec<String>,
    /// Where the drop landed, in the case's terms (counted per operation in the report).
    landed: Option<&'static str>,
}

impl Verdict {
    /// A verdict for an operation that completed (`true`) or was dropped.
    pub fn new(completed: bool) -> Verdict {
        Verdict {
            completed,
            violations: Vec::new(),
            landed: None,
        }
    }

    /// Names where the drop landed (`"in the body"`), for the report's counts.
    pub fn landed(&mut self, at: &'static str) {
        self.landed = Some(at);
    }

    /// Whether the operation completed before its drop point.
    pub fn completed(&self) -> bool {
        self.completed
    }

    /// Records a violation, described by `what`, unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.violations.push(what());
        }
    }
}

/// One operation's attempts.
#[derive(Debug)]
struct Row {
    op: String,
    /// Attempts dropped after a poll.
    poll_drops: usize,
    /// The poll in which it completed.
    completed_at: Option<usize>,
    /// Attempts under a stall (dropped, or completed before the drop time).
    stalls: usize,
    violations: Vec<(DropPoint, String)>,
    /// Attempts per place a drop landed, as the cases name them.
    landed: BTreeMap<&'static str, usize>,
    took: Duration,
}

#[derive(Debug)]
pub(super) struct Report {
    store: &'static str,
    rows: Vec<Row>,
}

impl Report {
    pub(super) fn new(store: &'static str) -> Report {
        Report {
            store,
            rows: Vec::new(),
        }
    }

    fn row(&mut self, op: &str) -> &mut Row {
        if let Some(i) = self.rows.iter().position(|row| row.op == op) {
            return &mut self.rows[i];
        }
        self.rows.push(Row {
            op: op.to_owned(),
            poll_drops: 0,
            completed_at: None,
            stalls: 0,
            violations: Vec::new(),
            landed: BTreeMap::new(),
            took: Duration::ZERO,
        });
        self.rows.last_mut().expect("just pushed")
    }

    pub(super) fn record(&mut self, op: &str, point: DropPoint, verdict: &Verdict) {
        let row = self.row(op);
        match point {
            DropPoint::Poll(n) | DropPoint::PollAndYield(n) if verdict.completed => {
                row.completed_at = Some(row.completed_at.map_or(n, |m| m.max(n)));
            }
            DropPoint::Poll(_) | DropPoint::PollAndYield(_) => row.poll_drops += 1,
            DropPoint::Stalled(_) => row.stalls += 1,
        }
        if let Some(at) = verdict.landed {
            *row.landed.entry(at).or_default() += 1;
        }
        for violation in &verdict.violations {
            row.violations.push((point, violation.clone()));
        }
    }

    pub(super) fn violation(&mut self, op: &str, point: DropPoint, what: String) {
        self.row(op).violations.push((point, what));
    }

    pub(super) fn took(&mut self, op: &str, took: Duration) {
        self.row(op).took += took;
    }

    /// Prints the table; returns the violations, each naming its operation and drop point.
    pub(super) fn finish(self) -> Vec<String> {
        println!("cancellation points on {}:", self.store);
        println!(
            "  {:<40} {:>12} {:>9} {:>7} {:>10} {:>8}",
            "operation", "poll drops", "done at", "stalls", "violations", "time"
        );
        for row in &self.rows {
            let done = row
                .completed_at
                .map_or_else(|| "never".to_owned(), |n| format!("poll {n}"));
            println!(
                "  {:<40} {:>12} {:>9} {:>7} {:>10} {:>7.1}s",
                row.op,
                row.poll_drops,
                done,
                row.stalls,
                row.violations.len(),
                row.took.as_secs_f64()
            );
            if !row.landed.is_empty() {
                let landed: Vec<String> = row
                    .landed
                    .iter()
                    .map(|(at, n)| format!("{at}: {n}"))
                    .collect();
                println!("      {}", landed.join(", "));
            }
        }
        let drops: usize = self.rows.iter().map(|r| r.poll_drops + r.stalls).sum();
        let polls: usize = self.rows.iter().map(|r| r.poll_drops).sum();
        let store = self.store;
        let violations: Vec<String> = self
            .rows
            .iter()
            .flat_map(|row| {
                row.violations
                    .iter()
                    .map(move |(point, what)| format!("{store}: {} {point}: {what}", row.op))
            })
            .collect();
        println!(
            "{}: {} operations x {drops} drop points exercised ({polls} after a poll, {} under a \
             stall), violations: {}",
            self.store,
            self.rows.len(),
            drops - polls,
            violations.len()
        );
        violations
    }
}
