//! Store operations of the operator's tools (`redguard::admin`): read guard state as it is
//! stored, list keys, and the few repairs an on-call engineer needs.
//!
//! Reads return the state *as Redis holds it* ([`Raw`]): strings, hashes and sorted sets with
//! their expiry. The in-memory store answers in the same shapes, so one decoder
//! (`admin::decode`) serves both, and what it shows for a Redis key is what the scripts read.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::key::Key;

/// At most this many members of a sorted set are returned by a read (the count is exact).
pub const SNAPSHOT_MEMBERS: usize = 100;

/// Operator operations of a [`Store`](super::Store). Keys passed here were checked by
/// `redguard::admin` to lie under the handle's prefix.
#[async_trait]
pub trait AdminOps {
    /// Reads `keys` (all in one hash tag: one Redis Cluster slot) in one atomic step, with
    /// the store's time.
    async fn admin_read(&self, keys: &[Key]) -> Result<Snapshot>;

    /// Keys starting with `prefix`, at most `limit` of them, found without blocking the
    /// store (`SCAN`, never `KEYS`; on a Cluster, on every master). `truncated` when more
    /// may exist.
    async fn admin_scan(&self, prefix: &str, limit: usize) -> Result<ScanKeys>;

    /// Frees the lock at `lock` from the holders [`ForceUnlock::owners`] names (a semaphore's
    /// or read lock's slots, or the lock if one of them holds it), raises its fencing
    /// counter at `fence` so every token handed out before is stale, and wakes waiters.
    /// `readers` is the readers' set of a read/write lock, freed too.
    async fn admin_unlock(&self, unlock: ForceUnlock<'_>) -> Result<Unlocked>;

    /// Deletes `keys` (one hash tag); returns how many existed.
    async fn admin_delete(&self, keys: &[Key]) -> Result<u64>;

    /// Tells every handle on this store that the rate limit at `key` was reset or refunded,
    /// so their local tiers forget it ([`Store::rate_reset_after`](crate::store::Store::rate_reset_after)).
    /// The default does nothing: a store shared only in-process has no other tiers.
    async fn admin_announce_reset(&self, _key: &Key) -> Result<()> {
        Ok(())
    }

    /// Deletes the idempotency record at `key` if every one of `fields` still has the value
    /// [`admin_read`](AdminOps::admin_read) saw; true when deleted.
    async fn admin_forget(&self, key: &Key, fields: &[(String, String)]) -> Result<bool>;

    /// Gives back up to `units` units charged to the rate-limit state at `key`; returns the
    /// units given back (a sliding log gives back whole calls only).
    async fn admin_refund(&self, key: &Key, units: u64) -> Result<u64>;

    /// Writes the quota override `value` at `key` (a rate limit's `:quota` companion), for
    /// `ttl` or, with none, until deleted; replaces one that was there.
    async fn admin_quota_set(&self, key: &Key, value: &str, ttl: Option<Duration>) -> Result<()>;

    /// Sets (`value`) or removes (`None`) the prefix override `field` (a state-key prefix) in
    /// the prefix-override hash `hash`, for `ttl` or, with none, until removed; true when one
    /// was there. A new field beyond `max` is refused ([`Error::Config`](crate::Error::Config)),
    /// nothing written.
    async fn admin_quota_prefix(
        &self,
        hash: &Key,
        field: &str,
        value: Option<&str>,
        ttl: Option<Duration>,
        max: usize,
    ) -> Result<bool>;

    /// The live prefix overrides in `hash`: the store's time, and each field with its stored
    /// value (`<expires_at_ms, 0: permanent> <override>`).
    async fn admin_quota_prefixes(&self, hash: &Key) -> Result<(Duration, Vec<(String, String)>)>;
}

/// The refusal of a prefix override beyond the bound.
pub(crate) fn prefixes_full(max: usize) -> crate::Error {
    crate::Error::Config(format!(
        "{max} prefix overrides are set already (the most a handle's prefix holds, since every \
         rate-limit call reads them all): clear one first, or set per-key overrides"
    ))
}

/// What [`AdminOps::admin_read`] saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The store's time, since the Unix epoch.
    pub now: Duration,
    /// One entry per key asked for, in order.
    pub entries: Vec<RawEntry>,
}

/// One key as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RawEntry {
    /// The key.
    pub key: String,
    /// Its value.
    pub value: Raw,
    /// When it expires, in ms since the Unix epoch (`PEXPIRETIME`); `None` when absent or
    /// without a TTL.
    pub expires_at_ms: Option<u64>,
}

/// A stored value, in Redis's types.
#[derive(Debug, Clone, PartialEq)]
pub enum Raw {
    /// Nothing at the key.
    Absent,
    /// A string.
    Text(String),
    /// A hash's fields, except a field `result`, of which only the length is kept.
    Hash {
        /// The fields and values.
        fields: Vec<(String, String)>,
        /// Length in bytes of the `result` field, when present.
        result_len: Option<u64>,
    },
    /// A sorted set: its size and up to [`SNAPSHOT_MEMBERS`] members, lowest score first.
    ZSet {
        /// Number of members.
        card: u64,
        /// Members and scores.
        members: Vec<(String, f64)>,
    },
    /// A type redguard never writes (its name).
    Other(String),
}

/// What [`AdminOps::admin_scan`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScanKeys {
    /// Keys found (each once).
    pub keys: Vec<String>,
    /// More keys may match: the limit was reached.
    pub truncated: bool,
}

/// A forced release: what [`AdminOps::admin_unlock`] takes.
#[derive(Debug, Clone, Copy)]
pub struct ForceUnlock<'a> {
    /// The lock: a hash (exclusive, fair, the writer of a read/write lock) or a sorted set
    /// (semaphore).
    pub lock: &'a Key,
    /// Its fencing counter.
    pub fence: &'a Key,
    /// The readers of a read/write lock.
    pub readers: Option<&'a Key>,
    /// The holders to free, as the caller read them (an owner of `""` is a lock kept for
    /// `hold_at_least`): one that took the lock since is left alone.
    pub owners: &'a [&'a str],
    /// Whether `lock` is a semaphore's sorted set.
    pub semaphore: bool,
}

/// What [`AdminOps::admin_unlock`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unlocked {
    /// Holders removed (0: nothing was held; nothing changed).
    pub removed: u64,
    /// The fencing counter after the release: above every token handed out before.
    pub fence: Option<u64>,
}
