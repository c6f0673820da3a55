//! Locks as the guide ("Locks") and the `LockOps` contract describe them: exclusive locks with
//! named reentrant levels and leases, `hold_at_least` keeps, fair locks handed over in
//! arrival order, semaphores and read/write locks, every acquisition fenced with
//! max(counter + 1, clock in µs).
//!
//! Keys are the store keys of each kind (a fair lock, a semaphore and a read/write lock live
//! at keys of their own); each has its own fencing counter.

use std::collections::BTreeMap;

/// How long a fair waiter keeps its place after an attempt, and a handed lock is held for
/// its new holder (µs).
pub const FAIR_REGISTRATION: u64 = 2_000_000;
/// How long a writer blocked by readers keeps new readers out (µs).
pub const WRITER_INTENT: u64 = 2_000_000;
/// How long a fencing counter outlives its last acquisition (µs), at least the lease.
pub const FENCE_TTL: u64 = 7 * 24 * 3600 * 1_000_000;

/// What an acquisition got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    Acquired {
        fence: u64,
        depth: u32,
    },
    /// Held by someone else for `ttl_us` more (or, for a free fair lock promised to the
    /// queue's head, a poll interval).
    Held {
        ttl_us: u64,
    },
    /// A nested level whose owner no longer holds the lock.
    Lost,
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    Released,
    Nested { depth: u32 },
    NotOwner,
}

/// A lock entry: its owner (`None` while `hold_at_least` keeps it for nobody), depth, fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub owner: Option<String>,
    pub depth: u32,
    pub fence: u64,
    pub expires: u64,
}

/// Every lock-kind key's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockModel {
    /// Exclusive, fair and read/write writer entries.
    pub locks: BTreeMap<String, Entry>,
    /// Fencing counters: last token and expiry.
    pub counters: BTreeMap<String, (u64, u64)>,
    /// Semaphore holders, and read/write readers: owner → lease end.
    pub holders: BTreeMap<String, BTreeMap<String, u64>>,
    /// A writer waiting for readers: owner and end of its announcement.
    pub intents: BTreeMap<String, (String, u64)>,
    /// Fair waiters in arrival order with the end of their registration.
    pub queues: BTreeMap<String, Vec<(String, u64)>>,
}

impl LockModel {
    /// Forgets whatever expired by `now`: leases, keeps, registrations, announcements.
    pub fn expire(&mut self, now: u64) {
        self.locks.retain(|_, entry| entry.expires > now);
        self.counters.retain(|_, (_, expires)| *expires > now);
        for holders in self.holders.values_mut() {
            holders.retain(|_, end| *end > now);
        }
        self.holders.retain(|_, holders| !holders.is_empty());
        self.intents.retain(|_, (_, end)| *end > now);
        for queue in self.queues.values_mut() {
            queue.retain(|(_, until)| *until > now);
        }
        self.queues.retain(|_, queue| !queue.is_empty());
    }

    fn next_fence(&mut self, key: &str, now: u64, lease: u64) -> u64 {
        let last = self.counters.get(key).map_or(0, |(last, _)| last + 1);
        let fence = last.max(now);
        self.counters
            .insert(key.to_owned(), (fence, now + FENCE_TTL.max(lease)));
        fence
    }

    fn held_by(&self, key: &str, owner: &str) -> bool {
        self.locks
            .get(key)
            .is_some_and(|entry| entry.owner.as_deref() == Some(owner))
    }

    /// At level 1 takes a free lock; at level n enters the n-th level of a lock `owner`
    /// holds (the depth becomes at least n; the lease only ever extends).
    pub fn acquire(&mut self, key: &str, owner: &str, lease: u64, level: u32, now: u64) -> Acquire {
        self.expire(now);
        if let Some(entry) = self.locks.get_mut(key) {
            if entry.owner.as_deref() == Some(owner) {
                entry.depth = entry.depth.max(level);
                entry.expires = entry.expires.max(now + lease);
                return Acquire::Acquired {
                    fence: entry.fence,
                    depth: entry.depth,
                };
            }
            if level > 1 {
                return Acquire::Lost;
            }
            return Acquire::Held {
                ttl_us: entry.expires - now,
            };
        }
        if level > 1 {
            return Acquire::Lost;
        }
        let fence = self.next_fence(&counter(key), now, lease);
        self.take(key, owner, fence, now + lease);
        Acquire::Acquired { fence, depth: 1 }
    }

