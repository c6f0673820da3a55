//! The faulty store: a handle's store with faults scripted at the guard operations.
//!
//! Faults act where a network or a failover would: before the operation reaches the store
//! (a stall, an error), or after it was applied (the reply lost, the write applied twice, the
//! write lost, the key expiring early). Losing or expiring a write deletes the operation's key
//! through the store's admin operations, so it works the same on memory and on Redis.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{BackendError, Error, Result, StoreFailure};
use crate::handle::Redguard;
use crate::key::Key;
use crate::store::admin::{ForceUnlock, ScanKeys, Snapshot, Unlocked};
use crate::store::{
    Acquire, AdminOps, Begin, Finish, IdemBegin, IdemFinished, IdemOps, LockAcquire, LockOps,
    LockRelease, LockWatch, RateAdjust, RateCheck, RateMode, RateOps, RateOutcome, Release,
    Resolve, Resolved, Store, StoreKind, TokenOps, TokenOutcome,
};
use crate::values::Replicas;

/// A named point of the guard operations where a fault can strike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Point {
    /// An idempotent call's begin (takes the PROCESSING record).
    IdemBegin,
    /// The PROCESSING record's renewal while the body runs.
    IdemRenew,
    /// The undo of a begin whose outcome was unknown.
    IdemAbandon,
    /// Recording the body's outcome.
    IdemFinish,
    /// Any lock acquisition (exclusive, fair, semaphore, read/write).
    LockAcquire,
    /// A lease renewal by the watchdog.
    LockRenew,
    /// Any lock release.
    LockRelease,
    /// A rate-limit decision.
    RateCheck,
    /// Issuing an idempotency token.
    TokenIssue,
    /// Consuming an idempotency token.
    TokenConsume,
    /// Giving a consumed token back.
    TokenRestore,
}

impl Point {
    /// Every point.
    pub const ALL: [Point; 11] = [
        Point::IdemBegin,
        Point::IdemRenew,
        Point::IdemAbandon,
        Point::IdemFinish,
        Point::LockAcquire,
        Point::LockRenew,
        Point::LockRelease,
        Point::RateCheck,
        Point::TokenIssue,
        Point::TokenConsume,
        Point::TokenRestore,
    ];

    /// The operation's name, as store errors give it.
    pub fn as_str(self) -> &'static str {
        match self {
            Point::IdemBegin => "idem_begin",
            Point::IdemRenew => "idem_renew",
            Point::IdemAbandon => "idem_abandon",
            Point::IdemFinish => "idem_finish",
            Point::LockAcquire => "lock_acquire",
            Point::LockRenew => "lock_renew",
            Point::LockRelease => "lock_release",
            Point::RateCheck => "rate_check",
            Point::TokenIssue => "token_issue",
            Point::TokenConsume => "token_consume",
            Point::TokenRestore => "token_restore",
        }
    }
}

/// What happens to an operation a rule picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The store answers after this long; past the handle's timeout the call times out
    /// (after the timeout, the operation not applied), as a hung Redis does.
    Stall(Duration),
    /// The store fails the call (an error reply, a broken connection); nothing is applied.
    Fail,
    /// The operation is applied, then its reply is lost: the caller sees a timeout.
    ReplyLost,
    /// The operation is applied twice (a client retrying a write whose reply it missed); the
    /// caller gets the second reply.
    ApplyTwice,
    /// The operation is applied and acknowledged, then lost (a failover to a replica that
    /// never got it): its key is deleted before the reply returns.
    LoseWrite,
    /// The operation is applied, but its key expires this long after (by the store's clock),
    /// whatever TTL it was given: deleted by the first faulty-store call after that.
    ExpireEarly(Duration),
}

