//! Quota overrides: the rate and burst of one rate-limit key, changed at run time by an
//! operator and shared by every instance ([guide](crate::guide::rate_limits), *Quotas changed at run time*).
//!
//! An override lives at the limit key's `:quota` companion, inside its hash tag, so the
//! script deciding the limit reads it in the same call (one more `GET`, no round trip), on a
//! single node, a Sentinel master and a Cluster alike; every instance's next call sees it.
//!
//! A key ending in `*` names a key prefix (`tenant:*`: every key of the scope starting with
//! `tenant:`; `*` alone: the whole scope). Precedence: the exact key's override, else the
//! longest prefix's, else the code. Prefix overrides live in one hash per handle prefix
//! (`<prefix>:rate:quota-prefixes`, at most [`MAX_PREFIX_OVERRIDES`] fields, each with its TTL
//! or permanent) that the deciding script reads in the same call on a single node and a
//! Sentinel master (one `HGETALL` per call). On a Cluster that hash is in another slot than
//! the keys, so no script can read it with them: setting a prefix override there is refused
//! (set per-key overrides instead).
//!
//! Refused before anything is written: a rate or burst outside the grammar's bounds
//! ([`Quota::new`]), a TTL outside 1 s to 365 days, a key that breaks the guards' key rules,
//! and a scope no rate limit uses — one with no rate-limit key (state, penalty or override)
//! in the store, found by a bounded `SCAN`. That check is also what keeps a service's own
//! credential out: `SCAN` is among the operator's grants, not the services' (the guide's
//! *Operations*), so a caller without them is refused by Redis (`NOPERM`) before the write.

use serde::Serialize;

use super::Admin;
use crate::error::{Error, Result};
use crate::key::{GuardKind, Key, KeyBuilder};
use crate::store::StoreKind;
use crate::store::admin::Raw;
use crate::values::{MAX_PREFIX_OVERRIDES, QUOTA_SUFFIX, Quota, QuotaTtl, prefix_hash};

/// What an operator's `key` names: one limit's key, or a key prefix.
enum Target {
    Key(Key),
    /// `field`: the state-key prefix (`<prefix>:rate:{<scope>:<body prefix>`) in `hash`.
    Prefix {
        hash: Key,
        field: String,
    },
}

impl Target {
    /// How listings and logs show it: the state key, or the prefix and `*`.
    fn shown(&self) -> String {
        match self {
            Target::Key(key) => key.to_string(),
            Target::Prefix { field, .. } => format!("{field}*"),
        }
    }
}

/// One override as stored, for [`Admin::quota_get`] and [`Admin::quota_list`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct QuotaEntry {
    /// The limit's state key the override applies to.
    pub key: String,
    /// The rate, as the grammar writes it (`100/1s`); `None` when the value is not one.
    pub rate: Option<String>,
    /// The burst (bucket algorithms; a window algorithm admits the rate's count).
    pub burst: Option<u64>,
    /// Time left until the store removes it, in ms; `None`: permanent.
    pub expires_in_ms: Option<u64>,
    /// Why the stored value is not an override (the limits ignore it), if it is not.
    pub problem: Option<String>,
}

/// What [`Admin::quota_list`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct QuotaList {
    /// The overrides, by key.
    pub overrides: Vec<QuotaEntry>,
    /// The scan stopped at its limit: more may exist.
    pub truncated: bool,
}

impl Admin {
    /// Sets the override of the rate limit at the rendered key `key` in `scope` (the key
    /// `#[rate_limit(key = "tenant:{id}", scope = "api")]` uses for id `acme` is
    /// `"tenant:acme"` in `api`), for `ttl` or explicitly for good. Every instance's next
    /// call on that key is decided with `quota`'s rate and burst. Logged at warn.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// use redguard::Redguard;
    /// use redguard::admin::{Admin, Quota, QuotaTtl};
    ///
    /// let rg = Redguard::memory();
    /// let tenant = || redguard::limiter("tenant:acme").scope("api").rate("1/min").on(&rg);
    /// tenant().check().await?;
    /// assert!(!tenant().decide().await?.allowed);
    ///
    /// let admin = Admin::new(rg.clone());
    /// let gold = Quota::new("100/s", Some(200))?;
    /// admin.quota_set("api", "tenant:acme", &gold, QuotaTtl::For(Duration::from_secs(3600))).await?;
    /// let d = tenant().decide().await?;
    /// assert!(d.allowed && d.limit == 200);
    ///
    /// assert!(admin.quota_clear("api", "tenant:acme").await?);
    /// assert_eq!(tenant().peek().await?.limit, 1); // the code's limit again
    /// # Ok(()) }
    /// ```
    pub async fn quota_set(
        &self,
        scope: &str,
        key: &str,
        quota: &Quota,
        ttl: QuotaTtl,
    ) -> Result<QuotaEntry> {
        let target = self.quota_target(scope, key)?;
        let ttl = ttl.check()?;
        match &target {
            Target::Key(state) => {
                self.scope_in_use(scope, state).await?;
                let at = state.companion(QUOTA_SUFFIX);
                self.handle
                    .store()
                    .admin_quota_set(&at, &quota.encode(), ttl)
                    .await?;
                // A local tier repeating this key's rejections forgets them: the new rate decides.
                self.forget_locally(state).await;
            }
            Target::Prefix { hash, field } => {
                self.scope_in_use(scope, &Key::stored(target.shown()))
                    .await?;
                self.handle
                    .store()
                    .admin_quota_prefix(
                        hash,
                        field,
                        Some(&quota.encode()),
                        ttl,
                        MAX_PREFIX_OVERRIDES,
                    )
                    .await?;
            }
        }
        tracing::warn!(
            key = %target.shown(),
            rate = %rate_text(quota),
            burst = quota.burst(),
            ttl_s = ttl.map(|t| t.as_secs()),
            "redguard admin: rate quota override set"
        );
        Ok(QuotaEntry {
            key: target.shown(),
            rate: Some(rate_text(quota)),
            burst: Some(quota.burst()),
            expires_in_ms: ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            problem: None,
        })
    }

