//! Lock operations in memory.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;

use super::table::{Live, Table};
use super::{MemoryStore, Shard};
use crate::error::Result;
use crate::key::Key;
use crate::store::admin::{Raw, SNAPSHOT_MEMBERS};
use crate::store::lock::{FAIR_REGISTRATION, FENCE_TTL, WRITER_INTENT, rw_readers};
use crate::store::{Acquire, LockAcquire, LockOps, LockRelease, LockWatch, Release};

/// Holders of a semaphore and when each lease ends.
pub(super) type Holders = HashMap<String, Duration>;

/// Stores `holders` back, living as long as the longest lease; an empty set is dropped.
fn put_holders(sems: &mut Live<'_, Holders>, key: &Key, holders: Holders) {
    if let Some(last) = holders.values().max().copied() {
        sems.put(key, holders, last);
    }
}

/// Waiters of a fair lock in arrival order, each with the end of its registration.
pub(super) type FairQueue = Vec<(String, Duration)>;

/// Stores `queue` back, living as long as its last registration; an empty one is dropped.
fn put_queue(queues: &mut Live<'_, FairQueue>, key: &Key, queue: FairQueue) {
    if let Some(last) = queue.iter().map(|(_, until)| *until).max() {
        queues.put(key, queue, last);
    }
}

/// Holders (or fair waiters' registrations) as the scripts' sorted set: owner -> ms.
pub(super) fn raw_set<'a>(members: impl Iterator<Item = (&'a str, Duration)>) -> Raw {
    let mut members: Vec<(String, f64)> = members
        .map(|(owner, at)| (owner.to_owned(), at.as_millis() as f64))
        .collect();
    members.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    let card = members.len() as u64;
    members.truncate(SNAPSHOT_MEMBERS);
    Raw::ZSet { card, members }
}

/// A fair queue as the scripts' queue: owner -> arrival ticket.
pub(super) fn raw_tickets(queue: &FairQueue) -> Raw {
    let card = queue.len() as u64;
    let members = queue
        .iter()
        .take(SNAPSHOT_MEMBERS)
        .enumerate()
        .map(|(i, (owner, _))| (owner.clone(), (i + 1) as f64))
        .collect();
    Raw::ZSet { card, members }
}

#[derive(Debug)]
pub(super) struct LockState {
    /// Empty while a released lock is kept for `hold_at_least`: nobody can renew or enter it.
    owner: String,
    depth: u32,
    fence: u64,
}

impl LockState {
    /// The holder's owner token (empty while kept for `hold_at_least`).
    pub(super) fn owner(&self) -> &str {
        &self.owner
    }

    /// The lock as the scripts store it: a hash, or (a writer's announcement) its owner.
    pub(super) fn raw(&self, intent: bool) -> Raw {
        if intent {
            return Raw::Text(self.owner.clone());
        }
        Raw::Hash {
            fields: vec![
                ("owner".to_owned(), self.owner.clone()),
                ("depth".to_owned(), self.depth.to_string()),
                ("fence".to_owned(), self.fence.to_string()),
            ],
            result_len: None,
        }
    }
}

impl MemoryStore {
    /// The exclusive acquisition, on the shard already locked (fair locks call it after
    /// checking their queue, atomically).
    fn acquire_in(
        locks: &mut Live<'_, LockState>,
        fences: &mut Table<u64>,
        now: Duration,
        key: &Key,
        owner: &str,
        lease: Duration,
        level: u32,
    ) -> LockAcquire {
        if let Some(state) = locks.get_mut(key) {
            if state.owner != owner || owner.is_empty() {
                if level > 1 {
                    return LockAcquire::Lost;
                }
                let ttl = locks
                    .expires_at(key)
                    .map_or(Duration::ZERO, |at| at.saturating_sub(now));
                return LockAcquire::Held { ttl };
            }
            // Naming the level makes the entry idempotent, as in the script.
            state.depth = state.depth.max(level);
            let (fence, depth) = (state.fence, state.depth);
            // A nested entry may extend the lease, never shorten the outer level's.
            if locks.expires_at(key).is_some_and(|at| at < now + lease) {
                locks.set_expiry(key, now + lease);
            }
            return LockAcquire::Acquired { fence, depth };
        }
        if level > 1 {
            return LockAcquire::Lost;
        }
        let fence = Self::next_fence(fences, key, now, lease);
        let state = LockState {
            owner: owner.to_owned(),
            depth: 1,
            fence,
        };
        locks.put(key, state, now + lease);
        LockAcquire::Acquired { fence, depth: 1 }
    }