impl Fault {
    /// One fault of each kind, with a stall of `stall` and an early expiry of `expire`: the
    /// kinds [`Faults::random`] picks from by default.
    pub fn each(stall: Duration, expire: Duration) -> Vec<Fault> {
        vec![
            Fault::Stall(stall),
            Fault::Fail,
            Fault::ReplyLost,
            Fault::ApplyTwice,
            Fault::LoseWrite,
            Fault::ExpireEarly(expire),
        ]
    }
}

/// Which operations a rule applies to: all of them unless narrowed.
///
/// ```
/// use redguard::testing::{At, Point};
///
/// let second_finish = At::point(Point::IdemFinish).nth(2);
/// let stock_locks = At::point(Point::LockAcquire).key("*:stock:*");
/// # let _ = (second_finish, stock_locks);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct At {
    point: Option<Point>,
    nth: Option<u64>,
    key: Option<String>,
}

impl At {
    /// Every operation.
    pub fn any() -> At {
        At::default()
    }

    /// The operations at `point`.
    pub fn point(point: Point) -> At {
        At {
            point: Some(point),
            ..At::default()
        }
    }

    /// Only the `n`-th (from 1) of the operations this matches otherwise.
    pub fn nth(mut self, n: u64) -> At {
        self.nth = Some(n);
        self
    }

    /// Only operations on a full store key matching `pattern`, where `*` stands for any
    /// run of characters (`"shop:idem:*:order-7"`).
    pub fn key(mut self, pattern: impl Into<String>) -> At {
        self.key = Some(pattern.into());
        self
    }

    fn matches(&self, point: Point, key: &str) -> bool {
        self.point.is_none_or(|p| p == point)
            && self.key.as_deref().is_none_or(|pattern| glob(pattern, key))
    }
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.point.map_or("any", Point::as_str))?;
        if let Some(key) = &self.key {
            write!(f, " on `{key}`")?;
        }
        if let Some(n) = self.nth {
            write!(f, " #{n}")?;
        }
        Ok(())
    }
}

/// `*` matches any run of characters; everything else itself.
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let mut parts: Vec<&str> = parts.collect();
    let Some(last) = parts.pop() else {
        return rest.is_empty();
    };
    for part in parts {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// A fault that struck: which operation, on which key, what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    /// The operation's number among every operation the faulty store saw (from 1).
    pub call: u64,
    /// Where.
    pub point: Point,
    /// The operation's key.
    pub key: String,
    /// What.
    pub fault: Fault,
}

impl fmt::Display for Injected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "call {} {} `{}`: {:?}",
            self.call,
            self.point.as_str(),
            self.key,
            self.fault
        )
    }
}

/// A fault schedule, shared by clones: script it, put it behind a handle with
/// [`faulty`](crate::testing::faulty), and read what struck with
/// [`injected`](Faults::injected).
///
/// Rules are tried in the order added; the first that matches an operation decides its fault.
/// A [random](Faults::random) schedule is reproducible from its seed as long as the test
/// issues its operations in the same order (one task, or a current-thread runtime).
///
/// ```
/// use std::time::Duration;
/// use redguard::testing::{At, Fault, Faults, Point};
///
/// let faults = Faults::new()
///     .inject(At::point(Point::IdemFinish).nth(1), Fault::ReplyLost)
///     .inject(At::point(Point::LockRenew), Fault::Stall(Duration::from_secs(1)))
///     .random(42, 0.05, Fault::each(Duration::from_millis(50), Duration::from_millis(10)));
/// assert!(faults.injected().is_empty());
/// ```
#[derive(Clone, Debug, Default)]
pub struct Faults {
    inner: Arc<Mutex<Schedule>>,
}

#[derive(Debug, Default)]
struct Schedule {
    rules: Vec<Rule>,
    random: Option<Random>,
    calls: u64,
    injected: Vec<Injected>,
    /// Keys to delete once the store's clock passes the time: `ExpireEarly`.
    expiring: Vec<(Key, Duration)>,
}

#[derive(Debug)]
struct Rule {
    at: At,
    fault: Fault,
    seen: u64,
}

