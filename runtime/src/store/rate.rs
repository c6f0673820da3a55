//! Store operations of rate limits.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::key::Key;
use crate::values::{Decision, Limit};

/// Rate-limit operations of a [`Store`](super::Store).
///
/// One call checks any number of limits **all-or-nothing**: each limit's decision is computed
/// against the same store time, and only when every one admits (and `mode` is
/// [`RateMode::Consume`]) are they all charged. A limit that rejects charges nothing anywhere,
/// so a per-user limit turning a call away does not use up the global one, and vice versa.
///
/// On Redis this is one script over every key. On a Cluster, each limit key carries its own
/// `{scope:body}` hash tag, so limits in different slots are decided in two phases (see the
/// Redis store): the decisions, penalties included, are those of one script, except when
/// another caller races between the phases.
#[async_trait]
pub trait RateOps {
    /// Decides `checks` together at the store's current time.
    async fn rate_check(&self, checks: &[RateCheck<'_>], mode: RateMode) -> Result<RateOutcome>;

    /// Charges or gives back units of `check`'s limit at the store's current time, without
    /// deciding anything: what a call charged after its work ([`Charge`](crate::rate::Charge))
    /// asks. The same key, algorithm and override (`:quota`) as `rate_check`, atomically.
    ///
    /// A charge always lands, even past the limit: the balance then goes negative (GCRA's
    /// and the buckets' debt beyond the burst, a window's count above its limit), and the
    /// next admission waits until it is repaid. A refund gives back at most what the key
    /// holds. Returns the units charged or given back.
    async fn rate_adjust(&self, check: &RateCheck<'_>, adjust: RateAdjust) -> Result<u64>;

    /// Adds `counts` (key, calls) to the tally at `tally` (a sorted set of one scope, outcome
    /// and minute, `rate/top.rs`), keeps its `max` highest members and its TTL at `keep`.
    /// A store that keeps no tally takes nothing.
    async fn rate_top_merge(
        &self,
        _tally: &Key,
        _counts: &[(String, u64)],
        _keep: Duration,
        _max: usize,
    ) -> Result<()> {
        Ok(())
    }

    /// The members of each tally in `tallies`, with their counts (empty when absent).
    async fn rate_top_read(&self, tallies: &[Key]) -> Result<Vec<Vec<(String, u64)>>> {
        Ok(vec![Vec::new(); tallies.len()])
    }
}

/// What [`RateOps::rate_adjust`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateAdjust {
    /// Adds units to the key's use.
    Charge(u64),
    /// Gives units back.
    Refund(u64),
}

/// One limit on one key.
#[derive(Debug, Clone, Copy)]
pub struct RateCheck<'a> {
    /// The limit's state key.
    pub key: &'a Key,
    /// The limit.
    pub limit: &'a Limit,
}

/// Whether a check counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateMode {
    /// Charge every limit when all admit.
    Consume,
    /// Report the decisions, change nothing.
    Peek,
    /// As `Consume`, and a GCRA limit that would admit the call within this long also admits
    /// it now, at its next free slot: charged as a call arriving then, with the time until
    /// then as the decision's `retry_after` (zero when admitted at once). Other algorithms
    /// decide as `Consume`; on a Cluster, limits in several slots are decided as `Consume`.
    /// What a call that may wait asks, so that its slot is the store's, never late.
    Reserve(Duration),
}

impl RateMode {
    /// Whether an admission charges.
    pub fn charges(self) -> bool {
        self != RateMode::Peek
    }
}

/// What [`RateOps::rate_check`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateOutcome {
    /// The store's time the decisions were made at (Redis `TIME`), since the Unix epoch.
    pub now: Duration,
    /// One decision per check, in order. The call is admitted only when all allow.
    pub decisions: Vec<Decision>,
}

impl RateOutcome {
    /// True when every limit admitted the call.
    pub fn allowed(&self) -> bool {
        self.decisions.iter().all(|d| d.allowed)
    }
}

/// A value at `key`'s override that is not one (written by hand, or by another version):
/// the limit in the code decided, and the operator is told.
pub(crate) fn quota_ignored(key: &Key) {
    metrics::counter!("redguard_rate_quota_invalid_total").increment(1);
    tracing::warn!(
        %key,
        "redguard: the quota override of this rate limit is not one this version reads; \
         ignored (the limit in the code applies): set it again with `redguard quota set`"
    );
}