    fn take(&mut self, key: &str, owner: &str, fence: u64, expires: u64) {
        let entry = Entry {
            owner: Some(owner.to_owned()),
            depth: 1,
            fence,
            expires,
        };
        self.locks.insert(key.to_owned(), entry);
    }

    /// Sets the lease of `owner`'s lock to `lease` from now.
    pub fn renew(&mut self, key: &str, owner: &str, lease: u64, now: u64) -> bool {
        self.expire(now);
        match self.locks.get_mut(key) {
            Some(entry) if entry.owner.as_deref() == Some(owner) => {
                entry.expires = now + lease;
                true
            }
            _ => false,
        }
    }

    /// Leaves `level` and every level above it; level 1 frees the key, or keeps it taken by
    /// nobody for `keep` more.
    pub fn release(&mut self, key: &str, owner: &str, level: u32, keep: u64, now: u64) -> Release {
        self.expire(now);
        let Some(entry) = self.locks.get_mut(key) else {
            return Release::NotOwner;
        };
        if entry.owner.as_deref() != Some(owner) {
            return Release::NotOwner;
        }
        if level > 1 {
            entry.depth = entry.depth.min(level - 1);
            return Release::Nested { depth: entry.depth };
        }
        if keep > 0 {
            entry.owner = None;
            entry.depth = 0;
            entry.expires = now + keep;
        } else {
            self.locks.remove(key);
        }
        Release::Released
    }

    /// One of `permits` slots, each holder with its own lease.
    pub fn sem_acquire(
        &mut self,
        key: &str,
        owner: &str,
        permits: u32,
        lease: u64,
        now: u64,
    ) -> Acquire {
        self.expire(now);
        let holders = self.holders.get(key);
        let taken = holders.map_or(0, BTreeMap::len);
        if taken >= permits as usize {
            let first = holders
                .and_then(|h| h.values().min())
                .copied()
                .unwrap_or(now);
            return Acquire::Held {
                ttl_us: first - now,
            };
        }
        let fence = self.next_fence(&counter(key), now, lease);
        self.holders
            .entry(key.to_owned())
            .or_default()
            .insert(owner.to_owned(), now + lease);
        Acquire::Acquired { fence, depth: 1 }
    }

    /// Extends a semaphore holder's (or a reader's) lease.
    pub fn holder_renew(&mut self, key: &str, owner: &str, lease: u64, now: u64) -> bool {
        self.expire(now);
        match self.holders.get_mut(key).and_then(|h| h.get_mut(owner)) {
            Some(end) => {
                *end = now + lease;
                true
            }
            None => false,
        }
    }

    /// Gives a semaphore slot (or a read lock) back; a lease that ran out was lost already.
    pub fn holder_release(&mut self, key: &str, owner: &str, now: u64) -> Release {
        self.expire(now);
        let released = self
            .holders
            .get_mut(key)
            .and_then(|holders| holders.remove(owner))
            .is_some();
        self.holders.retain(|_, holders| !holders.is_empty());
        if released {
            Release::Released
        } else {
            Release::NotOwner
        }
    }

    /// The read/write lock at `key`: a writer excludes everyone; readers exclude writers; a
    /// writer blocked by readers announces itself (`announce`) and keeps new readers out.
    pub fn rw_acquire(
        &mut self,
        key: &str,
        owner: &str,
        write: bool,
        lease: u64,
        announce: bool,
        now: u64,
    ) -> Acquire {
        self.expire(now);
        if let Some(entry) = self.locks.get(key) {
            return Acquire::Held {
                ttl_us: entry.expires - now,
            };
        }
        let readers_key = readers(key);
        let intent = self.intents.get(key).cloned();
        if write {
            if let Some(first) = self
                .holders
                .get(&readers_key)
                .and_then(|r| r.values().min())
            {
                let ttl_us = first - now;
                if announce && intent.as_ref().is_none_or(|(by, _)| by == owner) {
                    self.intents
                        .insert(key.to_owned(), (owner.to_owned(), now + WRITER_INTENT));
                }
                return Acquire::Held { ttl_us };
            }
            if let Some((by, end)) = &intent
                && by != owner
            {
                return Acquire::Held { ttl_us: end - now };
            }
            self.intents.remove(key);
            let fence = self.next_fence(&counter(key), now, lease);
            self.take(key, owner, fence, now + lease);
            return Acquire::Acquired { fence, depth: 1 };
        }
        if let Some((_, end)) = intent {
            return Acquire::Held { ttl_us: end - now };
        }
        let fence = self.next_fence(&counter(key), now, lease);
        self.holders
            .entry(readers_key)
            .or_default()
            .insert(owner.to_owned(), now + lease);
        Acquire::Acquired { fence, depth: 1 }
    }

