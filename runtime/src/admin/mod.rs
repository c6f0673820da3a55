//! Operator's tools: see, explain and repair guard state in production.
//!
//! [`Admin`] reads what the guards keep in the store through the [`Store`](crate::store::Store)
//! seam ([`AdminOps`](crate::store::AdminOps)), on memory, a single Redis or a Cluster alike:
//!
//! - [`inspect`](Admin::inspect) decodes an idempotency record (status, owner, fingerprint,
//!   age, TTL, result size), a lock of every kind (owner, depth, fencing token, since when,
//!   lease left, holders, waiters) or a rate limit (algorithm, units in use, when it is
//!   empty, penalty; with the limit given, the decision a call would get);
//! - [`scan`](Admin::scan) counts the keys of a guard or scope, with their oldest ages, by
//!   `SCAN` (never `KEYS`), bounded, on every Cluster master;
//! - repairs, each explicit and logged at warn: [`unlock`](Admin::unlock) (a forced release
//!   that raises the fencing counter, so the old holder's token is stale),
//!   [`forget`](Admin::forget) an idempotency record, [`resolve`](Admin::resolve) one whose
//!   outcome is unknown, [`reset`](Admin::reset) a rate limit,
//!   [`refund`](Admin::refund) units to it;
//! - quota overrides: [`quota_set`](Admin::quota_set) the rate and burst of one rate-limit
//!   key at run time (every instance's next call is decided with it), `quota_get`,
//!   `quota_list`, `quota_clear`.
//!
//! Keys are named as the guards name them — guard, scope and rendered template, checked by
//! the same rules ([`Admin::key`]) — or as found in Redis ([`Admin::raw_key`]); a key that is
//! not one redguard writes under the handle's prefix is refused before anything is read.
//! The `redguard` command-line tool (crate `redguard-cli`) is these calls.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
//! use redguard::{key::GuardKind, Redguard};
//! use redguard::admin::Admin;
//!
//! let rg = Redguard::memory();
//! let held = rg.lock("stock:SK-1").scope("shop::reserve").acquire().await?;
//!
//! let admin = Admin::new(rg.clone());
//! let key = admin.key(GuardKind::Lock, "shop::reserve", "stock:SK-1")?;
//! let seen = admin.inspect(&key).await?;
//! assert_eq!(seen.locks[0].fence, Some(held.fence()));
//!
//! let freed = admin.unlock(&key, None).await?;
//! assert!(freed.fence.unwrap() > held.fence()); // the old holder's token is stale
//! assert!(admin.inspect(&key).await?.locks.is_empty());
//! # Ok(()) }
//! ```

mod address;
mod decode;
mod deny;
mod quota;
mod scan;
mod top;
mod usage;

use serde::Serialize;

pub use self::address::{AdminKey, LockKindName};
pub use self::decode::{DecisionState, Holder, Inspection, LockState, RateState, RecordState};
pub use self::deny::DenyEntry;
pub use self::quota::{QuotaEntry, QuotaList};
pub use self::scan::{DEFAULT_SCAN_LIMIT, ScanGroup, ScanReport, ScanSelect};
pub use self::top::{TopEntry, TopList};
pub use self::usage::{LimitSource, Usage};
pub use crate::values::{
    DenyPattern, MAX_DENY_PATTERNS, MAX_DENY_REASON, MAX_PREFIX_OVERRIDES, MAX_QUOTA_TTL, Quota,
    QuotaTtl,
};

use self::decode::View;
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, Key};
use crate::store::admin::{ForceUnlock, Raw};
use crate::store::{self, IdemStatus, RateCheck, RateMode};
use crate::values::Limit;

/// An operator's verdict on an idempotency record, for [`Admin::resolve`].
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// The intent's effects happened: record SUCCESS with this value, which every retry
    /// then gets (the JSON the guarded fn's `Ok` value serializes to).
    Succeeded(serde_json::Value),
    /// They did not (or were undone): record FAIL, so the next retry runs the body.
    Failed,
}

/// What [`Admin::resolve`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Resolve {
    /// The key.
    pub key: String,
    /// The record's status before (`unknown`, `fail`; `processing` or `success` when forced).
    pub was: &'static str,
    /// Its status now: `success` or `fail`.
    pub now: &'static str,
}

/// The operator's tools on a handle's store and prefix. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Admin {
    handle: Redguard,
}

