//! Where one rate-limit key stands: the limit that decides its calls, the rule that set it
//! (the key's override, the longest prefix override, or the limit in the code), and what it
//! has used and has left — what support answers a customer with.

use serde::Serialize;

use super::decode::DecisionState;
use super::{Admin, DenyEntry, QuotaEntry};
use crate::error::{Error, Result};
use crate::key::GuardKind;
use crate::rate::Limit;

/// Which rule set the limit that decides a key's calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "rule")]
#[non_exhaustive]
pub enum LimitSource {
    /// The limit the caller gave: the one in the code, or the layer's per-request plan.
    Code,
    /// An override of a key prefix (`tenant:*`), the longest one that matches.
    Prefix {
        /// The prefix override as listed (`<prefix>:rate:{<scope>:tenant:*`).
        prefix: String,
    },
    /// The key's own override.
    Key,
}

/// What [`Admin::usage`] found for one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Usage {
    /// The limit's state key.
    pub key: String,
    /// The rule that set the limit in force.
    pub source: LimitSource,
    /// The rate in force (`100/s`).
    pub rate: String,
    /// The burst in force.
    pub burst: u64,
    /// Units charged and not yet drained, or counted in the window; `None`: nothing stored.
    pub used: Option<u64>,
    /// The decision the key's next call would get (peeked: nothing charged): remaining,
    /// reset and retry-after are the figures of a `429`'s headers.
    pub next: DecisionState,
    /// The deny entry that refuses the key's next call whatever `next` says (its own, or
    /// the first prefix or network that matches), if one does.
    pub denied: Option<DenyEntry>,
    /// Overrides that exist for the key but decide nothing (malformed: the code's limit
    /// applies), each with its problem.
    pub ignored: Vec<QuotaEntry>,
}

impl Admin {
    /// Where the rate limit at the rendered key `key` in `scope` stands, for a caller whose
    /// code (or plan) gives `limit`: the limit in force and which rule set it, by the rule the
    /// deciding script follows (the key's override, else the longest prefix's, else the
    /// code's); used, remaining and reset, from a peek of the next decision; and the deny
    /// entry that refuses it, if one does.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use redguard::admin::{Admin, LimitSource, Quota, QuotaTtl};
    /// use redguard::rate::{Algorithm, Limit, Rate};
    /// use redguard::Redguard;
    ///
    /// let rg = Redguard::memory();
    /// let tenant = || redguard::limiter("tenant:acme").scope("api").rate("10/min").on(&rg);
    /// tenant().check().await?;
    ///
    /// let admin = Admin::new(rg.clone());
    /// let code = Limit::new(Algorithm::Gcra, Rate::per_minute(10), None, 1, Default::default())?;
    /// let usage = admin.usage("api", "tenant:acme", &code).await?;
    /// assert_eq!((usage.source, usage.used, usage.next.remaining), (LimitSource::Code, Some(1), 8));
    ///
    /// admin.quota_set("api", "tenant:*", &Quota::new("100/min", None)?, QuotaTtl::Permanent).await?;
    /// let usage = admin.usage("api", "tenant:acme", &code).await?;
    /// assert!(matches!(usage.source, LimitSource::Prefix { .. }));
    /// assert_eq!((usage.rate.as_str(), usage.burst), ("100/60s", 100));
    ///
    /// admin.deny_add("api", "tenant:acme", Some("abuse"), QuotaTtl::For(std::time::Duration::from_secs(3600))).await?;
    /// let usage = admin.usage("api", "tenant:acme", &code).await?;
    /// assert_eq!(usage.denied.and_then(|d| d.reason).as_deref(), Some("abuse"));
    /// # Ok(()) }
    /// ```
    pub async fn usage(&self, scope: &str, key: &str, limit: &Limit) -> Result<Usage> {
        let state = self.key(GuardKind::RateLimit, scope, key)?;
        let mut ignored = Vec::new();
        let mut source = LimitSource::Code;
        let mut in_force = (limit.rate().to_string(), limit.burst());
        match self.quota_get(scope, key).await? {
            Some(exact) => match (&exact.rate, exact.burst) {
                (Some(rate), Some(burst)) if exact.problem.is_none() => {
                    in_force = (rate.clone(), burst);
                    source = LimitSource::Key;
                }
                // A key's override that is not one: the script ignores it and the code
                // decides, without looking at prefixes.
                _ => ignored.push(exact),
            },
            None => {
                if let Some(prefix) = self.longest_prefix(scope, state.as_str()).await? {
                    match (&prefix.rate, prefix.burst) {
                        (Some(rate), Some(burst)) if prefix.problem.is_none() => {
                            in_force = (rate.clone(), burst);
                            source = LimitSource::Prefix {
                                prefix: prefix.key.clone(),
                            };
                        }
                        _ => ignored.push(prefix),
                    }
                }
            }
        }
        let seen = self.inspect_rate(&state, limit).await?;
        let next = seen.decision.ok_or_else(|| {
            Error::Config(format!(
                "the store decided nothing for `{}`",
                state.as_str()
            ))
        })?;
        let denied = self.deny_applying(scope, key).await?;
        Ok(Usage {
            key: state.as_str().to_owned(),
            source,
            rate: in_force.0,
            burst: in_force.1,
            used: seen.rate.and_then(|r| r.used),
            next,
            denied,
            ignored,
        })
    }

    /// The longest live prefix override that `state` starts with, as the deciding script
    /// picks it (an expired entry the hash still holds is skipped).
    async fn longest_prefix(&self, scope: &str, state: &str) -> Result<Option<QuotaEntry>> {
        let Some(hash) = self.prefix_hash(scope)? else {
            return Ok(None);
        };
        let start = self.scope_prefix(scope)?;
        Ok(self
            .read_prefixes(&hash, &start)
            .await?
            .into_iter()
            .filter(|e| e.expires_in_ms != Some(0))
            .filter(|e| {
                e.key
                    .strip_suffix('*')
                    .is_some_and(|p| state.starts_with(p))
            })
            .max_by_key(|e| e.key.len()))
    }
}
