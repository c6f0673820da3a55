//! Deny lists of rate limits: keys (`tenant:acme`), key prefixes (`tenant:*`) or, for IP
//! keys, networks (`10.0.0.0/8`, `2001:db8::/32`) of one scope whose calls are refused
//! outright ([`Error::Denied`], HTTP 403) before their limit is read, on every instance's
//! next call; each with a TTL (1 s to 365 days) and a reason of at most
//! [`MAX_DENY_REASON`](crate::admin::MAX_DENY_REASON) bytes.
//!
//! An exact key's entry is its limit's `:deny` companion, in the limit's own hash tag, which
//! the deciding script reads in the same call (`values/deny.rs`): available on a Redis
//! Cluster too, and as many as there are keys. It always has a TTL: one added as
//! [`QuotaTtl::Permanent`] is kept 365 days, the longest any entry is (add it again to
//! renew it). Prefixes and networks live in the handle's pattern hash, at most
//! [`MAX_DENY_PATTERNS`] of them per handle prefix, with a TTL or permanent; they are not
//! available on a Redis Cluster, where that hash is in another slot than the keys.

use serde::Serialize;

use super::Admin;
use crate::error::{Error, Result};
use crate::key::{GuardKind, Key, KeyBuilder};
use crate::store::StoreKind;
use crate::store::admin::Raw;
use crate::values::{
    DENY_SUFFIX, DenyPattern, MAX_DENY_PATTERNS, MAX_QUOTA_TTL, QuotaTtl, deny_hash,
};

/// The most keys of a scope [`Admin::deny_list`] looks through for exact entries.
const DENY_SCAN_LIMIT: usize = 100_000;

/// One deny entry as stored, for [`Admin::deny_list`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DenyEntry {
    /// The entry as written (`tenant:acme`, `tenant:*`, `10.0.0.0/8`).
    pub entry: String,
    /// The reason given, if any.
    pub reason: Option<String>,
    /// Time left until it lapses, in ms; `None`: permanent (a prefix or a network: an exact
    /// key's entry always lapses).
    pub expires_in_ms: Option<u64>,
}

impl Admin {
    /// Denies `entry` (a rendered key, a `prefix*` or a CIDR) in the rate limits of `scope`,
    /// for `ttl` or explicitly for good: every instance's next call on a matching key is
    /// refused with [`Error::Denied`] before its limit is read (it consumes nothing). A
    /// second add of the same entry replaces it. An exact key's entry is kept at most 365
    /// days, [`QuotaTtl::Permanent`] included; prefixes and networks are refused on a Redis
    /// Cluster. Logged at warn.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// use redguard::{Error, Redguard};
    /// use redguard::admin::{Admin, QuotaTtl};
    ///
    /// let rg = Redguard::memory();
    /// let tenant = |id: &str| redguard::limiter(format!("tenant:{id}")).scope("api").rate("10/s").on(&rg);
    /// tenant("acme").check().await?;
    ///
    /// let admin = Admin::new(rg.clone());
    /// let hour = QuotaTtl::For(Duration::from_secs(3600));
    /// admin.deny_add("api", "tenant:ac*", Some("abuse"), hour).await?;
    /// assert!(matches!(tenant("acme").check().await, Err(Error::Denied { .. })));
    /// assert!(tenant("other").check().await.is_ok());
    ///
    /// assert!(admin.deny_remove("api", "tenant:ac*").await?);
    /// assert!(tenant("acme").check().await.is_ok());
    /// # Ok(()) }
    /// ```
    pub async fn deny_add(
        &self,
        scope: &str,
        entry: &str,
        reason: Option<&str>,
        ttl: QuotaTtl,
    ) -> Result<DenyEntry> {
        let pattern = DenyPattern::parse(entry)?;
        let reason = reason.unwrap_or("");
        crate::values::check_reason(reason)?;
        let ttl = ttl.check()?;
        let scope_prefix = self.deny_scope(scope)?;
        self.deny_scope_in_use(scope, &scope_prefix).await?;
        let ttl = match &pattern {
            DenyPattern::Key(key) => {
                let ttl = ttl.unwrap_or(MAX_QUOTA_TTL);
                let at = self.deny_companion(scope, key)?;
                // The expiry in the value too, in the pattern entries' format: the script
                // reads both with one parser. The store's clock, not this host's.
                let now = self
                    .handle
                    .store()
                    .admin_read(std::slice::from_ref(&at))
                    .await?
                    .now;
                let at_ms = now.saturating_add(ttl).as_millis();
                self.handle
                    .store()
                    .admin_quota_set(&at, &format!("{at_ms} x {reason}"), Some(ttl))
                    .await?;
                Some(ttl)
            }
            _ => {
                let hash = self.deny_hash(scope)?;
                let field = format!("{scope_prefix}{}", pattern.text());
                let value = format!("{} {reason}", pattern.kind(scope_prefix.len()));
                self.handle
                    .store()
                    .admin_quota_prefix(&hash, &field, Some(&value), ttl, MAX_DENY_PATTERNS)
                    .await
                    .map_err(|err| match err {
                        Error::Config(_) => Error::Config(format!(
                            "{MAX_DENY_PATTERNS} prefix and network deny entries are set \
                             already (the most a handle's prefix holds, since every \
                             rate-limit call walks them): remove one first, or deny a shorter \
                             prefix or a wider network"
                        )),
                        other => other,
                    })?;
                ttl
            }
        };
        tracing::warn!(
            scope,
            entry = %pattern.text(),
            reason,
            ttl_s = ttl.map(|t| t.as_secs()),
            "redguard admin: rate-limit deny entry added"
        );
        Ok(DenyEntry {
            entry: pattern.text(),
            reason: (!reason.is_empty()).then(|| reason.to_owned()),
            expires_in_ms: ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        })
    }

