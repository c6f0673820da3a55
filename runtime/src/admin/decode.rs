//! Guard state decoded from what the store holds ([`Snapshot`]): the formats the scripts
//! write (their header comments describe them), read back for people.

use std::collections::HashMap;

use serde::Serialize;

use super::address::LockKindName;
use crate::store::admin::{Raw, RawEntry, Snapshot};

/// A decoded idempotency record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RecordState {
    /// `processing` (an execution runs, or crashed), `success`, `fail` or `unknown` (ended
    /// with an unknown outcome: resolve it with [`Admin::resolve`](super::Admin::resolve)).
    pub status: String,
    /// The execution that wrote it (random per execution).
    pub owner: String,
    /// The payload fingerprint, when the guard has a `payload`.
    pub fingerprint: Option<String>,
    /// Time since the current execution began.
    pub age_ms: Option<u64>,
    /// Time since it finished (SUCCESS, FAIL or UNKNOWN) or was resolved.
    pub finished_ago_ms: Option<u64>,
    /// Time until the record expires.
    pub ttl_ms: Option<u64>,
    /// Size of the stored result (SUCCESS), in bytes.
    pub result_bytes: Option<u64>,
}

/// One holder of a semaphore or a read lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// Its owner token.
    pub owner: String,
    /// Time until its lease ends.
    pub lease_left_ms: u64,
}

/// A decoded lock of one kind at a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LockState {
    /// Which kind of lock.
    pub kind: LockKindName,
    /// The key the lock lives at.
    pub key: String,
    /// True while someone holds it (or it is kept for `hold_at_least`).
    pub held: bool,
    /// The holder's owner token (exclusive, fair, a read/write lock's writer); empty while a
    /// released lock is kept for `hold_at_least`.
    pub owner: Option<String>,
    /// Reentrancy depth.
    pub depth: Option<u32>,
    /// The holder's fencing token.
    pub fence: Option<u64>,
    /// When it was taken, in ms since the Unix epoch: a fencing token is Redis's clock in
    /// µs at the acquisition (unless the counter was ahead of it: then slightly later).
    pub acquired_at_ms: Option<u64>,
    /// Time since then.
    pub held_for_ms: Option<u64>,
    /// Time until the holder's lease ends, unless renewed.
    pub lease_left_ms: Option<u64>,
    /// Holders of a semaphore, or readers of a read/write lock, whose lease is running.
    pub holders: Vec<Holder>,
    /// Fair waiters in the queue.
    pub waiters: Option<u64>,
    /// A writer announced while readers hold a read/write lock.
    pub writer_waiting: Option<String>,
    /// The key's fencing counter: the last token handed out.
    pub fence_counter: Option<u64>,
}

/// A decoded rate-limit state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RateState {
    /// `gcra`, `fixed_window`, `sliding_window`, `sliding_counter`, `token_bucket` or
    /// `leaky_bucket`, from the state's format.
    pub algorithm: String,
    /// Units charged and not yet drained (GCRA and buckets), or counted in the window.
    pub used: Option<u64>,
    /// The previous window's count (sliding counter).
    pub previous: Option<u64>,
    /// Calls in a sliding log.
    pub entries: Option<u64>,
    /// The emission interval the state was counted at (GCRA, buckets), in ns.
    pub interval_ns: Option<u64>,
    /// Time until the state is empty again (the key expires then).
    pub empty_in_ms: Option<u64>,
    /// Time left on a `block` penalty.
    pub penalty_left_ms: Option<u64>,
}

/// What [`Admin::inspect`](super::Admin::inspect) found at a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Inspection {
    /// The key, as the guard renders it.
    pub key: String,
    /// `idem`, `lock` or `rate`.
    pub guard: &'static str,
    /// The store's time, ms since the Unix epoch.
    pub now_ms: u64,
    /// The idempotency record, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<RecordState>,
    /// Locks of every kind found at the key (none: the lock is free).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub locks: Vec<LockState>,
    /// The exclusive lock's fencing counter when no lock is held: the last token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence_counter: Option<u64>,
    /// The rate-limit state, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateState>,
    /// The decision a call of the given limit would get now (peeked: nothing charged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<DecisionState>,
    /// Data redguard does not write (another type, an unreadable field, a key without TTL).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

impl Inspection {
    /// True when nothing is stored for the key (a free lock may still have a fence counter).
    pub fn is_empty(&self) -> bool {
        self.record.is_none() && self.locks.is_empty() && self.rate.is_none()
    }
}

