//! Which stored keys an operator means: a guard, scope and rendered template (the same key
//! rules and layout the guards use), or a full key as found in Redis, checked to be one
//! redguard writes under the handle's prefix.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, Key, KeyBuilder, KeyRule, MAX_KEY_LEN, check_name};

/// The kinds of lock that may live at one lock key, each at its own suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LockKindName {
    /// `LockBuilder::acquire`, `#[dist_lock]`: a hash at the key itself.
    Exclusive,
    /// `fair`: a hash at `<key>:fair` and its queue.
    Fair,
    /// `permits = N`: a sorted set of holders at `<key>:sem`.
    Semaphore,
    /// `read` / `write`: the writer's hash at `<key>:rw`, readers at `<key>:rw:readers`.
    ReadWrite,
}

impl LockKindName {
    /// Every kind, in the order they are reported.
    pub const ALL: [LockKindName; 4] = [
        LockKindName::Exclusive,
        LockKindName::Fair,
        LockKindName::Semaphore,
        LockKindName::ReadWrite,
    ];

    /// The suffix the lock builder puts after the key's hash tag (`lock::builder`).
    pub(crate) fn suffix(self) -> Option<&'static str> {
        match self {
            LockKindName::Exclusive => None,
            LockKindName::Fair => Some("fair"),
            LockKindName::Semaphore => Some("sem"),
            LockKindName::ReadWrite => Some("rw"),
        }
    }

    /// `exclusive`, `fair`, `semaphore`, `read_write`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockKindName::Exclusive => "exclusive",
            LockKindName::Fair => "fair",
            LockKindName::Semaphore => "semaphore",
            LockKindName::ReadWrite => "read_write",
        }
    }
}

/// Companions written next to a lock of each kind (after its own suffix).
const LOCK_COMPANIONS: [&str; 5] = ["fence", "queue", "registered", "readers", "intent"];

/// A guard key an operator named, checked: `<prefix>:<guard>:{<scope>:<key>}`.
///
/// ```
/// use redguard::key::GuardKind;
/// use redguard::admin::{Admin, AdminKey};
///
/// let admin = Admin::new(redguard::Redguard::memory());
/// let key = admin.key(GuardKind::Lock, "shop::reserve", "stock:SK-1")?;
/// assert_eq!(key.as_str(), "redguard:lock:{shop::reserve:stock:SK-1}");
/// // A key as found in Redis, companions included, addresses the same lock.
/// let fence = admin.raw_key("redguard:lock:{shop::reserve:stock:SK-1}:fence")?;
/// assert_eq!(fence.as_str(), key.as_str());
/// // Anything redguard does not write under its prefix is refused.
/// assert!(admin.raw_key("sessions:42").is_err());
/// # Ok::<(), redguard::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminKey {
    pub(crate) guard: GuardKind,
    /// The key without any suffix: what the guard renders.
    pub(crate) base: Key,
    /// The lock kind a raw key named by its suffix.
    pub(crate) lock_kind: Option<LockKindName>,
}

impl AdminKey {
    /// The guard the key belongs to.
    pub fn guard(&self) -> GuardKind {
        self.guard
    }

    /// The key as the guard renders it (without companion suffixes).
    pub fn as_str(&self) -> &str {
        self.base.as_str()
    }

    /// `base` + `:suffix` (a companion key, in the same hash tag).
    pub(crate) fn at(&self, suffix: &str) -> Key {
        self.base.companion(suffix)
    }
}

fn foreign(handle: &Redguard) -> Error {
    Error::InvalidKey {
        part: "key".to_owned(),
        rule: KeyRule::Foreign {
            prefix: handle.prefix().to_owned(),
        },
    }
}

fn admin_guard(guard: GuardKind) -> Result<GuardKind> {
    match guard {
        GuardKind::Idempotency | GuardKind::Lock | GuardKind::RateLimit => Ok(guard),
        _ => Err(Error::Config(format!(
            "the operator's tools read idempotency records, locks and rate limits; `{}` keys \
             are not among them",
            guard.as_str()
        ))),
    }
}

/// The key of `guard` for the rendered template `key` in `scope`, by the guards' own rules.
pub(crate) fn template(
    handle: &Redguard,
    guard: GuardKind,
    scope: &str,
    key: &str,
) -> Result<AdminKey> {
    let guard = admin_guard(guard)?;
    let body = KeyBuilder::new().text(key).finish()?;
    Ok(AdminKey {
        guard,
        base: handle.key(guard, scope, &body)?,
        lock_kind: None,
    })
}

/// A full key as stored, refused unless it is one redguard writes under the handle's prefix.
pub(crate) fn raw(handle: &Redguard, raw: &str) -> Result<AdminKey> {
    let parse = || -> Option<(GuardKind, &str, &str)> {
        let rest = raw.strip_prefix(handle.prefix())?.strip_prefix(':')?;
        let (guard, rest) = rest.split_once(':')?;
        let guard = [
            GuardKind::Idempotency,
            GuardKind::Lock,
            GuardKind::RateLimit,
            GuardKind::Token,
        ]
        .into_iter()
        .find(|g| g.as_str() == guard)?;
        let close = rest.find('}')?;
        let inside = rest.strip_prefix('{')?.get(..close - 1)?;
        Some((guard, inside, &rest[close + 1..]))
    };
    let (guard, inside, suffix) = parse().ok_or_else(|| foreign(handle))?;
    let guard = admin_guard(guard)?;
    // The inside of the hash tag is a scope and a rendered template: the text charset of
    // key.rs, no braces.
    check_name("key", inside, MAX_KEY_LEN).map_err(|_| foreign(handle))?;
    let lock_kind = match (guard, suffix.strip_prefix(':')) {
        (_, None) if suffix.is_empty() => None,
        (GuardKind::RateLimit, Some("block" | "quota" | "deny")) => None,
        // A scope's tally of the keys it admitted and refused most (`rate/top.rs`).
        (GuardKind::RateLimit, Some(tally)) if tally.starts_with("top:") => None,
        (GuardKind::Lock, Some(suffix)) => {
            let (first, rest) = suffix.split_once(':').unwrap_or((suffix, ""));
            let kind = LockKindName::ALL
                .into_iter()
                .find(|k| k.suffix() == Some(first));
            match kind {
                Some(kind) if rest.is_empty() || LOCK_COMPANIONS.contains(&rest) => Some(kind),
                None if rest.is_empty() && LOCK_COMPANIONS.contains(&first) => {
                    Some(LockKindName::Exclusive)
                }
                _ => return Err(foreign(handle)),
            }
        }
        _ => return Err(foreign(handle)),
    };
    let base_len = raw.len() - suffix.len();
    Ok(AdminKey {
        guard,
        base: Key::stored(&raw[..base_len]),
        lock_kind,
    })
}
