//! Quota overrides: the rate and burst of one rate-limit key, changed at run time by an
//! operator and shared by every instance ([guide](crate::guide::rate_limits), *Quotas changed at run time*).
//!
//! An override lives at the limit key's `:quota` companion, inside its hash tag, so the
//! script deciding the limit reads it in the same call (one more `GET`, no round trip), on a
//! single node, a Sentinel master and a Cluster alike; every instance's next call sees it.
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
use crate::store::admin::Raw;
use crate::values::{QUOTA_SUFFIX, Quota, QuotaTtl};

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
        let state = self.quota_key(scope, key)?;
        let ttl = ttl.check()?;
        self.scope_in_use(scope, &state).await?;
        let at = state.companion(QUOTA_SUFFIX);
        self.handle
            .store()
            .admin_quota_set(&at, &quota.encode(), ttl)
            .await?;
        // A local tier repeating this key's rejections forgets them: the new rate decides.
        self.forget_locally(&state).await;
        tracing::warn!(
            key = %state,
            rate = %rate_text(quota),
            burst = quota.burst(),
            ttl_s = ttl.map(|t| t.as_secs()),
            "redguard admin: rate quota override set"
        );
        Ok(QuotaEntry {
            key: state.to_string(),
            rate: Some(rate_text(quota)),
            burst: Some(quota.burst()),
            expires_in_ms: ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            problem: None,
        })
    }

    /// The override of the rate limit at `key` in `scope`, if one is set.
    pub async fn quota_get(&self, scope: &str, key: &str) -> Result<Option<QuotaEntry>> {
        let state = self.quota_key(scope, key)?;
        self.read_quota(&state).await
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
        overrides.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(QuotaList {
            overrides,
            truncated: found.truncated,
        })
    }

    /// Removes the override of the rate limit at `key` in `scope`: the code's limit decides
    /// its next call. True when there was one. Logged at warn.
    pub async fn quota_clear(&self, scope: &str, key: &str) -> Result<bool> {
        let state = self.quota_key(scope, key)?;
        let deleted = self
            .handle
            .store()
            .admin_delete(&[state.companion(QUOTA_SUFFIX)])
            .await?;
        self.forget_locally(&state).await;
        tracing::warn!(key = %state, deleted, "redguard admin: rate quota override cleared");
        Ok(deleted > 0)
    }

    /// The state key of `key` in `scope`, by the guards' key rules.
    fn quota_key(&self, scope: &str, key: &str) -> Result<Key> {
        if key.ends_with('*') {
            return Err(Error::Config(format!(
                "`{key}`: overrides of a key prefix are not supported; set one per key"
            )));
        }
        let body = KeyBuilder::new().text(key).finish()?;
        self.handle.key(GuardKind::RateLimit, scope, &body)
    }

    /// `<prefix>:rate:{<scope>:`: what every rate-limit key of `scope` starts with.
    fn scope_prefix(&self, scope: &str) -> Result<String> {
        let probe = self.handle.key(
            GuardKind::RateLimit,
            scope,
            &KeyBuilder::new().text("x").finish()?,
        )?;
        let full = probe.as_str();
        Ok(full[..full.len() - "x}".len()].to_owned())
    }

    /// Refuses a scope in which the store holds no rate-limit key (a typo, or a scope no
    /// guard uses).
    async fn scope_in_use(&self, scope: &str, state: &Key) -> Result<()> {
        let prefix = self.scope_prefix(scope)?;
        let found = self.handle.store().admin_scan(&prefix, 1).await?;
        if found.keys.is_empty() {
            return Err(Error::Config(format!(
                "no rate limit of scope `{scope}` is in the store (nothing starts with \
                 `{prefix}`), so no guard would read an override at {state}; check the scope \
                 (the fn's path, or its `scope = \"..\"`) and set it once the limit has run"
            )));
        }
        Ok(())
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
