//! Histories of a multi-process workload run under faults, and the checker that reads them
//! (`tests/tests/histories.rs`, `src/bin/history_worker.rs`).
//!
//! Every operation is one line of a worker's history file (an [`Event`]), written when the
//! operation completes, with its invoke and complete times. **Time** is wall-clock
//! microseconds ([`now_us`]): every worker and the test (which records the faults) run on
//! one machine and read the same `CLOCK_REALTIME`, so their timestamps compare; Redis's
//! `TIME`, which decides fencing tokens and rate limits, is that clock too. `Instant` would
//! be steadier but cannot be carried across processes. A step of the system clock during a
//! run would make the checker compare skewed times; none happens on a test machine.
//!
//! The checker ([`check`]) reports:
//! - **mutual exclusion**: two critical sections on one key, both of holders whose leases
//!   were valid, that overlap. A section is *valid* when it ended within the lease counted
//!   from the acquiring call's invoke (the earliest the key can expire: renewals only extend
//!   it) and no fault that may lose the writes of the key's hash slot ([`Loss`]) overlaps
//!   that invoke to its end. Any other section may overlap another (its holder was paused
//!   past its lease, or its key vanished with a kill or a failover); fencing must then keep
//!   its effects out;
//! - **fencing order**: an acquisition that completed before another was invoked must carry
//!   the smaller token (per key, across every fault, failovers included); valid sections, in
//!   the order they ran, carry increasing tokens;
//! - **fenced out while valid**: a valid section whose call to the register was refused,
//!   which means a later holder reached the register during its lease;
//! - **lost or doubled effects**: each register's final value equals the number of writes
//!   it accepted, and no value was written twice;
//! - **double executions**: an intent whose body ran twice without a fault that may lose
//!   its record between the first call's invoke and the second execution (records expire
//!   long after the run, so nothing else may free an intent); a reply other than the
//!   intent's value, or a replay of an intent that never ran;
//! - **rate bounds**: what each algorithm admitted (by Redis's time) within its documented
//!   bound ([`rate::verdict`](crate::rate::verdict)), over each stretch between faults that
//!   may lose its key's state (a Redis that lost its state starts the count afresh; what was
//!   admitted during such a fault is left out, as it may or may not be remembered after);
//! - **unexpected outcomes**: an error a guard should never return here (`Corrupt`, …);
//! - **lock progress**: while no fault is active, each lock key changes hands at least once
//!   a second of the time nobody is inside it (a lock that is never released or a waiter
//!   never woken breaks no safety property, only this).

use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redguard::{
    Redguard, key::GuardKind, key::KeyBody, key::KeyBuilder, rate::Algorithm, rate::Limit,
    rate::Rate,
};

/// Wall-clock microseconds since the Unix epoch (see the module docs for why this clock).
pub fn now_us() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    u64::try_from(since.as_micros()).expect("microseconds fit in u64")
}

/// The lock keys of the workload (scope [`SCOPE`]), each guarding the register of the same
/// name, and how they are taken.
pub const LOCK_KEYS: [(&str, LockStyle); 3] = [
    ("k0", LockStyle::Run),
    ("k1", LockStyle::Guard),
    ("f0", LockStyle::FairRun),
];

/// How a lock key of the workload is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockStyle {
    /// `LockBuilder::run` (what `#[dist_lock]` expands into): the body is cancelled when the
    /// lock is lost.
    Run,
    /// `acquire`, the section, `LockGuard::release`.
    Guard,
    /// `LockBuilder::fair().run(..)`.
    FairRun,
}

/// The scope of every guard key of the workload.
pub const SCOPE: &str = "hist";

/// The lease of the workload's locks.
pub const LEASE: Duration = Duration::from_secs(2);

/// How long a lock call waits for a held key; below [`LEASE`], so a section entered after a
/// long wait still has most of its lease.
pub const WAIT: Duration = Duration::from_secs(1);

/// The limit checked for each algorithm: well below what the workload offers, so every
/// bound is reached.
pub fn limits() -> Vec<Limit> {
    Algorithm::ALL
        .into_iter()
        .map(|algorithm| {
            let burst = (!algorithm.is_window()).then_some(5);
            Limit::new(algorithm, Rate::per_second(5), burst, 1, Duration::ZERO)
                .expect("a valid limit")
        })
        .collect()
}

