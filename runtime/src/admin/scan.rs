//! Counting the keys of a guard or scope: `SCAN` through the store, then one read per key.

use std::collections::BTreeMap;

use serde::Serialize;

use super::address::{self, LockKindName};
use super::decode::View;
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, Key, MAX_SCOPE_LEN, check_name};

/// Default bound on the keys a scan looks at.
pub const DEFAULT_SCAN_LIMIT: usize = 10_000;

/// Keys read at once while scanning.
const READ_BATCH: usize = 32;

/// Which keys [`Admin::scan`](super::Admin::scan) counts.
///
/// ```
/// use redguard::key::GuardKind;
/// use redguard::admin::ScanSelect;
///
/// let select = ScanSelect::guard(GuardKind::Lock).scope("shop::reserve").limit(1000);
/// assert_eq!(select.limit_value(), 1000);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanSelect {
    guard: Option<GuardKind>,
    scope: Option<String>,
    limit: usize,
}

impl ScanSelect {
    /// Every key under the prefix.
    pub fn all() -> ScanSelect {
        ScanSelect {
            guard: None,
            scope: None,
            limit: DEFAULT_SCAN_LIMIT,
        }
    }

    /// The keys of one guard.
    pub fn guard(guard: GuardKind) -> ScanSelect {
        ScanSelect {
            guard: Some(guard),
            ..ScanSelect::all()
        }
    }

    /// Only keys of this scope (needs a guard).
    pub fn scope(mut self, scope: impl Into<String>) -> ScanSelect {
        self.scope = Some(scope.into());
        self
    }

    /// Look at no more than `limit` keys (default [`DEFAULT_SCAN_LIMIT`]).
    pub fn limit(mut self, limit: usize) -> ScanSelect {
        self.limit = limit.max(1);
        self
    }

    /// The bound on the keys looked at.
    pub fn limit_value(&self) -> usize {
        self.limit
    }
}

/// Keys of one guard with one role (the key itself, or a companion such as `fence`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ScanGroup {
    /// `idem`, `lock` or `rate`.
    pub guard: String,
    /// What the keys are: `record`, `exclusive`, `fair`, `semaphore`, `read_write`, `state`,
    /// or a companion (`fence`, `fair:queue`, `rw:readers`, `block`, …).
    pub role: String,
    /// How many.
    pub count: u64,
    /// The oldest record's age (idempotency) or the longest-held lock's time held.
    pub oldest_ms: Option<u64>,
    /// The key of that oldest one.
    pub oldest_key: Option<String>,
    /// Shortest time to live.
    pub ttl_min_ms: Option<u64>,
    /// Longest time to live.
    pub ttl_max_ms: Option<u64>,
}

/// What [`Admin::scan`](super::Admin::scan) found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ScanReport {
    /// The key prefix scanned for.
    pub pattern: String,
    /// Keys looked at.
    pub keys: u64,
    /// The limit was reached: more keys may exist.
    pub truncated: bool,
    /// Counts per guard and role.
    pub groups: Vec<ScanGroup>,
    /// Data redguard does not write, and keys that are not its own.
    pub problems: Vec<String>,
}

pub(crate) async fn scan(handle: &Redguard, select: &ScanSelect) -> Result<ScanReport> {
    let mut pattern = format!("{}:", handle.prefix());
    if let Some(guard) = select.guard {
        pattern.push_str(guard.as_str());
        pattern.push_str(":{");
        if let Some(scope) = &select.scope {
            check_name("scope", scope, MAX_SCOPE_LEN)?;
            pattern.push_str(scope);
            pattern.push(':');
        }
    } else if select.scope.is_some() {
        return Err(Error::Config(
            "a scan by scope needs the guard too (idem, lock or rate)".to_owned(),
        ));
    }
    let store = handle.store();
    let found = store.admin_scan(&pattern, select.limit).await?;
    let mut groups: BTreeMap<(String, String), ScanGroup> = BTreeMap::new();
    let mut problems = Vec::new();
    for batch in found.keys.chunks(READ_BATCH) {
        let reads = batch.iter().map(|raw| async move {
            let key = Key::stored(raw.as_str());
            (raw, store.admin_read(std::slice::from_ref(&key)).await)
        });
        for (raw, snapshot) in futures_util::future::join_all(reads).await {
            let snapshot = snapshot?;
            let Ok(admin_key) = address::raw(handle, raw) else {
                problems.push(format!("{raw} is not a key redguard writes"));
                continue;
            };
            let Some(entry) = snapshot.entries.first() else {
                continue;
            };
            if entry.value == crate::store::admin::Raw::Absent {
                // Expired between the scan and the read.
                continue;
            }
            let suffix = raw[admin_key.as_str().len()..].trim_start_matches(':');
            let guard = admin_key.guard().as_str();
            let mut view = View::new(&snapshot);
            let (role, age) = match (admin_key.guard(), suffix) {
                (GuardKind::Idempotency, _) => {
                    ("record".to_owned(), view.record(raw).and_then(|r| r.age_ms))
                }
                (GuardKind::Lock, suffix) => {
                    let kind = LockKindName::ALL
                        .into_iter()
                        .find(|k| k.suffix().unwrap_or("") == suffix);
                    match kind {
                        Some(kind) => (
                            kind.as_str().to_owned(),
                            view.lock(kind, raw).and_then(|l| l.held_for_ms),
                        ),
                        None => (suffix.to_owned(), None),
                    }
                }
                (_, "") => ("state".to_owned(), None),
                (GuardKind::RateLimit, tally) if tally.starts_with("top:") => {
                    ("top".to_owned(), None)
                }
                (_, suffix) => (suffix.to_owned(), None),
            };
            problems.append(&mut view.problems);
            let ttl = entry.expires_at_ms.map(|at| at.saturating_sub(view.now_ms));
            let group = groups
                .entry((guard.to_owned(), role.clone()))
                .or_insert_with(|| ScanGroup {
                    guard: guard.to_owned(),
                    role,
                    count: 0,
                    oldest_ms: None,
                    oldest_key: None,
                    ttl_min_ms: None,
                    ttl_max_ms: None,
                });
            group.count += 1;
            if age.is_some() && age > group.oldest_ms {
                group.oldest_ms = age;
                group.oldest_key = Some(raw.clone());
            }
            if let Some(ttl) = ttl {
                group.ttl_min_ms = Some(group.ttl_min_ms.map_or(ttl, |m| m.min(ttl)));
                group.ttl_max_ms = Some(group.ttl_max_ms.map_or(ttl, |m| m.max(ttl)));
            }
        }
    }
    Ok(ScanReport {
        pattern: format!("{pattern}*"),
        keys: found.keys.len() as u64,
        truncated: found.truncated,
        groups: groups.into_values().collect(),
        problems,
    })
}