/// A rate decision, in milliseconds (see [`Decision`](crate::Decision)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DecisionState {
    /// Whether a call would be admitted now.
    pub allowed: bool,
    /// The capacity.
    pub limit: u64,
    /// Units left after such a call.
    pub remaining: u64,
    /// Time until the full capacity is back.
    pub reset_after_ms: u64,
    /// When rejected: time until the call would be admitted.
    pub retry_after_ms: u64,
}

impl From<crate::Decision> for DecisionState {
    fn from(d: crate::Decision) -> Self {
        DecisionState {
            allowed: d.allowed,
            limit: d.limit,
            remaining: d.remaining,
            reset_after_ms: ms_ceil(d.reset_after.as_micros()),
            retry_after_ms: ms_ceil(d.retry_after.as_micros()),
        }
    }
}

fn ms_ceil(us: u128) -> u64 {
    u64::try_from(us.div_ceil(1000)).unwrap_or(u64::MAX)
}

/// The entries of a snapshot by key, and its time.
pub(crate) struct View<'a> {
    entries: HashMap<&'a str, &'a RawEntry>,
    pub(crate) now_us: u64,
    pub(crate) now_ms: u64,
    pub(crate) problems: Vec<String>,
}

impl<'a> View<'a> {
    pub(crate) fn new(snapshot: &'a Snapshot) -> View<'a> {
        let now_us = u64::try_from(snapshot.now.as_micros()).unwrap_or(u64::MAX);
        let mut problems = Vec::new();
        for entry in &snapshot.entries {
            match &entry.value {
                Raw::Absent => {}
                Raw::Other(ty) => problems.push(format!(
                    "{} holds a {ty}, which redguard never writes there",
                    entry.key
                )),
                _ if entry.expires_at_ms.is_none() => problems.push(format!(
                    "{} has no TTL: redguard never writes one",
                    entry.key
                )),
                _ => {}
            }
        }
        View {
            entries: snapshot
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e))
                .collect(),
            now_us,
            now_ms: now_us / 1000,
            problems,
        }
    }

    fn get(&self, key: &str) -> Option<&'a RawEntry> {
        self.entries
            .get(key)
            .copied()
            .filter(|e| e.value != Raw::Absent)
    }

    fn ttl_ms(&self, entry: &RawEntry) -> Option<u64> {
        entry.expires_at_ms.map(|at| at.saturating_sub(self.now_ms))
    }

    fn wrong(&mut self, key: &str, what: &str) {
        self.problems.push(format!(
            "{key} is not {what} redguard writes: left as it is"
        ));
    }

    /// The idempotency record at `key`.
    pub(crate) fn record(&mut self, key: &str) -> Option<RecordState> {
        let entry = self.get(key)?;
        let Raw::Hash { fields, result_len } = &entry.value else {
            self.wrong(key, "an idempotency record");
            return None;
        };
        let field = |name: &str| {
            fields
                .iter()
                .find(|(f, _)| f == name)
                .map(|(_, v)| v.as_str())
        };
        let status = match field("status") {
            Some("P") => "processing",
            Some("S") => "success",
            Some("F") => "fail",
            Some("U") => "unknown",
            _ => {
                self.wrong(key, "an idempotency record");
                return None;
            }
        };
        let since = |name: &str| {
            field(name)
                .and_then(|v| v.parse::<u64>().ok())
                .map(|at| self.now_ms.saturating_sub(at))
        };
        Some(RecordState {
            status: status.to_owned(),
            owner: field("owner").unwrap_or_default().to_owned(),
            fingerprint: field("fp").filter(|fp| !fp.is_empty()).map(str::to_owned),
            age_ms: since("started"),
            finished_ago_ms: since("finished"),
            ttl_ms: self.ttl_ms(entry),
            result_bytes: *result_len,
        })
    }

    /// The fencing counter of the lock at `key`.
    pub(crate) fn lock_counter(&mut self, key: &str) -> Option<u64> {
        self.counter(&format!("{key}:fence"))
    }

    fn counter(&mut self, key: &str) -> Option<u64> {
        let entry = self.get(key)?;
        match &entry.value {
            Raw::Text(v) => v.parse().ok().or_else(|| {
                self.wrong(key, "a fencing counter");
                None
            }),
            _ => {
                self.wrong(key, "a fencing counter");
                None
            }
        }
    }

    /// Live members of the sorted set at `key` (score: lease end in ms), and its size.
    fn leases(&mut self, key: &str) -> (Vec<Holder>, Option<u64>) {
        let Some(entry) = self.get(key) else {
            return (Vec::new(), None);
        };
        let Raw::ZSet { card, members } = &entry.value else {
            self.wrong(key, "a set of leases");
            return (Vec::new(), None);
        };
        let holders = members
            .iter()
            .filter(|(_, end)| *end > self.now_ms as f64)
            .map(|(owner, end)| Holder {
                owner: owner.clone(),
                lease_left_ms: (*end as u64).saturating_sub(self.now_ms),
            })
            .collect();
        (holders, Some(*card))
    }

    /// The lock of `kind` whose key is `key` (with its companions), if anything is there.
    pub(crate) fn lock(&mut self, kind: LockKindName, key: &str) -> Option<LockState> {
        let mut state = LockState {
            kind,
            key: key.to_owned(),
            held: false,
            owner: None,
            depth: None,
            fence: None,
            acquired_at_ms: None,
            held_for_ms: None,
            lease_left_ms: None,
            holders: Vec::new(),
            waiters: None,
            writer_waiting: None,
            fence_counter: self.counter(&format!("{key}:fence")),
        };
        let mut present = false;
        if kind == LockKindName::Semaphore {
            let (holders, card) = self.leases(key);
            present = card.is_some();
            state.held = !holders.is_empty();
            state.holders = holders;
        } else if let Some(entry) = self.get(key) {
            present = true;
            match &entry.value {
                Raw::Hash { fields, .. } => {
                    let field = |name: &str| {
                        fields
                            .iter()
                            .find(|(f, _)| f == name)
                            .map(|(_, v)| v.clone())
                    };
                    state.held = true;
                    state.owner = field("owner");
                    state.depth = field("depth").and_then(|d| d.parse().ok());
                    state.fence = field("fence").and_then(|f| f.parse().ok());
                    state.lease_left_ms = self.ttl_ms(entry);
                    if state.owner.is_none() || state.fence.is_none() {
                        self.wrong(key, "a lock");
                    }
                    // A token at most the clock is the clock at its acquisition.
                    if let Some(fence) = state.fence.filter(|f| *f <= self.now_us) {
                        state.acquired_at_ms = Some(fence / 1000);
                        state.held_for_ms = Some((self.now_us - fence) / 1000);
                    }
                }
                _ => self.wrong(key, "a lock"),
            }
        }
        match kind {
            LockKindName::Fair => {
                let queue = format!("{key}:queue");
                if let Some(Raw::ZSet { card, .. }) = self.get(&queue).map(|e| &e.value) {
                    present = true;
                    state.waiters = Some(*card);
                }
            }
            LockKindName::ReadWrite => {
                let (readers, card) = self.leases(&format!("{key}:readers"));
                present |= card.is_some();
                state.held |= !readers.is_empty();
                state.holders = readers;
                let intent = format!("{key}:intent");
                if let Some(entry) = self.get(&intent) {
                    present = true;
                    match &entry.value {
                        Raw::Text(owner) => state.writer_waiting = Some(owner.clone()),
                        _ => self.wrong(&intent, "a writer's announcement"),
                    }
                }
            }
            LockKindName::Exclusive | LockKindName::Semaphore => {}
        }
        present.then_some(state)
    }

    /// The rate-limit state at `key` and its penalty at `<key>:block`.
    pub(crate) fn rate(&mut self, key: &str) -> Option<RateState> {
        let block = format!("{key}:block");
        let penalty_left_ms = match self.get(&block).map(|e| &e.value) {
            Some(Raw::Text(until)) => match until.parse::<u64>() {
                Ok(until) => Some(until.saturating_sub(self.now_us).div_ceil(1000)),
                Err(_) => {
                    self.wrong(&block, "a penalty");
                    None
                }
            },
            Some(_) => {
                self.wrong(&block, "a penalty");
                None
            }
            None => None,
        };
        let Some(entry) = self.get(key) else {
            return penalty_left_ms.map(|penalty| RateState {
                algorithm: "unknown (only a penalty is stored)".to_owned(),
                used: None,
                previous: None,
                entries: None,
                interval_ns: None,
                empty_in_ms: None,
                penalty_left_ms: Some(penalty),
            });
        };
        let mut state = RateState {
            algorithm: String::new(),
            used: None,
            previous: None,
            entries: None,
            interval_ns: None,
            empty_in_ms: self.ttl_ms(entry),
            penalty_left_ms,
        };
        let decoded = match &entry.value {
            Raw::Text(v) => self.gcra(v, entry.expires_at_ms, &mut state),
            Raw::Hash { fields, .. } => self.hash_rate(fields, &mut state),
            Raw::ZSet { card, members } => {
                state.algorithm = "sliding_window".to_owned();
                state.entries = Some(*card);
                // Units in the log: the newest entry's cumulative count less what came before
                // the oldest ("<cum>:<cost>" members).
                let parse = |m: &str| -> Option<(u64, u64)> {
                    let (c, k) = m.split_once(':')?;
                    Some((c.parse().ok()?, k.parse().ok()?))
                };
                let oldest = members.first().and_then(|(m, _)| parse(m));
                state.used = match (oldest, members.len() as u64 == *card) {
                    (Some((c, k)), true) => members
                        .last()
                        .and_then(|(m, _)| parse(m))
                        .map(|(top, _)| top - c + k),
                    _ => None,
                };
                oldest.is_some() || *card == 0
            }
            _ => false,
        };
        if !decoded {
            self.wrong(key, "a rate-limit state");
            return None;
        }
        Some(state)
    }

    /// GCRA: "<T><rrr>" (T µs), "-<T><rrrrrr>" (T ns), or "<tat>:<T>" (µs, before 0.1);
    /// the TAT is the key's expiry less the rest.
    fn gcra(&self, v: &str, at_ms: Option<u64>, state: &mut RateState) -> bool {
        state.algorithm = "gcra".to_owned();
        let now_ns = u128::from(self.now_us) * 1000;
        let at_ns = u128::from(at_ms.unwrap_or(0)) * 1_000_000;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let (t_ns, tat_ns) = if let Some(n) = v.strip_prefix('-').filter(|n| digits(n)) {
            let Ok(n) = n.parse::<u128>() else {
                return false;
            };
            (n / 1_000_000, at_ns.saturating_sub(n % 1_000_000))
        } else if let Some((tat, t)) = v.split_once(':') {
            match (tat.parse::<u128>(), t.parse::<u128>()) {
                (Ok(tat), Ok(t)) => (t * 1000, tat * 1000),
                _ => return false,
            }
        } else if digits(v) && v.len() >= 4 {
            let (t, rest) = v.split_at(v.len() - 3);
            match (t.parse::<u128>(), rest.parse::<u128>()) {
                (Ok(t), Ok(rest)) => (t * 1000, at_ns.saturating_sub(rest * 1000)),
                _ => return false,
            }
        } else {
            return false;
        };
        let debt = tat_ns.saturating_sub(now_ns);
        state.interval_ns = u64::try_from(t_ns).ok();
        state.used = u64::try_from(debt.div_ceil(t_ns.max(1))).ok();
        state.empty_in_ms = u64::try_from(debt.div_ceil(1_000_000)).ok();
        true
    }

    /// The hash algorithms, tagged by field `a`.
    fn hash_rate(&self, fields: &[(String, String)], state: &mut RateState) -> bool {
        let field = |name: &str| {
            fields
                .iter()
                .find(|(f, _)| f == name)
                .and_then(|(_, v)| v.parse::<f64>().ok())
        };
        let tag = fields
            .iter()
            .find(|(f, _)| f == "a")
            .map(|(_, v)| v.as_str());
        match tag {
            Some("fw") => {
                state.algorithm = "fixed_window".to_owned();
                state.used = field("n").map(|n| n.ceil() as u64);
                state.used.is_some()
            }
            Some("sc") => {
                state.algorithm = "sliding_counter".to_owned();
                state.used = field("c").map(|n| n.ceil() as u64);
                state.previous = field("p").map(|n| n.ceil() as u64);
                state.used.is_some()
            }
            Some(tag @ ("tb" | "lb")) => {
                state.algorithm = if tag == "tb" {
                    "token_bucket"
                } else {
                    "leaky_bucket"
                }
                .to_owned();
                let (Some(level), Some(at_us)) = (field("v"), field("u")) else {
                    return false;
                };
                // The level drains one unit per interval since it was written.
                let t_ns = field("t").filter(|t| *t > 0.0);
                state.interval_ns = t_ns.map(|t| t as u64);
                if let Some(t_ns) = t_ns {
                    let drained = (self.now_us as f64 - at_us).max(0.0) * 1000.0 / t_ns;
                    let left = (level - drained).max(0.0);
                    state.used = Some(left.ceil() as u64);
                    state.empty_in_ms = Some((left * t_ns / 1e6).ceil() as u64);
                } else {
                    state.used = Some(level.ceil() as u64);
                }
                true
            }
            _ => false,
        }
    }
}