/// A register guarded by a lock, in a Redis of its own (never faulted: it stands for the
/// database a holder writes to). It refuses a call whose fencing token is below the largest
/// it has seen, reads included, so a stale holder can neither write over a newer one nor
/// write back what it read before a newer holder came.
///
/// KEYS[1] the register; ARGV[1] `r` or `w`; ARGV[2] the token; ARGV[3] the value to write.
/// Returns {1, value read or written} or {0, the largest token seen}.
pub const REGISTER_SCRIPT: &str = r"
local top = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[2]) < top then
  return {0, top}
end
redis.call('HSET', KEYS[1], 'fence', ARGV[2])
if ARGV[1] == 'w' then
  redis.call('HSET', KEYS[1], 'value', ARGV[3])
end
redis.call('EXPIRE', KEYS[1], 86400)
return {1, tonumber(redis.call('HGET', KEYS[1], 'value') or '0')}
";

/// The register guarded by lock key `key`.
pub fn register_key(key: &str) -> String {
    format!("register:{key}")
}

/// One completed operation of a worker. Times are [`now_us`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A lock call, and its critical section when it got the lock. `owner` names the call
    /// (unique in the run); `entered`/`left` bound the section as the holder saw it (from
    /// the body's start to its end, completion or cancellation).
    Lock {
        key: String,
        owner: String,
        invoke: u64,
        entered: Option<u64>,
        left: Option<u64>,
        fence: u64,
        lease_ms: u64,
        outcome: Outcome,
    },
    /// A call to a register by a section.
    Register {
        key: String,
        owner: String,
        fence: u64,
        write: bool,
        invoke: u64,
        complete: u64,
        accepted: bool,
        /// The value read or written (accepted), or the largest token seen (refused).
        value: u64,
    },
    /// An idempotent body starting, in call `call` of `intent`.
    Exec {
        intent: u64,
        call: String,
        invoke: u64,
        start: u64,
    },
    /// An idempotent call.
    Idem {
        intent: u64,
        call: String,
        invoke: u64,
        complete: u64,
        outcome: IdemOutcome,
    },
    /// A rate check.
    Rate {
        algorithm: Algorithm,
        invoke: u64,
        complete: u64,
        outcome: RateOutcome,
    },
}

/// How a lock call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Acquired, section run, released.
    Ok,
    /// `Error::LockTimeout`.
    Timeout,
    /// `Error::Backend` (locks fail closed).
    Backend,
    /// `Error::LockLost`: lost during the section or found lost at release.
    Lost,
    /// Anything else: never expected.
    Unexpected(String),
}

/// How an idempotent call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdemOutcome {
    /// The body ran (in this call) and returned this value.
    Ran(u64),
    /// The stored value was returned.
    Replayed(u64),
    /// `Error::InProgress`.
    InProgress,
    /// `Error::Backend` (idempotency fails closed).
    Backend,
    /// Anything else: never expected.
    Unexpected(String),
}

/// How a rate check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateOutcome {
    /// Admitted, at this Redis time (µs).
    Admitted(u64),
    /// Refused.
    Rejected,
    /// The store did not answer (unknown: it may have counted).
    Error,
}

/// Text for an unexpected error: one word, so a line stays space-separated.
fn word(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join("_")
}

fn opt(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Lock {
                key,
                owner,
                invoke,
                entered,
                left,
                fence,
                lease_ms,
                outcome,
            } => {
                let outcome = match outcome {
                    Outcome::Ok => "ok".to_owned(),
                    Outcome::Timeout => "timeout".to_owned(),
                    Outcome::Backend => "backend".to_owned(),
                    Outcome::Lost => "lost".to_owned(),
                    Outcome::Unexpected(what) => format!("unexpected:{}", word(what)),
                };
                write!(
                    f,
                    "L {key} {owner} {invoke} {} {} {fence} {lease_ms} {outcome}",
                    opt(*entered),
                    opt(*left)
                )
            }
            Event::Register {
                key,
                owner,
                fence,
                write,
                invoke,
                complete,
                accepted,
                value,
            } => write!(
                f,
                "R {key} {owner} {fence} {} {invoke} {complete} {} {value}",
                if *write { "w" } else { "r" },
                if *accepted { "ok" } else { "refused" }
            ),
            Event::Exec {
                intent,
                call,
                invoke,
                start,
            } => write!(f, "E {intent} {call} {invoke} {start}"),
            Event::Idem {
                intent,
                call,
                invoke,
                complete,
                outcome,
            } => {
                let outcome = match outcome {
                    IdemOutcome::Ran(value) => format!("ran:{value}"),
                    IdemOutcome::Replayed(value) => format!("replayed:{value}"),
                    IdemOutcome::InProgress => "in_progress".to_owned(),
                    IdemOutcome::Backend => "backend".to_owned(),
                    IdemOutcome::Unexpected(what) => format!("unexpected:{}", word(what)),
                };
                write!(f, "I {intent} {call} {invoke} {complete} {outcome}")
            }
            Event::Rate {
                algorithm,
                invoke,
                complete,
                outcome,
            } => {
                let outcome = match outcome {
                    RateOutcome::Admitted(at) => format!("admitted:{at}"),
                    RateOutcome::Rejected => "rejected".to_owned(),
                    RateOutcome::Error => "error".to_owned(),
                };
                write!(f, "Q {algorithm} {invoke} {complete} {outcome}")
            }
        }
    }
}

