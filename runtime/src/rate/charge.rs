//! Cost charged after the call: [`Limiter::reserve`] admits a call at its configured cost and
//! returns a [`Charge`], which charges or refunds the rest once the real cost is known.

use super::limiter::Limiter;
use crate::degrade::Degrade as _;
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, Key};
use crate::store::{RateAdjust, RateCheck};
use crate::values::{Decision, Limit, MAX_RATE_COUNT};

/// What a call reports as its cost once it ran: the `Ok` value of a
/// `#[rate_limit(..., charge = after)]` fn implements it, and the units it reports are
/// settled against those admitted up front ([`Charge::settle`]).
///
/// ```
/// struct Reply { tokens: u64 }
/// impl redguard::rate::Cost for Reply {
///     fn cost(&self) -> u64 { self.tokens }
/// }
/// assert_eq!(redguard::rate::Cost::cost(&Reply { tokens: 7 }), 7);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not report a cost: the `Ok` value of a \
               `#[rate_limit(.., charge = after)]` fn must implement `redguard::rate::Cost`",
    label = "the cost charged after the call is read from this fn's `Ok` value",
    note = "add `impl redguard::rate::Cost for {Self} {{ fn cost(&self) -> u64 {{ .. }} }}`, \
            or drop `charge = after` to charge the configured `cost` up front"
)]
pub trait Cost {
    /// Units this call used.
    fn cost(&self) -> u64;
}

impl Cost for u64 {
    fn cost(&self) -> u64 {
        *self
    }
}

impl<T: Cost + ?Sized> Cost for &T {
    fn cost(&self) -> u64 {
        (**self).cost()
    }
}

/// One admitted call's account with its limit, from [`Limiter::reserve`]: the units it holds
/// (the configured cost at admission, plus what [`charge`](Charge::charge) added, less what
/// [`refund`](Charge::refund) gave back).
///
/// Charges and refunds go to the same key, algorithm and override as the admission,
/// atomically, in one store call each. A charge always lands, past the limit too: the
/// balance then goes negative, and the key's next admission waits until it is repaid (GCRA
/// and the buckets: the debt beyond the burst drains first; fixed and sliding windows: the
/// count above the limit leaves with its window). A refund of more than this call holds is
/// refused with [`Error::InvalidLimit`] and sends nothing: a call can give back only what
/// it paid. A unit refunded after the key's balance has already recovered (its debt drained
/// with time, its window ended) gives nothing back at the store, yet counts as refunded
/// here.
///
/// Charged after the work at the same instant, a cost leaves the key exactly as the same
/// cost charged up front would (tested against each other); charged later, the units are
/// counted from the charge's time, which never admits more than up front. Holds no lock
/// and nothing in the store beyond the key's state: a `Charge` dropped unsettled keeps what
/// it holds.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// let rg = redguard::Redguard::memory();
/// let tokens = rg.limiter("llm:tenant:7").rate("1000/min").cost(100);
/// let mut call = tokens.reserve().await?; // admitted holding 100 units
/// let used = 340; // known only once the reply is in
/// call.settle(used).await?; // 240 more charged
/// assert_eq!(call.held(), 340);
/// assert!(call.refund(341).await.is_err()); // more than it holds: refused
/// assert_eq!(tokens.peek().await?.remaining, 1000 - 340 - 100);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a reserved call holds its configured cost: settle it with the real one"]
pub struct Charge {
    handle: Redguard,
    key: Key,
    limit: Limit,
    decision: Decision,
    held: u64,
}

impl Limiter {
    /// Admits this call at its configured [`cost`](Limiter::cost) as
    /// [`check`](Limiter::check) does (a rejection is `Err(`[`Error::RateLimited`]`)`,
    /// waiting as configured), and returns its [`Charge`], through which the real cost is
    /// charged or refunded after the work.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let mut call = rg.limiter("exports").rate("10/min").reserve().await?;
    /// call.charge(4).await?; // the export turned out to be five times the usual size
    /// assert_eq!(call.held(), 5);
    /// # Ok(()) }
    /// ```
    pub async fn reserve(&self) -> Result<Charge> {
        let (handle, decision, key, limit) = self.admit().await?;
        let held = limit.cost;
        Ok(Charge {
            handle,
            key,
            limit,
            decision,
            held,
        })
    }
}