#[derive(Debug)]
struct Random {
    at: At,
    rng: SplitMix,
    probability: f64,
    kinds: Vec<Fault>,
}

impl Faults {
    /// No faults: every operation goes through.
    pub fn new() -> Faults {
        Faults::default()
    }

    fn schedule(&self) -> std::sync::MutexGuard<'_, Schedule> {
        // Each change is a few field updates made without calling out: a panic cannot tear it.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `fault` to the operations `at` matches.
    pub fn inject(self, at: At, fault: Fault) -> Faults {
        self.schedule().rules.push(Rule { at, fault, seen: 0 });
        self
    }

    /// Applies, with `probability` each, one of `kinds` (picked evenly) to every operation no
    /// rule picked, drawn from `seed`.
    pub fn random(self, seed: u64, probability: f64, kinds: Vec<Fault>) -> Faults {
        self.random_at(At::any(), seed, probability, kinds)
    }

    /// [`random`](Faults::random), on the operations `at` matches only.
    pub fn random_at(self, at: At, seed: u64, probability: f64, kinds: Vec<Fault>) -> Faults {
        self.schedule().random = Some(Random {
            at,
            rng: SplitMix(seed),
            probability,
            kinds,
        });
        self
    }

    /// The faults that struck so far, in order.
    pub fn injected(&self) -> Vec<Injected> {
        self.schedule().injected.clone()
    }

    /// The fault for the next operation, `point` on `key`, recorded when there is one.
    fn next(&self, point: Point, key: &Key) -> Option<Fault> {
        let mut schedule = self.schedule();
        schedule.calls += 1;
        let call = schedule.calls;
        let mut fault = None;
        for rule in &mut schedule.rules {
            if !rule.at.matches(point, key.as_str()) {
                continue;
            }
            rule.seen += 1;
            if fault.is_none() && rule.at.nth.is_none_or(|n| n == rule.seen) {
                fault = Some(rule.fault);
            }
        }
        if fault.is_none()
            && let Some(random) = &mut schedule.random
            && random.at.matches(point, key.as_str())
            && !random.kinds.is_empty()
        {
            // Both draws always happen, so one operation's fault does not shift the next's.
            let strike = random.rng.unit() < random.probability;
            let pick = random.rng.below(random.kinds.len());
            if strike {
                fault = Some(random.kinds[pick]);
            }
        }
        let fault = fault?;
        schedule.injected.push(Injected {
            call,
            point,
            key: key.as_str().to_owned(),
            fault,
        });
        Some(fault)
    }
}

/// splitmix64: a few lines for reproducible schedules, where a generator crate would be a
/// dependency of every user's test build.
#[derive(Debug)]
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A store whose operations meet the faults of a schedule.
#[derive(Debug)]
pub(crate) struct FaultyStore {
    inner: Arc<dyn Store>,
    faults: Faults,
    /// The handle's bound on each call: a stall longer than it is a timeout.
    timeout: Duration,
}

impl FaultyStore {
    pub(crate) fn wrap(handle: &Redguard, faults: Faults) -> Redguard {
        let timeout = handle.timeout();
        handle.wrap_store(|inner| {
            Arc::new(FaultyStore {
                inner,
                faults,
                timeout,
            })
        })
    }

    fn timed_out(&self, point: Point) -> Error {
        Error::Backend(BackendError::Timeout {
            op: point.as_str(),
            after: self.timeout,
        })
    }