/// What [`Admin::unlock`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Unlock {
    /// The key.
    pub key: String,
    /// The locks as they were (the kinds held).
    pub before: Vec<LockState>,
    /// Holders removed (0: nothing was held, nothing changed).
    pub removed: u64,
    /// The fencing counter afterwards: above every token of the holders removed.
    pub fence: Option<u64>,
}

impl Admin {
    /// The tools on `handle`'s store, for keys under its prefix.
    pub fn new(handle: Redguard) -> Admin {
        Admin { handle }
    }

    /// The handle.
    pub fn handle(&self) -> &Redguard {
        &self.handle
    }

    /// The key `guard` uses for the rendered template `key` in `scope` — the rules and
    /// layout of the guards themselves (`"stock:SK-1"` in scope `shop::reserve` is the lock
    /// `#[dist_lock(key = "stock:{sku}", scope = "shop::reserve")]` takes for `SK-1`).
    pub fn key(&self, guard: GuardKind, scope: &str, key: &str) -> Result<AdminKey> {
        address::template(&self.handle, guard, scope, key)
    }

    /// A full key as found in Redis (companions such as `:fence` or `:block` address their
    /// guard key); [`Error::InvalidKey`] when it is not one redguard writes under this
    /// handle's prefix.
    pub fn raw_key(&self, key: &str) -> Result<AdminKey> {
        address::raw(&self.handle, key)
    }

    /// The keys read to inspect `key`, in one hash tag.
    fn keys_of(key: &AdminKey) -> Vec<Key> {
        match key.guard {
            GuardKind::Lock => {
                let kinds: Vec<LockKindName> = match key.lock_kind {
                    Some(kind) => vec![kind],
                    None => LockKindName::ALL.to_vec(),
                };
                let mut keys = Vec::new();
                for kind in kinds {
                    let lock = lock_key(key, kind);
                    keys.push(lock.companion("fence"));
                    match kind {
                        LockKindName::Fair => {
                            keys.push(lock.companion("queue"));
                            keys.push(lock.companion("registered"));
                        }
                        LockKindName::ReadWrite => {
                            keys.push(lock.companion("readers"));
                            keys.push(lock.companion("intent"));
                        }
                        _ => {}
                    }
                    keys.push(lock);
                }
                keys
            }
            GuardKind::RateLimit => vec![key.base.clone(), key.at("block")],
            _ => vec![key.base.clone()],
        }
    }

    /// Decodes what is stored at `key` (see [`Inspection`]). Never fails on what it finds:
    /// data redguard does not write is listed in [`Inspection::problems`].
    pub async fn inspect(&self, key: &AdminKey) -> Result<Inspection> {
        let snapshot = self.handle.store().admin_read(&Self::keys_of(key)).await?;
        let mut view = View::new(&snapshot);
        let base = key.as_str();
        let mut seen = Inspection {
            key: base.to_owned(),
            guard: key.guard.as_str(),
            now_ms: view.now_ms,
            record: None,
            locks: Vec::new(),
            fence_counter: None,
            rate: None,
            decision: None,
            problems: Vec::new(),
        };
        match key.guard {
            GuardKind::Idempotency => seen.record = view.record(base),
            GuardKind::Lock => {
                let kinds: Vec<LockKindName> = match key.lock_kind {
                    Some(kind) => vec![kind],
                    None => LockKindName::ALL.to_vec(),
                };
                for kind in kinds {
                    let lock = lock_key(key, kind);
                    if let Some(state) = view.lock(kind, lock.as_str()) {
                        seen.locks.push(state);
                    } else if kind == LockKindName::Exclusive || key.lock_kind.is_some() {
                        seen.fence_counter = view.lock_counter(lock.as_str());
                    }
                }
            }
            _ => seen.rate = view.rate(base),
        }
        seen.problems = view.problems;
        Ok(seen)
    }