    /// The live deny entries of `scope`, by entry: exact keys found by `SCAN` among at most
    /// 100,000 keys of the scope (bounded as [`scan`](Admin::scan) is: a larger scope may
    /// have more, logged), prefixes and networks read from their hash (off a Cluster).
    pub async fn deny_list(&self, scope: &str) -> Result<Vec<DenyEntry>> {
        let scope_prefix = self.deny_scope(scope)?;
        let store = self.handle.store();
        let found = store.admin_scan(&scope_prefix, DENY_SCAN_LIMIT).await?;
        if found.truncated {
            tracing::warn!(
                scope,
                limit = DENY_SCAN_LIMIT,
                "redguard admin: deny list of a scope larger than one bounded scan: exact-key \
                 entries may be missing"
            );
        }
        let suffix = format!("}}:{DENY_SUFFIX}");
        let companions: Vec<Key> = found
            .keys
            .iter()
            .filter(|key| key.ends_with(&suffix))
            .map(|key| Key::stored(key.as_str()))
            .collect();
        let mut entries = Vec::new();
        // One read per key: a Cluster holds the companions in many slots.
        for at in &companions {
            entries.extend(self.exact_entry(&scope_prefix, at).await?);
        }
        entries.extend(
            self.pattern_entries(scope, &scope_prefix)
                .await?
                .into_iter()
                .map(|(entry, ..)| entry),
        );
        entries.sort_by(|a, b| a.entry.cmp(&b.entry));
        Ok(entries)
    }

    /// Removes `entry` (as added, or as [`deny_list`](Admin::deny_list) shows it) from the
    /// deny list of `scope`. True when it was there. Logged at warn.
    pub async fn deny_remove(&self, scope: &str, entry: &str) -> Result<bool> {
        let pattern = DenyPattern::parse(entry)?;
        let scope_prefix = self.deny_scope(scope)?;
        // Needs the operator's grant (`SCAN`), as an add does: a service's own credential
        // cannot lift an entry through these tools. The scope may be idle by now, so its
        // being empty refuses nothing here.
        self.handle.store().admin_scan(&scope_prefix, 1).await?;
        let removed = match &pattern {
            DenyPattern::Key(key) => {
                let at = self.deny_companion(scope, key)?;
                self.handle.store().admin_delete(&[at]).await? > 0
            }
            _ => {
                let hash = self.deny_hash(scope)?;
                let field = format!("{scope_prefix}{}", pattern.text());
                self.handle
                    .store()
                    .admin_quota_prefix(&hash, &field, None, None, MAX_DENY_PATTERNS)
                    .await?
            }
        };
        // This instance stops repeating the denials it remembers for outages (another
        // instance does once the store decides the key again).
        self.handle.state().denials.clear();
        tracing::warn!(scope, entry = %pattern.text(), removed, "redguard admin: rate-limit deny entry removed");
        Ok(removed)
    }

    /// The entry that refuses the next call on the rendered key `key` of `scope`, if one
    /// does: its own exact entry first, else the first live prefix or network that matches,
    /// as the deciding script looks (`deny.lua`).
    pub(super) async fn deny_applying(&self, scope: &str, key: &str) -> Result<Option<DenyEntry>> {
        let scope_prefix = self.deny_scope(scope)?;
        let state = self.deny_state(scope, key)?;
        if let Some(exact) = self
            .exact_entry(&scope_prefix, &state.companion(DENY_SUFFIX))
            .await?
        {
            return Ok(Some(exact));
        }
        Ok(self
            .pattern_entries(scope, &scope_prefix)
            .await?
            .into_iter()
            .find(|(entry, field, kind)| {
                entry.expires_in_ms != Some(0)
                    && crate::values::denies(field, kind, state.as_str()).is_some()
            })
            .map(|(entry, ..)| entry))
    }