    /// The next fencing token of `key`, as the scripts' `next_fence`: above the counter and
    /// never below the clock in microseconds.
    fn next_fence(fences: &mut Table<u64>, key: &Key, now: Duration, lease: Duration) -> u64 {
        let fence_key = key.companion("fence");
        let mut fences = fences.at(now);
        let clock = u64::try_from(now.as_micros()).unwrap_or(u64::MAX);
        let fence = fences
            .get(&fence_key)
            .map_or(0, |last| last.saturating_add(1))
            .max(clock);
        fences.put(&fence_key, fence, now + FENCE_TTL.max(lease));
        fence
    }

    /// Leaves `level` of the lock at `key` (and every level above it); true when that freed
    /// the key.
    fn leave(
        locks: &mut Live<'_, LockState>,
        now: Duration,
        key: &Key,
        owner: &str,
        level: u32,
        keep: Duration,
    ) -> (LockRelease, bool) {
        let Some(state) = locks.get_mut(key) else {
            return (LockRelease::NotOwner, false);
        };
        if owner.is_empty() || state.owner != owner {
            return (LockRelease::NotOwner, false);
        }
        if level > 1 {
            state.depth = state.depth.min(level - 1);
            return (LockRelease::Nested { depth: state.depth }, false);
        }
        if keep.is_zero() {
            locks.remove(key);
            return (LockRelease::Released, true);
        }
        state.owner.clear();
        state.depth = 0;
        locks.set_expiry(key, now + keep);
        (LockRelease::Released, false)
    }

    /// The fair lock's release (or, `leaving`, a waiter giving up its place), as
    /// `fair_release.lua` does it: a free lock is handed to the first waiter still
    /// registered, which alone is told.
    fn fair_leave_or_release(
        &self,
        key: &Key,
        owner: &str,
        level: u32,
        keep: Duration,
        leaving: bool,
    ) -> LockRelease {
        let (mut shard, now) = self.shard(key);
        let Shard {
            locks,
            fair_queues,
            fences,
            ..
        } = &mut *shard;
        let mut locks = locks.at(now);
        let queue_key = key.companion("queue");
        let mut queues = fair_queues.at(now);
        let mut queue = queues.remove(&queue_key).unwrap_or_default();
        let released = if leaving {
            queue.retain(|(waiter, _)| waiter != owner);
            // A waiter giving up may have been handed the lock meanwhile: it passes it on.
            if locks.get(key).is_some_and(|state| state.owner == owner) {
                locks.remove(key);
            }
            LockRelease::Released
        } else {
            Self::leave(&mut locks, now, key, owner, level, keep).0
        };
        queue.retain(|(_, until)| *until > now);
        let handed = if locks.get(key).is_none() && !queue.is_empty() {
            let (head, _) = queue.remove(0);
            match Self::acquire_in(&mut locks, fences, now, key, &head, FAIR_REGISTRATION, 1) {
                LockAcquire::Acquired { fence, .. } => Some((head, fence)),
                LockAcquire::Held { .. } | LockAcquire::Lost => None,
            }
        } else {
            None
        };
        put_queue(&mut queues, &queue_key, queue);
        drop(shard);
        if let Some((head, fence)) = handed {
            self.tables
                .lock_waiters
                .hand_over(key.as_str(), &head, fence);
        }
        released
    }
}

#[async_trait]
impl LockOps for MemoryStore {
    async fn lock_acquire(&self, acquire: Acquire<'_>) -> Result<LockAcquire> {
        let Acquire {
            key,
            owner,
            lease,
            level,
            ..
        } = acquire;
        let (mut shard, now) = self.shard(key);
        let Shard { locks, fences, .. } = &mut *shard;
        let mut locks = locks.at(now);
        Ok(Self::acquire_in(
            &mut locks, fences, now, key, owner, lease, level,
        ))
    }

    async fn lock_renew(&self, key: &Key, owner: &str, lease: Duration) -> Result<bool> {
        let (mut shard, now) = self.shard(key);
        let mut locks = shard.locks.at(now);
        let owned = locks
            .get(key)
            .is_some_and(|state| !owner.is_empty() && state.owner == owner);
        if owned {
            locks.set_expiry(key, now + lease);
        }
        Ok(owned)
    }