    /// The override of the rate limit at `key` in `scope`, if one is set.
    pub async fn quota_get(&self, scope: &str, key: &str) -> Result<Option<QuotaEntry>> {
        match self.quota_target(scope, key)? {
            Target::Key(state) => self.read_quota(&state).await,
            Target::Prefix { hash, field } => Ok(self
                .read_prefixes(&hash, &field)
                .await?
                .into_iter()
                .find(|e| e.key.strip_suffix('*') == Some(field.as_str()))),
        }
    }

    /// The overrides of `scope`, found by `SCAN` among at most `limit` of its rate-limit keys
    /// (bounded as [`scan`](Admin::scan) is).
    pub async fn quota_list(&self, scope: &str, limit: usize) -> Result<QuotaList> {
        let prefix = self.scope_prefix(scope)?;
        let found = self.handle.store().admin_scan(&prefix, limit).await?;
        let mut overrides = Vec::new();
        let suffix = format!(":{QUOTA_SUFFIX}");
        for key in &found.keys {
            if let Some(state) = key.strip_suffix(&suffix)
                && let Some(entry) = self.read_quota(&Key::stored(state)).await?
            {
                overrides.push(entry);
            }
        }
        // Prefix overrides are not keys of the scope: listed from their hash (bounded).
        if let Some(hash) = self.prefix_hash(scope)? {
            overrides.extend(self.read_prefixes(&hash, &prefix).await?);
        }
        overrides.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(QuotaList {
            overrides,
            truncated: found.truncated,
        })
    }

    /// Removes the override of the rate limit at `key` in `scope`: the code's limit decides
    /// its next call. True when there was one. Logged at warn.
    pub async fn quota_clear(&self, scope: &str, key: &str) -> Result<bool> {
        let target = self.quota_target(scope, key)?;
        let deleted = match &target {
            Target::Key(state) => {
                let deleted = self
                    .handle
                    .store()
                    .admin_delete(&[state.companion(QUOTA_SUFFIX)])
                    .await?;
                self.forget_locally(state).await;
                deleted > 0
            }
            Target::Prefix { hash, field } => {
                self.handle
                    .store()
                    .admin_quota_prefix(hash, field, None, None, MAX_PREFIX_OVERRIDES)
                    .await?
            }
        };
        tracing::warn!(key = %target.shown(), deleted, "redguard admin: rate quota override cleared");
        Ok(deleted)
    }

    /// What `key` in `scope` names, by the guards' key rules: a state key, or (ending in
    /// `*`) a key prefix, refused on a Cluster.
    fn quota_target(&self, scope: &str, key: &str) -> Result<Target> {
        let Some(body_prefix) = key.strip_suffix('*') else {
            let body = KeyBuilder::new().text(key).finish()?;
            return Ok(Target::Key(self.handle.key(
                GuardKind::RateLimit,
                scope,
                &body,
            )?));
        };
        if !body_prefix.is_empty() {
            // The key rules of a key's text (no `*`, `{`, `}`, spaces, ...), so the prefix is
            // one that keys can start with.
            KeyBuilder::new().text(body_prefix).finish()?;
        }
        let Some(hash) = self.prefix_hash(scope)? else {
            return Err(Error::Config(format!(
                "`{key}`: overrides of a key prefix are not available on a Redis Cluster (the \
                 keys of a prefix are in many slots, and a script reads one); set one per key"
            )));
        };
        Ok(Target::Prefix {
            hash,
            field: format!("{}{body_prefix}", self.scope_prefix(scope)?),
        })
    }

    /// The handle's prefix-override hash, `None` on a Cluster.
    pub(super) fn prefix_hash(&self, scope: &str) -> Result<Option<Key>> {
        if self.handle.store().kind() == StoreKind::Cluster {
            return Ok(None);
        }
        let probe = self.handle.key(
            GuardKind::RateLimit,
            scope,
            &KeyBuilder::new().text("x").finish()?,
        )?;
        Ok(prefix_hash(&probe))
    }