    /// The live exact-key entry stored at the companion `at`, if any.
    async fn exact_entry(&self, scope_prefix: &str, at: &Key) -> Result<Option<DenyEntry>> {
        let snapshot = self
            .handle
            .store()
            .admin_read(std::slice::from_ref(at))
            .await?;
        let now_ms = u64::try_from(snapshot.now.as_millis()).unwrap_or(u64::MAX);
        let Some(read) = snapshot.entries.into_iter().next() else {
            return Ok(None);
        };
        let Raw::Text(value) = read.value else {
            return Ok(None);
        };
        let Some(reason) = crate::values::exact_reason(&value, now_ms) else {
            return Ok(None);
        };
        let suffix_len = DENY_SUFFIX.len() + "}:".len();
        let Some(key) = at
            .as_str()
            .get(scope_prefix.len()..at.as_str().len() - suffix_len)
        else {
            return Ok(None);
        };
        Ok(Some(DenyEntry {
            entry: key.to_owned(),
            reason: (!reason.is_empty()).then(|| reason.to_owned()),
            expires_in_ms: read.expires_at_ms.map(|at| at.saturating_sub(now_ms)),
        }))
    }

    /// The prefix and network entries of `scope` (none on a Cluster), each with its field and
    /// its kind and reason as `values::denies` reads them.
    async fn pattern_entries(
        &self,
        scope: &str,
        scope_prefix: &str,
    ) -> Result<Vec<(DenyEntry, String, String)>> {
        let store = self.handle.store();
        if store.kind() == StoreKind::Cluster {
            return Ok(Vec::new());
        }
        let (now, fields) = store.admin_quota_prefixes(&self.deny_hash(scope)?).await?;
        let now_ms = u64::try_from(now.as_millis()).unwrap_or(u64::MAX);
        Ok(fields
            .into_iter()
            .filter_map(|(field, value)| {
                let entry = field.strip_prefix(scope_prefix)?.to_owned();
                let (at, rest) = value.split_once(' ')?;
                let at: u64 = at.parse().ok()?;
                let reason = rest.split_once(' ').map_or("", |(_, r)| r);
                let entry = DenyEntry {
                    entry,
                    reason: (!reason.is_empty()).then(|| reason.to_owned()),
                    expires_in_ms: (at != 0).then(|| at.saturating_sub(now_ms)),
                };
                Some((entry, field, rest.to_owned()))
            })
            .collect())
    }

    /// `<prefix>:rate:{<scope>:`, the start of every state key of `scope`.
    fn deny_scope(&self, scope: &str) -> Result<String> {
        let probe = self.deny_state(scope, "x")?;
        let full = probe.as_str();
        Ok(full[..full.len() - "x}".len()].to_owned())
    }

    /// The state key of `key` in `scope`'s rate limits.
    fn deny_state(&self, scope: &str, key: &str) -> Result<Key> {
        self.handle.key(
            GuardKind::RateLimit,
            scope,
            &KeyBuilder::new().text(key).finish()?,
        )
    }

    /// Where the exact-key entry of `key` in `scope` lives: its limit's `:deny` companion.
    fn deny_companion(&self, scope: &str, key: &str) -> Result<Key> {
        Ok(self.deny_state(scope, key)?.companion(DENY_SUFFIX))
    }

    /// The handle's hash of prefix and network entries; refused on a Cluster.
    fn deny_hash(&self, scope: &str) -> Result<Key> {
        if self.handle.store().kind() == StoreKind::Cluster {
            return Err(Error::Config(
                "prefix and network deny entries are not available on a Redis Cluster (one \
                 names keys in every slot, and the deciding script reads the limit's slot \
                 only); deny the keys one by one (exact keys are kept beside their limit), or \
                 lower their quota (`redguard quota set`)"
                    .to_owned(),
            ));
        }
        let probe = self.deny_state(scope, "x")?;
        deny_hash(&probe).ok_or_else(|| {
            Error::Config(format!("`{probe}` is not a rate-limit key: no deny list"))
        })
    }

    /// As for overrides: a scope no limit uses is a typo (and the `SCAN` keeps a service's
    /// own credential out); a keyspace too large for one bounded scan is let through.
    async fn deny_scope_in_use(&self, scope: &str, prefix: &str) -> Result<()> {
        let found = self.handle.store().admin_scan(prefix, 1).await?;
        if !found.keys.is_empty() || found.truncated {
            return Ok(());
        }
        Err(Error::Config(format!(
            "no rate limit of scope `{scope}` is in the store (nothing starts with \
             `{prefix}`), so no guard would read a deny entry of it; check the scope (the \
             fn's path, or its `scope = \"..\"`)"
        )))
    }
}