impl FromStr for Event {
    type Err = String;

    fn from_str(line: &str) -> Result<Event, String> {
        let bad = || format!("unreadable history line {line:?}");
        let fields: Vec<&str> = line.split(' ').collect();
        let n = |i: usize| -> Result<u64, String> {
            fields.get(i).and_then(|f| f.parse().ok()).ok_or_else(bad)
        };
        let opt = |i: usize| -> Result<Option<u64>, String> {
            match fields.get(i) {
                Some(&"-") => Ok(None),
                _ => n(i).map(Some),
            }
        };
        let text = |i: usize| -> Result<String, String> {
            fields.get(i).map(|f| (*f).to_owned()).ok_or_else(bad)
        };
        let tagged = |i: usize, tag: &str| -> Option<String> {
            fields
                .get(i)
                .and_then(|f| f.strip_prefix(tag))
                .map(str::to_owned)
        };
        let event = match fields.first().copied() {
            Some("L") if fields.len() == 9 => Event::Lock {
                key: text(1)?,
                owner: text(2)?,
                invoke: n(3)?,
                entered: opt(4)?,
                left: opt(5)?,
                fence: n(6)?,
                lease_ms: n(7)?,
                outcome: match fields[8] {
                    "ok" => Outcome::Ok,
                    "timeout" => Outcome::Timeout,
                    "backend" => Outcome::Backend,
                    "lost" => Outcome::Lost,
                    _ => Outcome::Unexpected(tagged(8, "unexpected:").ok_or_else(bad)?),
                },
            },
            Some("R") if fields.len() == 9 => Event::Register {
                key: text(1)?,
                owner: text(2)?,
                fence: n(3)?,
                write: fields[4] == "w",
                invoke: n(5)?,
                complete: n(6)?,
                accepted: fields[7] == "ok",
                value: n(8)?,
            },
            Some("E") if fields.len() == 5 => Event::Exec {
                intent: n(1)?,
                call: text(2)?,
                invoke: n(3)?,
                start: n(4)?,
            },
            Some("I") if fields.len() == 6 => Event::Idem {
                intent: n(1)?,
                call: text(2)?,
                invoke: n(3)?,
                complete: n(4)?,
                outcome: match fields[5] {
                    "in_progress" => IdemOutcome::InProgress,
                    "backend" => IdemOutcome::Backend,
                    _ => {
                        if let Some(value) = tagged(5, "ran:") {
                            IdemOutcome::Ran(value.parse().map_err(|_| bad())?)
                        } else if let Some(value) = tagged(5, "replayed:") {
                            IdemOutcome::Replayed(value.parse().map_err(|_| bad())?)
                        } else {
                            IdemOutcome::Unexpected(tagged(5, "unexpected:").ok_or_else(bad)?)
                        }
                    }
                },
            },
            Some("Q") if fields.len() == 5 => Event::Rate {
                algorithm: fields[1].parse().map_err(|_| bad())?,
                invoke: n(2)?,
                complete: n(3)?,
                outcome: match fields[4] {
                    "rejected" => RateOutcome::Rejected,
                    "error" => RateOutcome::Error,
                    _ => RateOutcome::Admitted(
                        tagged(4, "admitted:")
                            .and_then(|at| at.parse().ok())
                            .ok_or_else(bad)?,
                    ),
                },
            },
            _ => return Err(bad()),
        };
        Ok(event)
    }
}

/// A fault the test injected, by its own clock ([`now_us`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultSpan {
    /// What was done (`sigstop`, `kill-restart`, `proxy-latency`, …).
    pub kind: String,
    /// When it began.
    pub start: u64,
    /// When it was healed.
    pub end: u64,
    /// What acknowledged writes it may have lost.
    pub loss: Loss,
}