    /// [`inspect`](Admin::inspect) a rate limit, plus the decision a call of `limit` would
    /// get now (peeked: nothing is charged).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use redguard::{rate::Algorithm, key::GuardKind, rate::Limit, rate::Rate, Redguard};
    /// use redguard::admin::Admin;
    ///
    /// let rg = Redguard::memory();
    /// redguard::limiter(redguard::key("login:{ip}").part("ip", "10.0.0.1")).rate("5/min").on(&rg).check().await?;
    /// let admin = Admin::new(rg);
    /// let key = admin.key(GuardKind::RateLimit, "limiter", "login:10.0.0.1")?;
    /// let limit = Limit::new(Algorithm::Gcra, Rate::per_minute(5), None, 1, Default::default())?;
    /// let seen = admin.inspect_rate(&key, &limit).await?;
    /// assert_eq!(seen.rate.unwrap().used, Some(1));
    /// assert_eq!(seen.decision.unwrap().remaining, 3); // after a call now: 5 - 1 - 1
    /// # Ok(()) }
    /// ```
    pub async fn inspect_rate(&self, key: &AdminKey, limit: &Limit) -> Result<Inspection> {
        self.expect(key, GuardKind::RateLimit)?;
        let mut seen = self.inspect(key).await?;
        let check = RateCheck {
            key: &key.base,
            limit,
        };
        let outcome = self
            .handle
            .store()
            .rate_check(&[check], RateMode::Peek)
            .await?;
        seen.decision = outcome.decisions.into_iter().next().map(Into::into);
        Ok(seen)
    }

    /// Counts the keys `select` names (see [`ScanReport`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use redguard::{key::GuardKind, Redguard};
    /// use redguard::admin::{Admin, ScanSelect};
    ///
    /// let rg = Redguard::memory();
    /// let _held = rg.lock("job:nightly").scope("jobs").acquire().await?;
    /// let report = Admin::new(rg).scan(&ScanSelect::guard(GuardKind::Lock).scope("jobs")).await?;
    /// let locks = report.groups.iter().find(|g| g.role == "exclusive").unwrap();
    /// assert_eq!(locks.count, 1);
    /// # Ok(()) }
    /// ```
    pub async fn scan(&self, select: &ScanSelect) -> Result<ScanReport> {
        scan::scan(&self.handle, select).await
    }

