//! Who is being limited: the keys a scope refused (or admitted) most over the last minutes,
//! from the tallies every instance merges into the store once a second (`rate/top.rs`).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::Admin;
use crate::error::{Error, Result};
use crate::key::{MAX_SCOPE_LEN, check_name};
use crate::rate::{TOP_KEEP, TOP_MAX_MEMBERS, TallyOutcome, minute, tally_key};

/// One key of a [`TopList`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TopEntry {
    /// The rendered key template (`login:10.0.0.7`), as `usage` and `quota` take it.
    pub key: String,
    /// Its calls in the window, at least (a tally undercounts a key by at most its share of
    /// the calls it did not keep).
    pub calls: u64,
}

/// What [`Admin::top`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TopList {
    /// The scope.
    pub scope: String,
    /// `refused` or `admitted`.
    pub outcome: &'static str,
    /// The minutes read, the current one included.
    pub window_minutes: u64,
    /// The keys, most calls first.
    pub entries: Vec<TopEntry>,
}

impl Admin {
    /// The `n` keys of the rate limits in `scope` that were refused (`refused`) or admitted
    /// most over the last `window` (whole minutes, the current one included; at most 15),
    /// across every instance. An instance sends its counts once a second: the last second
    /// may be missing.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// use redguard::admin::Admin;
    ///
    /// let rg = redguard::Redguard::memory();
    /// for _ in 0..3 {
    ///     let _ = redguard::limiter("login:10.0.0.7").scope("auth").rate("1/min").on(&rg).check().await;
    /// }
    /// tokio::time::sleep(Duration::from_millis(1500)).await; // the counts' next trip to the store
    /// let top = Admin::new(rg).top("auth", true, 10, Duration::from_secs(300)).await?;
    /// assert_eq!((top.entries[0].key.as_str(), top.entries[0].calls), ("login:10.0.0.7", 2));
    /// # Ok(()) }
    /// ```
    pub async fn top(
        &self,
        scope: &str,
        refused: bool,
        n: usize,
        window: Duration,
    ) -> Result<TopList> {
        check_name("scope", scope, MAX_SCOPE_LEN)?;
        if n == 0 || n > TOP_MAX_MEMBERS {
            return Err(Error::Config(format!(
                "top: {n} keys asked for; 1 to {TOP_MAX_MEMBERS}"
            )));
        }
        let minutes = window.as_secs().div_ceil(60);
        if minutes == 0 || window > TOP_KEEP {
            return Err(Error::Config(format!(
                "top: a window of {window:?}; 1 minute to {} minutes",
                TOP_KEEP.as_secs() / 60
            )));
        }
        let outcome = if refused {
            TallyOutcome::Refused
        } else {
            TallyOutcome::Admitted
        };
        let now = minute(SystemTime::now());
        let tallies: Vec<_> = (0..minutes)
            .map(|back| tally_key(self.handle.prefix(), scope, outcome, now - back))
            .collect();
        let mut calls: HashMap<String, u64> = HashMap::new();
        for members in self.handle.store().rate_top_read(&tallies).await? {
            for (key, count) in members {
                *calls.entry(key).or_default() += count;
            }
        }
        let mut entries: Vec<TopEntry> = calls
            .into_iter()
            .map(|(key, calls)| TopEntry { key, calls })
            .collect();
        entries.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.key.cmp(&b.key)));
        entries.truncate(n);
        Ok(TopList {
            scope: scope.to_owned(),
            outcome: outcome.as_str(),
            window_minutes: minutes,
            entries,
        })
    }
}