    /// A fair lock: a free lock goes to the first waiter still registered; `join` takes (or
    /// keeps) a place in the queue when the lock is not the caller's.
    pub fn fair_acquire(
        &mut self,
        key: &str,
        owner: &str,
        lease: u64,
        level: u32,
        join: bool,
        now: u64,
    ) -> Acquire {
        self.expire(now);
        if self.held_by(key, owner) {
            let entry = self.locks.get_mut(key).expect("held");
            if level == 1 {
                // Handed over while it waited: it takes it up, for its own lease.
                entry.expires = now + lease;
                return Acquire::Acquired {
                    fence: entry.fence,
                    depth: 1,
                };
            }
            entry.depth = entry.depth.max(level);
            entry.expires = entry.expires.max(now + lease);
            return Acquire::Acquired {
                fence: entry.fence,
                depth: entry.depth,
            };
        }
        if level > 1 {
            return Acquire::Lost;
        }
        let queue = self.queues.entry(key.to_owned()).or_default();
        let held = self.locks.get(key).map(|entry| entry.expires - now);
        if held.is_none() && queue.first().is_none_or(|(head, _)| head == owner) {
            queue.retain(|(waiter, _)| waiter != owner);
            self.queues.retain(|_, queue| !queue.is_empty());
            let fence = self.next_fence(&counter(key), now, lease);
            self.take(key, owner, fence, now + lease);
            return Acquire::Acquired { fence, depth: 1 };
        }
        if join {
            let until = now + FAIR_REGISTRATION;
            match queue.iter_mut().find(|(waiter, _)| waiter == owner) {
                Some(place) => place.1 = until,
                None => queue.push((owner.to_owned(), until)),
            }
        }
        self.queues.retain(|_, queue| !queue.is_empty());
        Acquire::Held {
            ttl_us: held.unwrap_or(FAIR_REGISTRATION / 10),
        }
    }

    /// Leaves a level of a fair lock; a lock left free goes to the first waiter still
    /// registered, for [`FAIR_REGISTRATION`] until it takes it up.
    pub fn fair_release(
        &mut self,
        key: &str,
        owner: &str,
        level: u32,
        keep: u64,
        now: u64,
    ) -> Release {
        let released = self.release(key, owner, level, keep, now);
        self.hand_over(key, now);
        released
    }

    /// A waiter giving up its place (passing on a lock handed to it meanwhile).
    pub fn fair_leave(&mut self, key: &str, owner: &str, now: u64) {
        self.expire(now);
        if let Some(queue) = self.queues.get_mut(key) {
            queue.retain(|(waiter, _)| waiter != owner);
        }
        self.queues.retain(|_, queue| !queue.is_empty());
        if self.held_by(key, owner) {
            self.locks.remove(key);
        }
        self.hand_over(key, now);
    }

    fn hand_over(&mut self, key: &str, now: u64) {
        if self.locks.contains_key(key) {
            return;
        }
        let Some(queue) = self.queues.get_mut(key) else {
            return;
        };
        let (head, _) = queue.remove(0);
        self.queues.retain(|_, queue| !queue.is_empty());
        let fence = self.next_fence(&counter(key), now, FAIR_REGISTRATION);
        self.take(key, &head, fence, now + FAIR_REGISTRATION);
    }
}

/// The fencing counter of the lock at `key` (its own key in the model).
fn counter(key: &str) -> String {
    format!("{key}#fence")
}

/// The readers of the read/write lock at `key`.
pub fn readers(key: &str) -> String {
    format!("{key}#readers")
}