    fn expect(&self, key: &AdminKey, guard: GuardKind) -> Result<()> {
        if key.guard == guard {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "{key} is a `{}` key; this repair applies to `{}` keys",
                key.guard.as_str(),
                guard.as_str(),
                key = key.as_str()
            )))
        }
    }

    /// Frees the lock at `key` from the holders it has now (`owner`: only that holder — a
    /// semaphore's slot, a reader, or the lock if that owner holds it), for every kind held
    /// there (or the kind a raw key names). The fencing counter is raised past every token
    /// handed out, so storage that checks tokens refuses the old holder's writes; its
    /// watchdog finds the lock gone at its next renewal and reports it lost. Waiters are
    /// woken. Logged at warn.
    ///
    /// Only the holders read first (listed in [`Unlock::before`]) are freed, in the same
    /// script that checks them: one that took the lock in between is left holding it.
    pub async fn unlock(&self, key: &AdminKey, owner: Option<&str>) -> Result<Unlock> {
        self.expect(key, GuardKind::Lock)?;
        let before = self.inspect(key).await?.locks;
        let mut done = Unlock {
            key: key.as_str().to_owned(),
            before: Vec::new(),
            removed: 0,
            fence: None,
        };
        for state in before.into_iter().filter(|s| s.held) {
            let lock = lock_key(key, state.kind);
            let fence = lock.companion("fence");
            let readers = lock.companion("readers");
            let seen: Vec<&str> = match owner {
                Some(owner) => vec![owner],
                None => state
                    .owner
                    .iter()
                    .map(String::as_str)
                    .chain(state.holders.iter().map(|h| h.owner.as_str()))
                    .collect(),
            };
            let unlocked = self
                .handle
                .store()
                .admin_unlock(ForceUnlock {
                    lock: &lock,
                    fence: &fence,
                    readers: (state.kind == LockKindName::ReadWrite).then_some(&readers),
                    owners: &seen,
                    semaphore: state.kind == LockKindName::Semaphore,
                })
                .await?;
            tracing::warn!(
                key = %lock,
                kind = state.kind.as_str(),
                holder = state.owner.as_deref().unwrap_or(""),
                holders = state.holders.len(),
                old_fence = state.fence,
                new_fence = unlocked.fence,
                removed = unlocked.removed,
                "redguard admin: lock released by force"
            );
            done.removed += unlocked.removed;
            done.fence = done.fence.max(unlocked.fence);
            done.before.push(state);
        }
        Ok(done)
    }

    /// Deletes the idempotency record at `key` (e.g. a PROCESSING left by a crash, so the
    /// retry runs); returns it as it was. A running execution that still owns it can no
    /// longer record its outcome. Logged at warn.
    ///
    /// What is returned is what was deleted: the record is deleted only if it is still as
    /// read (same status, owner, start), else read again ([`Error::InProgress`] when it
    /// keeps changing), so a SUCCESS written just after the read is never deleted as the
    /// PROCESSING it replaced.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use redguard::{key::GuardKind, key::KeyBuilder, Redguard};
    /// use redguard::admin::Admin;
    ///
    /// let rg = Redguard::memory();
    /// let body = KeyBuilder::new().text("order:1").finish()?;
    /// rg.scope(redguard::idempotency(body).scope("shop").run(async { Ok::<_, redguard::Error>(1) }))
    ///     .await?;
    /// let admin = Admin::new(rg);
    /// let key = admin.key(GuardKind::Idempotency, "shop", "order:1")?;
    /// assert_eq!(admin.forget(&key).await?.unwrap().status, "success");
    /// assert!(admin.inspect(&key).await?.record.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn forget(&self, key: &AdminKey) -> Result<Option<RecordState>> {
        self.expect(key, GuardKind::Idempotency)?;
        let store = self.handle.store();
        let keys = std::slice::from_ref(&key.base);
        let mut attempts = 0;
        let (before, deleted) = loop {
            let snapshot = store.admin_read(keys).await?;
            let before = View::new(&snapshot).record(key.as_str());
            let deleted = match (&before, snapshot.entries.first().map(|e| &e.value)) {
                (Some(_), Some(Raw::Hash { fields, .. })) => {
                    u64::from(store.admin_forget(&key.base, fields).await?)
                }
                // Nothing there: nothing to delete (a begin may be writing one right now).
                (_, None | Some(Raw::Absent)) => 0,
                // Not a record redguard writes: no guard can be changing it.
                _ => store.admin_delete(keys).await?,
            };
            attempts += 1;
            if deleted > 0 || before.is_none() {
                break (before, deleted);
            }
            if attempts == 8 {
                return Err(Error::InProgress);
            }
        };
        tracing::warn!(
            key = %key.base,
            status = before.as_ref().map(|r| r.status.as_str()),
            owner = before.as_ref().map(|r| r.owner.as_str()),
            deleted,
            "redguard admin: idempotency record forgotten"
        );
        Ok(before)
    }

    /// Records an operator's verdict on the idempotency record at `key`, after reconciling
    /// what an execution with an unknown outcome did: [`Resolution::Succeeded`] with the
    /// value retries then replay, or [`Resolution::Failed`] so the next retry runs. Applies
    /// to an UNKNOWN or FAIL record; a PROCESSING one (an execution may be running: its
    /// outcome would be lost) or a SUCCESS one only with `force`. Checked and written in one
    /// atomic step; the record keeps its TTL and fingerprint. Refused (nothing written) with
    /// [`Error::Config`] when there is no record or it is not resolvable. Logged at warn.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use redguard::{key::GuardKind, idempotency::Idempotency, key::KeyBuilder, Redguard};
    /// use redguard::admin::{Admin, Resolution};
    ///
    /// let rg = Redguard::memory();
    /// let charge = || {
    ///     let key = KeyBuilder::new().text("charge:1").finish().unwrap();
    ///     // The gateway timed out: charged or not, nobody knows.
    ///     redguard::idempotency(key).scope("billing").run(async { Err::<u64, _>(redguard::Error::Timeout {
    ///         after: std::time::Duration::from_secs(2),
    ///     }) })
    /// };
    /// assert!(rg.scope(charge()).await.is_err());
    /// assert!(matches!(rg.scope(charge()).await, Err(redguard::Error::OutcomeUnknown)));
    ///
    /// // The gateway's books say it was charged, as charge 1999.
    /// let admin = Admin::new(rg.clone());
    /// let key = admin.key(GuardKind::Idempotency, "billing", "charge:1")?;
    /// let done = admin.resolve(&key, Resolution::Succeeded(1999.into()), false).await?;
    /// assert_eq!((done.was, done.now), ("unknown", "success"));
    /// assert_eq!(rg.scope(charge()).await?, 1999); // replayed, not charged again
    /// # Ok(()) }
    /// ```
    pub async fn resolve(
        &self,
        key: &AdminKey,
        resolution: Resolution,
        force: bool,
    ) -> Result<Resolve> {
        self.expect(key, GuardKind::Idempotency)?;
        let value = match &resolution {
            Resolution::Succeeded(value) => Some(value.to_string().into_bytes()),
            Resolution::Failed => None,
        };
        let resolved = self
            .handle
            .store()
            .idem_resolve(store::Resolve {
                key: &key.base,
                result: value.as_deref(),
                force,
            })
            .await?;
        let now = match resolution {
            Resolution::Succeeded(_) => IdemStatus::Success,
            Resolution::Failed => IdemStatus::Fail,
        };
        let was = match resolved {
            store::Resolved::Done(was) => was,
            store::Resolved::Missing => {
                return Err(Error::Config(format!(
                    "no idempotency record at {}: nothing to resolve",
                    key.as_str()
                )));
            }
            store::Resolved::Refused(status) => {
                let why = match status {
                    IdemStatus::Processing => {
                        "an execution may still be running (or crashed); its outcome would be overwritten"
                    }
                    _ => "it already holds a result that retries replay",
                };
                return Err(Error::Config(format!(
                    "the record at {} is {}: {why}; pass force to resolve it anyway",
                    key.as_str(),
                    status.as_str()
                )));
            }
        };
        tracing::warn!(
            key = %key.base,
            was = was.as_str(),
            now = now.as_str(),
            force,
            "redguard admin: idempotency record resolved"
        );
        Ok(Resolve {
            key: key.as_str().to_owned(),
            was: was.as_str(),
            now: now.as_str(),
        })
    }

    /// Deletes the rate-limit state at `key` and its penalty: the next call starts afresh.
    /// Returns how many keys existed. Logged at warn.
    ///
    /// A limit with `local = true` repeats refusals in each instance without asking the
    /// store: the reset is announced to every handle on the store (Redis pub/sub on the
    /// key), whose tiers forget the key when it arrives, and a tier asks the store again
    /// after a second in any case (a user without `PUBLISH`/`PSUBSCRIBE`, a lost message).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use redguard::{key::GuardKind, Redguard};
    /// use redguard::admin::Admin;
    ///
    /// let rg = Redguard::memory();
    /// let limiter = || redguard::limiter("export").rate("1/h").on(&rg);
    /// limiter().check().await?;
    /// assert!(!limiter().decide().await?.allowed);
    /// let admin = Admin::new(rg.clone());
    /// admin.reset(&admin.key(GuardKind::RateLimit, "limiter", "export")?).await?;
    /// assert!(limiter().decide().await?.allowed);
    /// # Ok(()) }
    /// ```
    pub async fn reset(&self, key: &AdminKey) -> Result<u64> {
        self.expect(key, GuardKind::RateLimit)?;
        let deleted = self
            .handle
            .store()
            .admin_delete(&[key.base.clone(), key.at("block")])
            .await?;
        self.forget_locally(&key.base).await;
        tracing::warn!(key = %key.base, deleted, "redguard admin: rate limit reset");
        Ok(deleted)
    }

    /// Gives back up to `units` units charged to the rate limit at `key` (a sliding log gives
    /// back whole calls, newest first); returns how many. A penalty is left as it is (see
    /// [`reset`](Admin::reset)). Logged at warn.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use redguard::{key::GuardKind, Redguard};
    /// use redguard::admin::Admin;
    ///
    /// let rg = Redguard::memory();
    /// let limiter = || redguard::limiter("sms").rate("2/h").on(&rg);
    /// limiter().check().await?;
    /// limiter().check().await?;
    /// let admin = Admin::new(rg.clone());
    /// assert_eq!(admin.refund(&admin.key(GuardKind::RateLimit, "limiter", "sms")?, 1).await?, 1);
    /// assert!(limiter().decide().await?.allowed); // the unit given back
    /// # Ok(()) }
    /// ```
    pub async fn refund(&self, key: &AdminKey, units: u64) -> Result<u64> {
        self.expect(key, GuardKind::RateLimit)?;
        let back = self.handle.store().admin_refund(&key.base, units).await?;
        self.forget_locally(&key.base).await;
        tracing::warn!(key = %key.base, units, back, "redguard admin: rate units refunded");
        Ok(back)
    }
}

impl Admin {
    /// Makes the local rate tiers forget `key`: this handle's at once, every other handle's
    /// on the store when the announcement reaches it. An announcement that fails is logged:
    /// those tiers ask the store again within a second anyway.
    async fn forget_locally(&self, key: &Key) {
        self.handle.state().rejections.remove(key);
        if let Err(err) = self.handle.store().admin_announce_reset(key).await {
            tracing::warn!(%key, error = %err, "redguard admin: the reset could not be announced; \
                local tiers see it within a second");
        }
    }
}

/// The key the lock of `kind` lives at.
fn lock_key(key: &AdminKey, kind: LockKindName) -> Key {
    match kind.suffix() {
        Some(suffix) => key.at(suffix),
        None => key.base.clone(),
    }
}