    /// Runs `op` (`point` on `keys`, the first one named in the schedule) through the fault
    /// the schedule has for it.
    async fn apply<T, F>(&self, point: Point, keys: &[&Key], op: impl Fn() -> F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        self.expire_due().await;
        let Some(key) = keys.first() else {
            return op().await;
        };
        let Some(fault) = self.faults.next(point, key) else {
            return op().await;
        };
        match fault {
            Fault::Stall(pause) if pause >= self.timeout => {
                tokio::time::sleep(self.timeout).await;
                Err(self.timed_out(point))
            }
            Fault::Stall(pause) => {
                tokio::time::sleep(pause).await;
                op().await
            }
            Fault::Fail => Err(Error::Backend(BackendError::Failed {
                op: point.as_str(),
                source: StoreFailure::new(format!("injected fault at {}", point.as_str())),
            })),
            Fault::ReplyLost => {
                let _ = op().await;
                Err(self.timed_out(point))
            }
            Fault::ApplyTwice => {
                let _ = op().await;
                op().await
            }
            Fault::LoseWrite => {
                let reply = op().await;
                self.delete(keys).await;
                reply
            }
            Fault::ExpireEarly(after) => {
                let reply = op().await;
                match self.inner.time().await {
                    Ok(now) => self
                        .faults
                        .schedule()
                        .expiring
                        .extend(keys.iter().map(|key| ((*key).clone(), now + after))),
                    Err(err) => {
                        tracing::warn!(error = %err, "the faulty store could not read the time to expire a key early")
                    }
                }
                reply
            }
        }
    }

    async fn delete(&self, keys: &[&Key]) {
        let keys: Vec<Key> = keys.iter().map(|key| (*key).clone()).collect();
        if let Err(err) = self.inner.admin_delete(&keys).await {
            tracing::warn!(error = %err, "the faulty store could not delete a key it was to lose");
        }
    }

    /// Deletes the keys whose early expiry has come, by the store's clock.
    async fn expire_due(&self) {
        if self.faults.schedule().expiring.is_empty() {
            return;
        }
        let Ok(now) = self.inner.time().await else {
            return;
        };
        let due: Vec<Key> = {
            let mut schedule = self.faults.schedule();
            let (due, later) = std::mem::take(&mut schedule.expiring)
                .into_iter()
                .partition(|(_, at)| *at <= now);
            schedule.expiring = later;
            due.into_iter().map(|(key, _)| key).collect()
        };
        if !due.is_empty() {
            self.delete(&due.iter().collect::<Vec<_>>()).await;
        }
    }
}

#[async_trait]
impl Store for FaultyStore {
    fn kind(&self) -> StoreKind {
        self.inner.kind()
    }

    async fn time(&self) -> Result<Duration> {
        self.inner.time().await
    }

    async fn twin(&self) -> Result<Option<Arc<dyn Store>>> {
        Ok(self.inner.twin().await?.map(|inner| {
            Arc::new(FaultyStore {
                inner,
                faults: self.faults.clone(),
                timeout: self.timeout,
            }) as Arc<dyn Store>
        }))
    }

    fn rate_reset_after(&self, key: &Key, since: std::time::Instant) -> bool {
        self.inner.rate_reset_after(key, since)
    }

    fn listen_rate_resets(&self) {
        self.inner.listen_rate_resets();
    }
}

#[async_trait]
impl IdemOps for FaultyStore {
    async fn idem_begin(&self, begin: Begin<'_>) -> Result<IdemBegin> {
        self.apply(Point::IdemBegin, &[begin.key], || {
            self.inner.idem_begin(begin)
        })
        .await
    }

    async fn idem_renew(&self, key: &Key, owner: &str, ttl: Duration) -> Result<bool> {
        self.apply(Point::IdemRenew, &[key], || {
            self.inner.idem_renew(key, owner, ttl)
        })
        .await
    }

    async fn idem_abandon(&self, key: &Key, owner: &str) -> Result<()> {
        self.apply(Point::IdemAbandon, &[key], || {
            self.inner.idem_abandon(key, owner)
        })
        .await
    }

    async fn idem_finish(&self, finish: Finish<'_>) -> Result<IdemFinished> {
        self.apply(Point::IdemFinish, &[finish.key], || {
            self.inner.idem_finish(finish)
        })
        .await
    }