    /// The prefix overrides in `hash` whose prefix starts with `start`.
    pub(super) async fn read_prefixes(&self, hash: &Key, start: &str) -> Result<Vec<QuotaEntry>> {
        let (now, fields) = self.handle.store().admin_quota_prefixes(hash).await?;
        let now_ms = u64::try_from(now.as_millis()).unwrap_or(u64::MAX);
        Ok(fields
            .into_iter()
            .filter(|(field, _)| field.starts_with(start))
            .map(|(field, value)| {
                let mut seen = QuotaEntry {
                    key: format!("{field}*"),
                    rate: None,
                    burst: None,
                    expires_in_ms: None,
                    problem: None,
                };
                let parsed = value
                    .split_once(' ')
                    .and_then(|(at, rest)| Some((at.parse::<u64>().ok()?, rest)));
                match parsed {
                    Some((at, stored)) => {
                        seen.expires_in_ms = (at != 0).then(|| at.saturating_sub(now_ms));
                        match Quota::decode(stored) {
                            Ok(quota) => {
                                seen.rate = Some(rate_text(&quota));
                                seen.burst = Some(quota.burst());
                            }
                            Err(why) => seen.problem = Some(why),
                        }
                    }
                    None => seen.problem = Some(format!("{value:?} is not a prefix override")),
                }
                seen
            })
            .collect())
    }

    /// `<prefix>:rate:{<scope>:`: what every rate-limit key of `scope` starts with.
    pub(super) fn scope_prefix(&self, scope: &str) -> Result<String> {
        let probe = self.handle.key(
            GuardKind::RateLimit,
            scope,
            &KeyBuilder::new().text("x").finish()?,
        )?;
        let full = probe.as_str();
        Ok(full[..full.len() - "x}".len()].to_owned())
    }

    /// Refuses a scope in which the store holds no rate-limit key (a typo, or a scope no
    /// guard uses). One bounded scan looks for any key of the scope; it is also what a
    /// services' ACL user may not run (`SCAN` is one of the operator's grants), so it comes
    /// first. A scan that ran out of budget on a large keyspace proves nothing either way: then
    /// the key's own state proves the scope, and without it the override is set with a warning
    /// rather than refused, since an operator raising a quota during an incident must not be
    /// blocked by the store's size (an override of an unused scope only sits there until its
    /// TTL).
    async fn scope_in_use(&self, scope: &str, state: &Key) -> Result<()> {
        let prefix = self.scope_prefix(scope)?;
        let found = self.handle.store().admin_scan(&prefix, 1).await?;
        if !found.keys.is_empty() {
            return Ok(());
        }
        if found.truncated {
            let own = self
                .handle
                .store()
                .admin_read(std::slice::from_ref(state))
                .await?;
            if !own.entries.iter().any(|e| e.value != Raw::Absent) {
                tracing::warn!(
                    scope,
                    %state,
                    "could not confirm that a rate limit of this scope is in the store (the \
                     keyspace is larger than one bounded scan); setting the override anyway"
                );
            }
            return Ok(());
        }
        Err(Error::Config(format!(
            "no rate limit of scope `{scope}` is in the store (nothing starts with \
             `{prefix}`), so no guard would read an override at {state}; check the scope \
             (the fn's path, or its `scope = \"..\"`) and set it once the limit has run"
        )))
    }

    async fn read_quota(&self, state: &Key) -> Result<Option<QuotaEntry>> {
        let at = state.companion(QUOTA_SUFFIX);
        let snapshot = self
            .handle
            .store()
            .admin_read(std::slice::from_ref(&at))
            .await?;
        let Some(entry) = snapshot.entries.into_iter().next() else {
            return Ok(None);
        };
        let now_ms = u64::try_from(snapshot.now.as_millis()).unwrap_or(u64::MAX);
        let expires_in_ms = entry.expires_at_ms.map(|at| at.saturating_sub(now_ms));
        let mut seen = QuotaEntry {
            key: state.to_string(),
            rate: None,
            burst: None,
            expires_in_ms,
            problem: None,
        };
        match entry.value {
            Raw::Absent => return Ok(None),
            Raw::Text(text) => match Quota::decode(&text) {
                Ok(quota) => {
                    seen.rate = Some(rate_text(&quota));
                    seen.burst = Some(quota.burst());
                }
                Err(why) => seen.problem = Some(why),
            },
            _ => seen.problem = Some("not a string: not a quota override".to_owned()),
        }
        Ok(Some(seen))
    }
}

/// `100/1s`, `5/60s`, `3/1500ms`: the count per the period, in a form the grammar reads.
fn rate_text(quota: &Quota) -> String {
    let period = quota.rate().period();
    let count = quota.rate().count();
    if period.subsec_millis() == 0 && period.subsec_nanos() == 0 {
        format!("{count}/{}s", period.as_secs())
    } else {
        format!("{count}/{}ms", period.as_millis())
    }
}