/// The writes a fault may lose: those made from shortly before it began
/// ([`REPLICATION_LAG`]) until it was healed. A kill loses them, and so may a failover to a
/// replica that lags or a stale master serving again for a moment. Guards promise nothing
/// across such a loss (locks and records may vanish); fencing still must order the holders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loss {
    /// Nothing is lost (a stall, a network fault, a failover that waits for the replica).
    Nothing,
    /// Every key's writes (a single node killed).
    Everything,
    /// The writes to these hash slots, as inclusive ranges (what the master struck served).
    Slots(Vec<(u16, u16)>),
}

/// What a run left: the workers' events, the faults, and each register's final value.
#[derive(Debug, Default)]
pub struct History {
    /// When the workers started and were told to stop ([`now_us`]).
    pub run: (u64, u64),
    pub events: Vec<Event>,
    pub faults: Vec<FaultSpan>,
    /// Final value of each lock key's register (0 when never written).
    pub registers: BTreeMap<String, u64>,
}

/// The checker's findings: figures, and every violation (must be none).
#[derive(Debug, Default)]
pub struct Report {
    /// Operations recorded.
    pub operations: usize,
    /// Faults injected.
    pub faults: usize,
    /// One line per figure.
    pub figures: Vec<String>,
    /// What broke a promise, one line each.
    pub violations: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "operations {}, faults injected {}, violations {}",
            self.operations,
            self.faults,
            self.violations.len()
        )?;
        for line in &self.figures {
            writeln!(f, "  {line}")?;
        }
        // The first few of each kind are enough to debug; the count says the rest.
        let mut shown: BTreeMap<&str, usize> = BTreeMap::new();
        for violation in &self.violations {
            let kind = violation.split(':').next().unwrap_or("");
            let count = shown.entry(kind).or_default();
            *count += 1;
            if *count <= 5 {
                writeln!(f, "  VIOLATION {violation}")?;
            }
        }
        for (kind, count) in shown.iter().filter(|(_, count)| **count > 5) {
            writeln!(f, "  ... {} more {kind} violations", count - 5)?;
        }
        Ok(())
    }
}

/// A critical section, as the checker sees it.
#[derive(Debug, Clone)]
struct Section<'a> {
    owner: &'a str,
    invoke: u64,
    entered: u64,
    left: u64,
    fence: u64,
    valid: bool,
}

impl fmt::Display for Section<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (invoked {}, in {}..{}, fence {}{})",
            self.owner,
            self.invoke,
            self.entered,
            self.left,
            self.fence,
            if self.valid { "" } else { ", lease not sure" }
        )
    }
}

/// How long before a data-losing fault began writes may still be lost: a replica lags its
/// master by what it has not yet received (well under this, even on a loaded machine).
pub const REPLICATION_LAG: Duration = Duration::from_secs(1);

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (the text between
/// the first `{` and the next `}`, when not empty) or of the whole key, modulo 16384.
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = key
        .find('{')
        .and_then(|open| {
            let tag = &bytes[open + 1..];
            let close = tag.iter().position(|b| *b == b'}')?;
            (close > 0).then(|| &tag[..close])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for byte in hashed {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
        }
    }
    crc % 16384
}

/// The store key the workload's guard `body` has (what a Cluster hashes).
pub fn store_key(guard: GuardKind, body: &KeyBody) -> String {
    // Named by the runtime itself, so the checker hashes exactly what the workers wrote.
    static NAMING: OnceLock<Redguard> = OnceLock::new();
    NAMING
        .get_or_init(Redguard::memory)
        .key(guard, SCOPE, body)
        .expect("a workload key")
        .as_str()
        .to_owned()
}

/// The key of lock `name` (and of the fair lock of that name, which shares its hash tag).
pub fn lock_body(name: &str) -> KeyBody {
    KeyBuilder::new().text(name).finish().expect("a lock key")
}

/// The key of idempotent intent `intent`.
pub fn intent_body(intent: u64) -> KeyBody {
    KeyBuilder::new()
        .part("intent", &intent)
        .finish()
        .expect("an intent key")
}

/// The key of the limit of `algorithm`.
pub fn rate_body(algorithm: Algorithm) -> KeyBody {
    KeyBuilder::new()
        .text("rate:")
        .text(&algorithm.as_str().replace('_', "-"))
        .finish()
        .expect("a rate key")
}

/// The stretches of time in which writes to one hash slot may have been lost, merged and
/// sorted.
#[derive(Debug, Default)]
struct Stretches(Vec<(u64, u64)>);

impl Stretches {
    /// Whether writes made within `[from, to]` may have been lost within it.
    fn overlap(&self, from: u64, to: u64) -> bool {
        let first = self.0.partition_point(|(_, end)| *end < from);
        self.0.get(first).is_some_and(|(start, _)| *start <= to)
    }
}

/// The data-losing faults, and their stretches by hash slot (computed on first use).
struct Losses<'a> {
    faults: Vec<&'a FaultSpan>,
    by_slot: HashMap<u16, Stretches>,
}

