//! Deny lists of rate limits: keys (`tenant:acme`), key prefixes (`tenant:*`) or, for IP
//! keys, networks (`10.0.0.0/8`, `2001:db8::/32`) of one scope whose calls are refused
//! outright ([`Error::Denied`], HTTP 403) before their limit is read, on every instance's
//! next call. Stored in the handle's deny hashes, which the deciding script reads in the
//! same call as the limit (`values/deny.rs`); not available on a Redis Cluster, where those
//! hashes are in other slots than the keys. At most [`MAX_DENY_KEYS`] exact keys and
//! [`MAX_DENY_PATTERNS`] prefixes and networks per handle prefix, each with a TTL (1 s to 365 days) or explicitly permanent, and a reason of at most
//! [`MAX_DENY_REASON`](crate::admin::MAX_DENY_REASON) bytes.

use serde::Serialize;

use super::Admin;
use crate::error::{Error, Result};
use crate::key::{GuardKind, Key, KeyBuilder};
use crate::store::StoreKind;
use crate::values::{DenyPattern, MAX_DENY_KEYS, MAX_DENY_PATTERNS, QuotaTtl, deny_hashes};

/// One deny entry as stored, for [`Admin::deny_list`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DenyEntry {
    /// The entry as written (`tenant:acme`, `tenant:*`, `10.0.0.0/8`).
    pub entry: String,
    /// The reason given, if any.
    pub reason: Option<String>,
    /// Time left until it lapses, in ms; `None`: permanent.
    pub expires_in_ms: Option<u64>,
}

impl Admin {
    /// Denies `entry` (a rendered key, a `prefix*` or a CIDR) in the rate limits of `scope`,
    /// for `ttl` or explicitly for good: every instance's next call on a matching key is
    /// refused with [`Error::Denied`] before its limit is read (it consumes nothing). A
    /// second add of the same entry replaces it. Logged at warn.
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
        let (hashes, scope_prefix) = self.deny_target(scope)?;
        self.deny_scope_in_use(scope, &scope_prefix).await?;
        let field = format!("{scope_prefix}{}", pattern.text());
        let value = format!("{} {reason}", pattern.kind(scope_prefix.len()));
        let (hash, max) = pick(&hashes, &pattern);
        self.handle
            .store()
            .admin_quota_prefix(hash, &field, Some(&value), ttl, max)
            .await
            .map_err(|err| match err {
                Error::Config(_) if pattern.is_pattern() => Error::Config(format!(
                    "{max} prefix and network deny entries are set already (the most a \
                     handle's prefix holds, since every rate-limit call walks them): remove \
                     one first, or deny a shorter prefix or a wider network"
                )),
                Error::Config(_) => Error::Config(format!(
                    "{max} exact-key deny entries are set already (the most a handle's prefix \
                     holds): remove one first, or deny a prefix"
                )),
                other => other,
            })?;
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

    /// The live deny entries of `scope`, by entry.
    pub async fn deny_list(&self, scope: &str) -> Result<Vec<DenyEntry>> {
        let ((keys, patterns), scope_prefix) = self.deny_target(scope)?;
        let (now, mut fields) = self.handle.store().admin_quota_prefixes(&keys).await?;
        fields.extend(self.handle.store().admin_quota_prefixes(&patterns).await?.1);
        let now_ms = u64::try_from(now.as_millis()).unwrap_or(u64::MAX);
        let mut entries: Vec<DenyEntry> = fields
            .into_iter()
            .filter_map(|(field, value)| {
                let entry = field.strip_prefix(&scope_prefix)?.to_owned();
                let (at, rest) = value.split_once(' ')?;
                let at: u64 = at.parse().ok()?;
                let reason = rest.split_once(' ').map_or("", |(_, r)| r);
                Some(DenyEntry {
                    entry,
                    reason: (!reason.is_empty()).then(|| reason.to_owned()),
                    expires_in_ms: (at != 0).then(|| at.saturating_sub(now_ms)),
                })
            })
            .collect();
        entries.sort_by(|a, b| a.entry.cmp(&b.entry));
        Ok(entries)
    }

    /// Removes `entry` (as added, or as [`deny_list`](Admin::deny_list) shows it) from the
    /// deny list of `scope`. True when it was there. Logged at warn.
    pub async fn deny_remove(&self, scope: &str, entry: &str) -> Result<bool> {
        let pattern = DenyPattern::parse(entry)?;
        let (hashes, scope_prefix) = self.deny_target(scope)?;
        let field = format!("{scope_prefix}{}", pattern.text());
        let (hash, max) = pick(&hashes, &pattern);
        let removed = self
            .handle
            .store()
            .admin_quota_prefix(hash, &field, None, None, max)
            .await?;
        tracing::warn!(scope, entry = %pattern.text(), removed, "redguard admin: rate-limit deny entry removed");
        Ok(removed)
    }

    /// The handle's deny hashes (exact keys, patterns) and `<prefix>:rate:{<scope>:`;
    /// refused on a Cluster.
    fn deny_target(&self, scope: &str) -> Result<((Key, Key), String)> {
        if self.handle.store().kind() == StoreKind::Cluster {
            return Err(Error::Config(
                "deny lists are not available on a Redis Cluster (an entry names keys in many \
                 slots, and the deciding script reads one); lower the key's quota instead \
                 (`redguard quota set`)"
                    .to_owned(),
            ));
        }
        let probe = self.handle.key(
            GuardKind::RateLimit,
            scope,
            &KeyBuilder::new().text("x").finish()?,
        )?;
        let hashes = deny_hashes(&probe).ok_or_else(|| {
            Error::Config(format!("`{probe}` is not a rate-limit key: no deny list"))
        })?;
        let full = probe.as_str();
        Ok((hashes, full[..full.len() - "x}".len()].to_owned()))
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

/// The hash an entry is kept in, and that hash's bound.
fn pick<'a>((keys, patterns): &'a (Key, Key), pattern: &DenyPattern) -> (&'a Key, usize) {
    if pattern.is_pattern() {
        (patterns, MAX_DENY_PATTERNS)
    } else {
        (keys, MAX_DENY_KEYS)
    }
}
