//! The store operations of each lock kind: renew, release, and undo an acquisition whose
//! outcome is unknown.

use std::time::Duration;

use crate::error::Result;
use crate::key::Key;
use crate::store::{LockRelease, Release, Store, rw_readers};
use crate::values::LockKind;

/// Extends `owner`'s lease; false when the lock is no longer `owner`'s.
pub(super) async fn renew(
    kind: LockKind,
    store: &dyn Store,
    key: &Key,
    owner: &str,
    lease: Duration,
) -> Result<bool> {
    match kind {
        LockKind::Exclusive | LockKind::Write | LockKind::Fair => {
            store.lock_renew(key, owner, lease).await
        }
        LockKind::Semaphore { .. } => store.semaphore_renew(key, owner, lease).await,
        LockKind::Read => store.semaphore_renew(&rw_readers(key), owner, lease).await,
    }
}

/// Leaves `level` of the lock (and every level above it: leaving a level twice changes
/// nothing). Semaphores and read/write locks have one level.
pub(super) async fn release(
    kind: LockKind,
    store: &dyn Store,
    key: &Key,
    owner: &str,
    level: u32,
    keep: Duration,
) -> Result<LockRelease> {
    let release = Release {
        key,
        owner,
        level,
        keep,
    };
    match kind {
        LockKind::Exclusive | LockKind::Write => store.lock_release(release).await,
        LockKind::Fair => store.fair_release(release).await,
        LockKind::Semaphore { .. } => store.semaphore_release(key, owner).await,
        LockKind::Read => store.rw_release_read(key, owner).await,
    }
}

/// Undoes an acquisition whose outcome is unknown (its future was dropped in flight, or the
/// store call failed): it may have run, or may still run when a stalled store resumes. Sent
/// after it on the same connection, so the store applies it after the acquisition; an
/// acquisition that never happened makes it a no-op. A fair waiter also gives up its place
/// (passing on a lock it was handed meanwhile).
pub(super) async fn undo(
    kind: LockKind,
    store: &dyn Store,
    key: &Key,
    owner: &str,
    level: u32,
) -> Result<()> {
    match kind {
        LockKind::Fair if level == 1 => store.fair_leave(key, owner).await,
        _ => release(kind, store, key, owner, level, Duration::ZERO)
            .await
            .map(drop),
    }
}