    async fn idem_resolve(&self, resolve: Resolve<'_>) -> Result<Resolved> {
        self.inner.idem_resolve(resolve).await
    }

    async fn idem_watch(&self, key: &Key) -> LockWatch {
        self.inner.idem_watch(key).await
    }
}

#[async_trait]
impl LockOps for FaultyStore {
    async fn lock_acquire(&self, acquire: Acquire<'_>) -> Result<LockAcquire> {
        self.apply(Point::LockAcquire, &[acquire.key], || {
            self.inner.lock_acquire(acquire)
        })
        .await
    }

    async fn lock_renew(&self, key: &Key, owner: &str, lease: Duration) -> Result<bool> {
        self.apply(Point::LockRenew, &[key], || {
            self.inner.lock_renew(key, owner, lease)
        })
        .await
    }

    async fn lock_release(&self, release: Release<'_>) -> Result<LockRelease> {
        self.apply(Point::LockRelease, &[release.key], || {
            self.inner.lock_release(release)
        })
        .await
    }

    async fn semaphore_acquire(&self, acquire: Acquire<'_>, permits: u32) -> Result<LockAcquire> {
        self.apply(Point::LockAcquire, &[acquire.key], || {
            self.inner.semaphore_acquire(acquire, permits)
        })
        .await
    }

    async fn semaphore_renew(&self, key: &Key, owner: &str, lease: Duration) -> Result<bool> {
        self.apply(Point::LockRenew, &[key], || {
            self.inner.semaphore_renew(key, owner, lease)
        })
        .await
    }

    async fn semaphore_release(&self, key: &Key, owner: &str) -> Result<LockRelease> {
        self.apply(Point::LockRelease, &[key], || {
            self.inner.semaphore_release(key, owner)
        })
        .await
    }

    async fn rw_acquire(&self, acquire: Acquire<'_>, write: bool) -> Result<LockAcquire> {
        self.apply(Point::LockAcquire, &[acquire.key], || {
            self.inner.rw_acquire(acquire, write)
        })
        .await
    }

    async fn rw_release_read(&self, key: &Key, owner: &str) -> Result<LockRelease> {
        self.apply(Point::LockRelease, &[key], || {
            self.inner.rw_release_read(key, owner)
        })
        .await
    }

    async fn fair_acquire(&self, acquire: Acquire<'_>) -> Result<LockAcquire> {
        self.apply(Point::LockAcquire, &[acquire.key], || {
            self.inner.fair_acquire(acquire)
        })
        .await
    }

    async fn fair_release(&self, release: Release<'_>) -> Result<LockRelease> {
        self.apply(Point::LockRelease, &[release.key], || {
            self.inner.fair_release(release)
        })
        .await
    }

    async fn fair_leave(&self, key: &Key, owner: &str) -> Result<()> {
        self.apply(Point::LockRelease, &[key], || {
            self.inner.fair_leave(key, owner)
        })
        .await
    }

    async fn lock_watch(&self, key: &Key) -> LockWatch {
        self.inner.lock_watch(key).await
    }

    async fn fair_watch(&self, key: &Key, owner: &str) -> LockWatch {
        self.inner.fair_watch(key, owner).await
    }
}