    async fn lock_release(&self, release: Release<'_>) -> Result<LockRelease> {
        let Release {
            key,
            owner,
            level,
            keep,
        } = release;
        let (mut shard, now) = self.shard(key);
        let mut locks = shard.locks.at(now);
        let (released, freed) = Self::leave(&mut locks, now, key, owner, level, keep);
        drop(shard);
        if freed {
            self.tables.lock_waiters.notify(key.as_str());
        }
        Ok(released)
    }

    async fn semaphore_acquire(&self, acquire: Acquire<'_>, permits: u32) -> Result<LockAcquire> {
        let Acquire {
            key, owner, lease, ..
        } = acquire;
        let (mut shard, now) = self.shard(key);
        let Shard {
            semaphores, fences, ..
        } = &mut *shard;
        let mut sems = semaphores.at(now);
        let mut holders = sems.remove(key).unwrap_or_default();
        holders.retain(|_, until| *until > now);
        let count = u32::try_from(holders.len()).unwrap_or(u32::MAX);
        if count >= permits {
            let first = holders.values().min().copied().unwrap_or(now);
            let ttl = first.saturating_sub(now);
            put_holders(&mut sems, key, holders);
            return Ok(LockAcquire::Held { ttl });
        }
        let fence = Self::next_fence(fences, key, now, lease);
        holders.insert(owner.to_owned(), now + lease);
        put_holders(&mut sems, key, holders);
        Ok(LockAcquire::Acquired { fence, depth: 1 })
    }

    async fn semaphore_renew(&self, key: &Key, owner: &str, lease: Duration) -> Result<bool> {
        let (mut shard, now) = self.shard(key);
        let mut sems = shard.semaphores.at(now);
        let Some(mut holders) = sems.remove(key) else {
            return Ok(false);
        };
        holders.retain(|_, until| *until > now);
        let renewed = match holders.get_mut(owner) {
            Some(until) => {
                *until = now + lease;
                true
            }
            None => false,
        };
        put_holders(&mut sems, key, holders);
        Ok(renewed)
    }

    async fn semaphore_release(&self, key: &Key, owner: &str) -> Result<LockRelease> {
        let (mut shard, now) = self.shard(key);
        let mut sems = shard.semaphores.at(now);
        let Some(mut holders) = sems.remove(key) else {
            return Ok(LockRelease::NotOwner);
        };
        // A lease that ran out lost its slot, dropped or not.
        holders.retain(|_, until| *until > now);
        let released = holders.remove(owner).is_some();
        put_holders(&mut sems, key, holders);
        drop(shard);
        if !released {
            return Ok(LockRelease::NotOwner);
        }
        self.tables.lock_waiters.notify(key.as_str());
        Ok(LockRelease::Released)
    }

    async fn rw_acquire(&self, acquire: Acquire<'_>, write: bool) -> Result<LockAcquire> {
        let Acquire {
            key,
            owner,
            lease,
            waiting: announce,
            ..
        } = acquire;
        let (mut shard, now) = self.shard(key);
        let Shard {
            locks,
            semaphores,
            fences,
            ..
        } = &mut *shard;
        let mut locks = locks.at(now);
        if let Some(at) = locks.expires_at(key) {
            return Ok(LockAcquire::Held {
                ttl: at.saturating_sub(now),
            });
        }
        let intent_key = key.companion("intent");
        let intent = locks.get(&intent_key).map(|state| state.owner.clone());
        let intent_ttl = locks
            .expires_at(&intent_key)
            .map_or(Duration::ZERO, |at| at.saturating_sub(now));
        let readers_key = rw_readers(key);
        let mut sems = semaphores.at(now);
        let mut readers = sems.remove(&readers_key).unwrap_or_default();
        readers.retain(|_, until| *until > now);
        if write {
            if let Some(first) = readers.values().min().copied() {
                put_holders(&mut sems, &readers_key, readers);
                if announce && intent.as_deref().is_none_or(|intent| intent == owner) {
                    let state = LockState {
                        owner: owner.to_owned(),
                        depth: 0,
                        fence: 0,
                    };
                    locks.put(&intent_key, state, now + WRITER_INTENT);
                }
                return Ok(LockAcquire::Held {
                    ttl: first.saturating_sub(now),
                });
            }
            if intent.as_deref().is_some_and(|intent| intent != owner) {
                return Ok(LockAcquire::Held { ttl: intent_ttl });
            }
            locks.remove(&intent_key);
        } else if intent.is_some() {
            put_holders(&mut sems, &readers_key, readers);
            return Ok(LockAcquire::Held { ttl: intent_ttl });
        }
        let fence = Self::next_fence(fences, key, now, lease);
        if write {
            let state = LockState {
                owner: owner.to_owned(),
                depth: 1,
                fence,
            };
            locks.put(key, state, now + lease);
        } else {
            readers.insert(owner.to_owned(), now + lease);
        }
        put_holders(&mut sems, &readers_key, readers);
        Ok(LockAcquire::Acquired { fence, depth: 1 })
    }