impl Charge {
    /// The admission's decision.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Units this call holds: charged at admission and after, less those refunded.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Charges `units` more to the key (past its limit if need be: see [`Charge`]); returns
    /// the units held now. More than [`MAX_RATE_COUNT`] in one call is refused. On a store
    /// error nothing is counted here, though the store may have charged (a timeout); with
    /// [`FailMode::Local`](crate::handle::FailMode::Local) the local share takes the charge
    /// instead (past it if need be), and the call answers `Ok`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let jobs = rg.limiter("jobs").rate("2/h");
    /// let mut call = jobs.reserve().await?;
    /// assert_eq!(call.charge(3).await?, 4); // two over the limit: the key owes them
    /// assert!(jobs.check().await.is_err()); // repaid before anything else is admitted
    /// # Ok(()) }
    /// ```
    pub async fn charge(&mut self, units: u64) -> Result<u64> {
        if units > MAX_RATE_COUNT {
            return Err(Error::InvalidLimit(format!(
                "a charge of {units} units is refused: at most {MAX_RATE_COUNT} per call"
            )));
        }
        let held = self.held.checked_add(units).ok_or_else(|| {
            Error::InvalidLimit(format!(
                "a charge of {units} units is refused: the call would hold more than u64"
            ))
        })?;
        self.adjust(RateAdjust::Charge(units)).await?;
        self.held = held;
        Ok(held)
    }

    /// Gives back `units` of those this call holds; returns the units held now. More than
    /// [`held`](Charge::held) is refused with [`Error::InvalidLimit`], and nothing is sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let search = rg.limiter("search").rate("10/min").cost(5);
    /// let mut call = search.reserve().await?;
    /// assert_eq!(call.refund(4).await?, 1); // it was a cheap one
    /// assert!(call.refund(2).await.is_err());
    /// assert_eq!(search.peek().await?.remaining, 10 - 1 - 5);
    /// # Ok(()) }
    /// ```
    pub async fn refund(&mut self, units: u64) -> Result<u64> {
        if units > self.held {
            return Err(Error::InvalidLimit(format!(
                "a refund of {units} units is refused: this call holds {} (refund at most \
                 what it was charged)",
                self.held
            )));
        }
        self.adjust(RateAdjust::Refund(units)).await?;
        self.held -= units;
        Ok(self.held)
    }

    /// Brings the units held to `cost`, the call's real cost: charges the difference when it
    /// is more, refunds it when less.
    pub async fn settle(&mut self, cost: u64) -> Result<()> {
        if cost > self.held {
            self.charge(cost - self.held).await?;
        } else if cost < self.held {
            self.refund(self.held - cost).await?;
        }
        Ok(())
    }

    async fn adjust(&self, adjust: RateAdjust) -> Result<u64> {
        let (op, units) = match adjust {
            RateAdjust::Charge(units) => ("charge", units),
            RateAdjust::Refund(units) => ("refund", units),
        };
        if units == 0 {
            return Ok(0);
        }
        let check = RateCheck {
            key: &self.key,
            limit: &self.limit,
        };
        let done = match self.handle.store().rate_adjust(&check, adjust).await {
            Ok(done) => done,
            // The store cannot take a charge while the local fallback decides: the share
            // takes it, or the outage's admissions would escape it (issue 45).
            Err(Error::Backend(err))
                if matches!(adjust, RateAdjust::Charge(_))
                    && super::fallback::charge(&self.handle, &self.key, &self.limit, units) =>
            {
                Err::<(), _>(Error::Backend(err)).or_degrade(
                    &self.handle,
                    GuardKind::RateLimit,
                    "rate_adjust",
                    &self.key,
                )?;
                units
            }
            Err(err) => return Err(err),
        };
        metrics::counter!("redguard_rate_adjusted_units_total", "op" => op).increment(done);
        Ok(done)
    }
}
