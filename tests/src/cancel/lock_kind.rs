//! The lock kinds under test: how to build each, who keeps each from being taken, and whether
//! another owner can take one right now.

use std::time::Duration;

use redguard::lock::LockKind as Kind;
use redguard::{Error, Redguard, lock::LockBuilder, lock::LockGuard};

/// Lease of the locks under test: far longer than a settle, so a lock left behind by a drop
/// is still there when the checks look.
pub const LEASE: Duration = Duration::from_secs(5);

/// Permits of the semaphore under test.
pub const PERMITS: u32 = 2;

/// A kind of lock (`LockBuilder::fair`, `permits`, `read`, `write`, or none of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// The plain reentrant lock.
    Exclusive,
    /// Handed over in arrival order; reentrant.
    Fair,
    /// [`PERMITS`] holders at once.
    Semaphore,
    /// The read/write lock in read mode.
    Read,
    /// The read/write lock in write mode.
    Write,
}

impl LockKind {
    /// Every kind.
    pub const ALL: [LockKind; 5] = [
        LockKind::Exclusive,
        LockKind::Fair,
        LockKind::Semaphore,
        LockKind::Read,
        LockKind::Write,
    ];

    /// The two reentrant kinds.
    pub const REENTRANT: [LockKind; 2] = [LockKind::Exclusive, LockKind::Fair];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            LockKind::Exclusive => "exclusive",
            LockKind::Fair => "fair",
            LockKind::Semaphore => "semaphore",
            LockKind::Read => "read",
            LockKind::Write => "write",
        }
    }

    /// A builder of this kind at `key` (default scope), leased for [`LEASE`].
    pub fn builder(self, rg: &Redguard, key: &str) -> LockBuilder<Kind> {
        let kind = match self {
            LockKind::Exclusive => Kind::Exclusive,
            LockKind::Fair => Kind::Fair,
            LockKind::Semaphore => Kind::Semaphore { permits: PERMITS },
            LockKind::Read => Kind::Read,
            LockKind::Write => Kind::Write,
        };
        rg.lock(key).kind(kind).lease(LEASE)
    }

    /// The Redis hash holding `owner`, `depth` and `fence` of a reentrant lock at `key`.
    pub fn hash(self, key: &str) -> String {
        let suffix = match self {
            LockKind::Fair => ":fair",
            LockKind::Write | LockKind::Read => ":rw",
            LockKind::Semaphore => ":sem",
            LockKind::Exclusive => "",
        };
        format!("redguard:lock:{{lock:{key}}}{suffix}")
    }

    /// Takes, as other owners, what keeps this kind from being taken at `key`: the same lock
    /// (exclusive, fair, write), every permit (semaphore), a writer (read).
    pub async fn hold_against(self, rg: &Redguard, key: &str) -> Vec<LockGuard> {
        let (rg, key) = (rg.clone(), key.to_owned());
        // From a task of its own: not a nested entry of a lock the caller's task holds.
        tokio::spawn(async move {
            let (holder, count) = self.rival();
            let mut guards = Vec::new();
            for _ in 0..count {
                let guard = holder.builder(&rg, &key).acquire().await;
                guards.push(guard.expect("take the lock a case contends for"));
            }
            guards
        })
        .await
        .expect("holder task")
    }

    /// Whether another owner can take this kind at `key` whole right now (a writer for a
    /// read lock, since readers share; every permit of a semaphore). What it takes it gives
    /// back.
    pub async fn free_for_others(self, rg: &Redguard, key: &str) -> Result<bool, Error> {
        let (rg, key) = (rg.clone(), key.to_owned());
        tokio::spawn(async move {
            let (probe, count) = self.rival();
            let mut taken = Vec::new();
            for _ in 0..count {
                match probe.builder(&rg, &key).try_acquire().await? {
                    Some(guard) => taken.push(guard),
                    None => break,
                }
            }
            let free = taken.len() == count;
            for guard in taken {
                guard.release().await?;
            }
            Ok(free)
        })
        .await
        .expect("probe task")
    }

    /// The kind, and how many of it, that excludes this kind entirely.
    fn rival(self) -> (LockKind, usize) {
        match self {
            LockKind::Read => (LockKind::Write, 1),
            LockKind::Semaphore => (LockKind::Semaphore, PERMITS as usize),
            other => (other, 1),
        }
    }
}