    async fn rw_release_read(&self, key: &Key, owner: &str) -> Result<LockRelease> {
        let (mut shard, now) = self.shard(key);
        let mut sems = shard.semaphores.at(now);
        let readers_key = rw_readers(key);
        let Some(mut readers) = sems.remove(&readers_key) else {
            return Ok(LockRelease::NotOwner);
        };
        // A lease that ran out lost its read lock, dropped or not.
        readers.retain(|_, until| *until > now);
        let released = readers.remove(owner).is_some();
        put_holders(&mut sems, &readers_key, readers);
        drop(shard);
        if !released {
            return Ok(LockRelease::NotOwner);
        }
        self.tables.lock_waiters.notify(key.as_str());
        Ok(LockRelease::Released)
    }

    async fn fair_acquire(&self, acquire: Acquire<'_>) -> Result<LockAcquire> {
        let Acquire {
            key,
            owner,
            lease,
            level,
            waiting: join,
            ..
        } = acquire;
        let (mut shard, now) = self.shard(key);
        let Shard {
            locks,
            fair_queues,
            fences,
            ..
        } = &mut *shard;
        let mut locks = locks.at(now);
        let queue_key = key.companion("queue");
        let mut queues = fair_queues.at(now);
        let mut queue = queues.remove(&queue_key).unwrap_or_default();
        // Waiters that stopped retrying (gave up, crashed) lose their place.
        queue.retain(|(_, until)| *until > now);
        let held_by = locks.get(key).map(|state| state.owner.clone());
        let outcome = match held_by {
            Some(current) if !owner.is_empty() && current == owner && level == 1 => {
                // Handed over while we waited (the notice may not have reached us).
                put_queue(&mut queues, &queue_key, queue);
                let fence = locks.get(key).map_or(0, |state| state.fence);
                locks.set_expiry(key, now + lease);
                return Ok(LockAcquire::Acquired { fence, depth: 1 });
            }
            _ if level > 1 => {
                put_queue(&mut queues, &queue_key, queue);
                return Ok(Self::acquire_in(
                    &mut locks, fences, now, key, owner, lease, level,
                ));
            }
            None if queue.first().is_none_or(|(head, _)| head == owner) => {
                queue.retain(|(waiter, _)| waiter != owner);
                put_queue(&mut queues, &queue_key, queue);
                return Ok(Self::acquire_in(
                    &mut locks, fences, now, key, owner, lease, 1,
                ));
            }
            Some(_) => LockAcquire::Held {
                ttl: locks
                    .expires_at(key)
                    .map_or(Duration::ZERO, |at| at.saturating_sub(now)),
            },
            None => LockAcquire::Held {
                ttl: FAIR_REGISTRATION / 10,
            },
        };
        if join {
            let until = now + FAIR_REGISTRATION;
            match queue.iter_mut().find(|(waiter, _)| waiter == owner) {
                Some(place) => place.1 = until,
                None => queue.push((owner.to_owned(), until)),
            }
        }
        put_queue(&mut queues, &queue_key, queue);
        Ok(outcome)
    }

    async fn fair_release(&self, release: Release<'_>) -> Result<LockRelease> {
        let Release {
            key,
            owner,
            level,
            keep,
        } = release;
        Ok(self.fair_leave_or_release(key, owner, level, keep, false))
    }

    async fn fair_leave(&self, key: &Key, owner: &str) -> Result<()> {
        self.fair_leave_or_release(key, owner, 1, Duration::ZERO, true);
        Ok(())
    }

    async fn lock_watch(&self, key: &Key) -> LockWatch {
        self.tables.lock_waiters.watch(key.as_str(), true)
    }

    async fn fair_watch(&self, key: &Key, owner: &str) -> LockWatch {
        self.tables
            .lock_waiters
            .watch_handed(key.as_str(), owner, true)
    }
}