impl<'a> Losses<'a> {
    fn new(faults: &'a [FaultSpan]) -> Losses<'a> {
        Losses {
            faults: faults
                .iter()
                .filter(|fault| fault.loss != Loss::Nothing)
                .collect(),
            by_slot: HashMap::new(),
        }
    }

    /// The stretches in which writes to `guard`'s `body` may have been lost.
    fn of(&mut self, guard: GuardKind, body: &KeyBody) -> &Stretches {
        let slot = slot(&store_key(guard, body));
        let faults = &self.faults;
        self.by_slot.entry(slot).or_insert_with(|| {
            let lag = u64::try_from(REPLICATION_LAG.as_micros()).expect("µs");
            let mut windows: Vec<(u64, u64)> = faults
                .iter()
                .filter(|fault| match &fault.loss {
                    Loss::Nothing => false,
                    Loss::Everything => true,
                    Loss::Slots(ranges) => ranges
                        .iter()
                        .any(|(first, last)| (*first..=*last).contains(&slot)),
                })
                .map(|fault| (fault.start.saturating_sub(lag), fault.end))
                .collect();
            windows.sort_unstable();
            let mut merged: Vec<(u64, u64)> = Vec::new();
            for (start, end) in windows {
                match merged.last_mut() {
                    Some(last) if start <= last.1 => last.1 = last.1.max(end),
                    _ => merged.push((start, end)),
                }
            }
            Stretches(merged)
        })
    }
}

/// Checks `history`; see the module docs for what.
pub fn check(history: &History) -> Report {
    let mut losses = Losses::new(&history.faults);
    let mut report = Report {
        operations: history.events.len(),
        faults: history.faults.len(),
        ..Report::default()
    };
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for fault in &history.faults {
        *kinds.entry(&fault.kind).or_default() += 1;
    }
    report.figures.push(format!(
        "faults: {}",
        kinds
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    check_locks(history, &mut losses, &mut report);
    check_idempotency(history, &mut losses, &mut report);
    check_rates(history, &mut losses, &mut report);
    report
}

fn check_locks(history: &History, losses: &mut Losses<'_>, report: &mut Report) {
    let mut sections: BTreeMap<&str, Vec<Section<'_>>> = BTreeMap::new();
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for event in &history.events {
        let Event::Lock {
            key,
            owner,
            invoke,
            entered,
            left,
            fence,
            lease_ms,
            outcome,
        } = event
        else {
            continue;
        };
        let name = match outcome {
            Outcome::Ok => "ok",
            Outcome::Timeout => "timeout",
            Outcome::Backend => "backend",
            Outcome::Lost => "lost",
            Outcome::Unexpected(what) => {
                report
                    .violations
                    .push(format!("unexpected outcome: lock {key} {owner}: {what}"));
                "unexpected"
            }
        };
        *outcomes.entry(name.to_owned()).or_default() += 1;
        if let (Some(entered), Some(left)) = (entered, left) {
            let valid = *left <= invoke + lease_ms * 1000
                && !losses
                    .of(GuardKind::Lock, &lock_body(key))
                    .overlap(*invoke, *left);
            sections.entry(key).or_default().push(Section {
                owner,
                invoke: *invoke,
                entered: *entered,
                left: *left,
                fence: *fence,
                valid,
            });
        }
    }
    let total: usize = sections.values().map(Vec::len).sum();
    let valid = sections.values().flatten().filter(|s| s.valid).count();
    report.figures.push(format!(
        "locks: {} calls ({}), {total} sections ({valid} with a sure lease)",
        outcomes.values().sum::<usize>(),
        counts(&outcomes)
    ));
    for (key, sections) in &mut sections {
        mutual_exclusion(key, sections, report);
        fencing_order(key, sections, report);
    }
    fenced_out(history, &sections, report);
    progress(history, &sections, report);
    effects(history, report);
}

/// `name count, …`.
fn counts(map: &BTreeMap<String, usize>) -> String {
    map.iter()
        .map(|(name, n)| format!("{name} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Valid sections never overlap, and run in the order of their tokens.
fn mutual_exclusion(key: &str, sections: &mut [Section<'_>], report: &mut Report) {
    sections.sort_by_key(|s| (s.entered, s.left));
    // The valid section that ends last among those seen: any later start before its end
    // overlaps it.
    let mut latest: Option<&Section<'_>> = None;
    let mut previous: Option<&Section<'_>> = None;
    for section in sections.iter().filter(|s| s.valid) {
        if let Some(latest) = latest
            && section.entered < latest.left
        {
            report.violations.push(format!(
                "mutual exclusion: {key}: {latest} overlaps {section}"
            ));
        }
        if let Some(previous) = previous
            && section.fence <= previous.fence
        {
            report.violations.push(format!(
                "fencing order: {key}: {section} ran after {previous} with a token not above it"
            ));
        }
        if latest.is_none_or(|l| section.left > l.left) {
            latest = Some(section);
        }
        previous = Some(section);
    }
}

/// An acquisition that completed before another was invoked has the smaller token.
fn fencing_order(key: &str, sections: &[Section<'_>], report: &mut Report) {
    let mut by_invoke: Vec<&Section<'_>> = sections.iter().collect();
    by_invoke.sort_by_key(|s| s.invoke);
    let mut by_entered: Vec<&Section<'_>> = sections.iter().collect();
    by_entered.sort_by_key(|s| s.entered);
    // The acquisition with the largest token among those complete before the current invoke.
    let mut done: Option<&Section<'_>> = None;
    let mut next = 0;
    for later in by_invoke {
        while let Some(earlier) = by_entered.get(next)
            && earlier.entered < later.invoke
        {
            if done.is_none_or(|d| earlier.fence > d.fence) {
                done = Some(earlier);
            }
            next += 1;
        }
        if let Some(earlier) = done
            && later.fence <= earlier.fence
        {
            report.violations.push(format!(
                "fencing order: {key}: {later} was invoked after {earlier} had the lock, with a \
                 token not above it"
            ));
        }
    }
}

/// How long after a fault ends the guards may still be catching up (reconnecting, waiting
/// out a lease that a stall let run out).
const RECOVERY: Duration = Duration::from_millis(500);
/// The fewest sections per second each lock key must complete while no fault is active; a
/// healthy run does ten times more, a lock that is never released (each holder's key freed
/// only when its lease ends) at most 1/[`LEASE`].
const MIN_PROGRESS_PER_SEC: f64 = 1.0;

/// Seconds of the `free` stretches covered by at least one of `sections`.
fn held_secs(sections: &[Section<'_>], free: &[(u64, u64)]) -> f64 {
    let mut spans: Vec<(u64, u64)> = sections.iter().map(|s| (s.entered, s.left)).collect();
    spans.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (start, end) in spans {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    let covered: u64 = merged
        .iter()
        .flat_map(|&(start, end)| {
            free.iter()
                .map(move |&(a, b)| end.min(b).saturating_sub(start.max(a)))
        })
        .sum();
    covered as f64 / 1e6
}

/// Each lock key keeps changing hands while nothing is broken: a lock that safety alone
/// cannot fault (never released, a waiter never woken) shows here.
fn progress(history: &History, sections: &BTreeMap<&str, Vec<Section<'_>>>, report: &mut Report) {
    let recovery = u64::try_from(RECOVERY.as_micros()).expect("µs");
    let mut busy: Vec<(u64, u64)> = history
        .faults
        .iter()
        .map(|fault| (fault.start, fault.end + recovery))
        .collect();
    busy.sort_unstable();
    // The stretches of the run with no fault active, nor just healed.
    let mut free = Vec::new();
    let mut from = history.run.0;
    for (start, end) in busy {
        if start > from {
            free.push((from, start.min(history.run.1)));
        }
        from = from.max(end);
    }
    if from < history.run.1 {
        free.push((from, history.run.1));
    }
    let free_secs = free.iter().map(|(a, b)| b - a).sum::<u64>() as f64 / 1e6;
    let mut figures = Vec::new();
    for (key, _) in LOCK_KEYS {
        let sections = sections.get(key).map_or(&[][..], Vec::as_slice);
        let done = sections
            .iter()
            .filter(|s| free.iter().any(|(a, b)| (*a..*b).contains(&s.entered)))
            .count();
        // Time someone was inside is not time the key stood still: a holder may think past
        // a lease its watchdog renews (the workload's rare long sections). What must keep
        // moving is the rest, when the key is free or held by nobody the history knows.
        let open_secs = (free_secs - held_secs(sections, &free)).max(0.0);
        let rate = done as f64 / open_secs.max(f64::EPSILON);
        figures.push(format!("{key} {done} in {open_secs:.1} s"));
        // Too short a stretch says nothing either way.
        if open_secs >= 2.0 && rate < MIN_PROGRESS_PER_SEC {
            report.violations.push(format!(
                "lock progress: {key}: {done} sections in {open_secs:.1} s without faults and \
                 with nobody inside ({rate:.2}/s, expected at least {MIN_PROGRESS_PER_SEC}/s)"
            ));
        }
    }
    report.figures.push(format!(
        "lock progress without faults ({free_secs:.1} s; sections entered in the time nobody \
         was inside): {}",
        figures.join(", ")
    ));
}

/// No call of a valid section to its register is refused.
fn fenced_out(history: &History, sections: &BTreeMap<&str, Vec<Section<'_>>>, report: &mut Report) {
    let valid: HashMap<&str, &Section<'_>> = sections
        .values()
        .flatten()
        .filter(|s| s.valid)
        .map(|s| (s.owner, s))
        .collect();
    let (mut calls, mut refused) = (0, 0);
    for event in &history.events {
        let Event::Register {
            key,
            owner,
            invoke,
            complete,
            accepted,
            write,
            ..
        } = event
        else {
            continue;
        };
        calls += 1;
        if *accepted {
            continue;
        }
        refused += 1;
        if let Some(section) = valid.get(owner.as_str())
            && section.entered <= *invoke
            && *complete <= section.left
        {
            report.violations.push(format!(
                "fenced out while valid: {key}: the {} of {section} was refused",
                if *write { "write" } else { "read" }
            ));
        }
    }
    report.figures.push(format!(
        "registers: {calls} calls, {refused} refused by fencing"
    ));
}

/// Each register holds exactly the number of writes it accepted, each value written once.
fn effects(history: &History, report: &mut Report) {
    let mut written: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for event in &history.events {
        if let Event::Register {
            key,
            write: true,
            accepted: true,
            value,
            ..
        } = event
        {
            written.entry(key).or_default().push(*value);
        }
    }
    let mut figures = Vec::new();
    for (key, last) in &history.registers {
        let mut values = written.remove(key.as_str()).unwrap_or_default();
        values.sort_unstable();
        let accepted = values.len() as u64;
        let mut doubled: Vec<u64> = values
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| w[0])
            .collect();
        doubled.dedup();
        if accepted != *last || !doubled.is_empty() {
            let mut text = format!(
                "lost or doubled effects: {key}: {accepted} accepted writes, final value {last}"
            );
            if !doubled.is_empty() {
                let _ = write!(
                    text,
                    "; {} values written more than once (first {:?})",
                    doubled.len(),
                    &doubled[..doubled.len().min(5)]
                );
            }
            report.violations.push(text);
        }
        figures.push(format!("{key} {last}"));
    }
    for key in written.keys() {
        report.violations.push(format!(
            "lost or doubled effects: writes accepted to {key}, which the test did not read"
        ));
    }
    report
        .figures
        .push(format!("register values: {}", figures.join(", ")));
}

fn check_idempotency(history: &History, losses: &mut Losses<'_>, report: &mut Report) {
    let mut executions: HashMap<u64, Vec<(u64, u64, &str)>> = HashMap::new();
    let mut executed_calls: HashMap<&str, u64> = HashMap::new();
    for event in &history.events {
        if let Event::Exec {
            intent,
            call,
            invoke,
            start,
        } = event
        {
            executions
                .entry(*intent)
                .or_default()
                .push((*start, *invoke, call));
            executed_calls.insert(call, *intent);
        }
    }
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for event in &history.events {
        let Event::Idem {
            intent,
            call,
            outcome,
            ..
        } = event
        else {
            continue;
        };
        let name = match outcome {
            IdemOutcome::Ran(value) | IdemOutcome::Replayed(value) => {
                if *value != intent * 7 {
                    report.violations.push(format!(
                        "double execution: intent {intent} answered {value} to call {call}"
                    ));
                }
                if matches!(outcome, IdemOutcome::Replayed(_)) && !executions.contains_key(intent) {
                    report.violations.push(format!(
                        "unexpected outcome: call {call} replayed intent {intent}, which never ran"
                    ));
                }
                if matches!(outcome, IdemOutcome::Ran(_)) {
                    if !executed_calls.contains_key(call.as_str()) {
                        report.violations.push(format!(
                            "unexpected outcome: call {call} of intent {intent} returned a \
                             value without running its body or replaying"
                        ));
                    }
                    "ran"
                } else {
                    "replayed"
                }
            }
            IdemOutcome::InProgress => "in_progress",
            IdemOutcome::Backend => "backend",
            IdemOutcome::Unexpected(what) => {
                report.violations.push(format!(
                    "unexpected outcome: idempotent {intent} {call}: {what}"
                ));
                "unexpected"
            }
        };
        *outcomes.entry(name.to_owned()).or_default() += 1;
    }
    let mut twice_excused = 0;
    for (intent, runs) in &mut executions {
        runs.sort_unstable();
        for pair in runs.windows(2) {
            let ((_, first_invoke, first), (second_start, _, second)) = (pair[0], pair[1]);
            let stretches = losses.of(GuardKind::Idempotency, &intent_body(*intent));
            if stretches.overlap(first_invoke, second_start) {
                twice_excused += 1;
            } else {
                report.violations.push(format!(
                    "double execution: intent {intent} ran in call {first} (invoked \
                     {first_invoke}) and again in call {second} (at {second_start}), no data \
                     lost between"
                ));
            }
        }
    }
    report.figures.push(format!(
        "idempotent: {} calls ({}), {} intents, {} executions ({twice_excused} again after a \
         data-losing fault)",
        outcomes.values().sum::<usize>(),
        counts(&outcomes),
        executions.len(),
        executions.values().map(Vec::len).sum::<usize>(),
    ));
}

fn check_rates(history: &History, losses: &mut Losses<'_>, report: &mut Report) {
    let mut admitted: HashMap<Algorithm, Vec<u64>> = HashMap::new();
    let mut rejected: HashMap<Algorithm, usize> = HashMap::new();
    let mut errors: HashMap<Algorithm, usize> = HashMap::new();
    for event in &history.events {
        if let Event::Rate {
            algorithm, outcome, ..
        } = event
        {
            match outcome {
                RateOutcome::Admitted(at) => admitted.entry(*algorithm).or_default().push(*at),
                RateOutcome::Rejected => *rejected.entry(*algorithm).or_default() += 1,
                RateOutcome::Error => *errors.entry(*algorithm).or_default() += 1,
            }
        }
    }
    let mut figures = Vec::new();
    for limit in limits() {
        let algorithm = limit.algorithm();
        let mut times = admitted.remove(&algorithm).unwrap_or_default();
        times.sort_unstable();
        // Each stretch between data-losing faults is checked on its own; what was admitted
        // during one may or may not be remembered after it, so it is left out.
        let mut worst = f64::NEG_INFINITY;
        let mut from = 0;
        let stretches = &losses.of(GuardKind::RateLimit, &rate_body(algorithm)).0;
        for (start, end) in stretches.iter().copied().chain([(u64::MAX, u64::MAX)]) {
            let epoch: Vec<u64> = times
                .iter()
                .copied()
                .filter(|at| (from..start).contains(at))
                .collect();
            from = end.saturating_add(1);
            if epoch.is_empty() {
                continue;
            }
            let verdict = crate::rate::verdict(&limit, &epoch);
            worst = worst.max(verdict.worst_excess);
            if verdict.worst_excess > 1e-6 {
                report.violations.push(format!(
                    "rate bound: {algorithm}: {} admitted from {} to {}, {} in the worst \
                     interval, {:.3} beyond the bound",
                    epoch.len(),
                    epoch[0],
                    epoch[epoch.len() - 1],
                    verdict.worst_interval,
                    verdict.worst_excess
                ));
            }
        }
        let worst = if worst.is_finite() {
            format!("{worst:.2}")
        } else {
            "-".to_owned()
        };
        figures.push(format!(
            "{algorithm} {}/{}/{} (worst excess {worst})",
            times.len(),
            rejected.get(&algorithm).copied().unwrap_or(0),
            errors.get(&algorithm).copied().unwrap_or(0),
        ));
    }
    report.figures.push(format!(
        "rate admitted/rejected/errors: {}",
        figures.join(", ")
    ));
}