#[async_trait]
impl RateOps for FaultyStore {
    async fn rate_check(&self, checks: &[RateCheck<'_>], mode: RateMode) -> Result<RateOutcome> {
        let keys: Vec<&Key> = checks.iter().map(|check| check.key).collect();
        self.apply(Point::RateCheck, &keys, || {
            self.inner.rate_check(checks, mode)
        })
        .await
    }

    async fn rate_adjust(&self, check: &RateCheck<'_>, adjust: RateAdjust) -> Result<u64> {
        // The same fault point as the check: a charge after the call meets the store the
        // check met.
        self.apply(Point::RateCheck, &[check.key], || {
            self.inner.rate_adjust(check, adjust)
        })
        .await
    }

    // The tally is analytics, beside the decisions: no fault point of its own.
    async fn rate_top_merge(
        &self,
        tally: &Key,
        counts: &[(String, u64)],
        keep: Duration,
        max: usize,
    ) -> Result<()> {
        self.inner.rate_top_merge(tally, counts, keep, max).await
    }

    async fn rate_top_read(&self, tallies: &[Key]) -> Result<Vec<Vec<(String, u64)>>> {
        self.inner.rate_top_read(tallies).await
    }
}

#[async_trait]
impl TokenOps for FaultyStore {
    async fn token_issue(
        &self,
        key: &Key,
        scene: &str,
        ttl: Duration,
        replicas: Option<Replicas>,
    ) -> Result<()> {
        self.apply(Point::TokenIssue, &[key], || {
            self.inner.token_issue(key, scene, ttl, replicas)
        })
        .await
    }

    async fn token_consume(&self, key: &Key, scene: &str, owner: &str) -> Result<TokenOutcome> {
        self.apply(Point::TokenConsume, &[key], || {
            self.inner.token_consume(key, scene, owner)
        })
        .await
    }

    async fn token_restore(&self, key: &Key, scene: &str, owner: &str) -> Result<bool> {
        self.apply(Point::TokenRestore, &[key], || {
            self.inner.token_restore(key, scene, owner)
        })
        .await
    }
}

#[async_trait]
impl AdminOps for FaultyStore {
    async fn admin_read(&self, keys: &[Key]) -> Result<Snapshot> {
        self.inner.admin_read(keys).await
    }

    async fn admin_scan(&self, prefix: &str, limit: usize) -> Result<ScanKeys> {
        self.inner.admin_scan(prefix, limit).await
    }

    async fn admin_unlock(&self, unlock: ForceUnlock<'_>) -> Result<Unlocked> {
        self.inner.admin_unlock(unlock).await
    }

    async fn admin_delete(&self, keys: &[Key]) -> Result<u64> {
        self.inner.admin_delete(keys).await
    }

    async fn admin_announce_reset(&self, key: &Key) -> Result<()> {
        self.inner.admin_announce_reset(key).await
    }

    async fn admin_forget(&self, key: &Key, fields: &[(String, String)]) -> Result<bool> {
        self.inner.admin_forget(key, fields).await
    }

    async fn admin_refund(&self, key: &Key, units: u64) -> Result<u64> {
        self.inner.admin_refund(key, units).await
    }

    async fn admin_quota_set(&self, key: &Key, value: &str, ttl: Option<Duration>) -> Result<()> {
        self.inner.admin_quota_set(key, value, ttl).await
    }

    async fn admin_quota_prefix(
        &self,
        hash: &Key,
        field: &str,
        value: Option<&str>,
        ttl: Option<Duration>,
        max: usize,
    ) -> Result<bool> {
        self.inner
            .admin_quota_prefix(hash, field, value, ttl, max)
            .await
    }

    async fn admin_quota_prefixes(&self, hash: &Key) -> Result<(Duration, Vec<(String, String)>)> {
        self.inner.admin_quota_prefixes(hash).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_runs_of_characters() {
        assert!(glob("a:*:c", "a:b:c"));
        assert!(glob("*stock*", "rg:lock:stock:sku-1"));
        assert!(glob("exact", "exact"));
        assert!(!glob("exact", "exact2"));
        assert!(!glob("a:*:c", "a:b:d"));
        assert!(glob("*", ""));
    }

    #[test]
    fn a_random_schedule_is_reproducible_from_its_seed() {
        let key = Key::stored("k");
        let draw = |seed| {
            let faults =
                Faults::new().random(seed, 0.5, Fault::each(Duration::ZERO, Duration::ZERO));
            for _ in 0..64 {
                faults.next(Point::RateCheck, &key);
            }
            faults.injected()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        assert!(!draw(7).is_empty());
    }
}
