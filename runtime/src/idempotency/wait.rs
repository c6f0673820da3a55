//! A duplicate that waits for the first execution's outcome instead of being refused with
//! [`Error::InProgress`](crate::Error::InProgress): woken by the notification the end of
//! that execution publishes (the lock releases' subscription, one per handle), it begins
//! again and gets the replay, or runs the retry a business failure allows, until its `wait`
//! runs out.
//!
//! Calls per duplicate: one begin to find the first in progress, then one per end it is
//! woken by (a failure's retry that another duplicate won is another wait), plus one per
//! [`SAFETY_POLL`] of waiting and one when `wait` runs out: O(1), never a busy loop. Without
//! notifications (an ACL without `PSUBSCRIBE`) it polls every [`POLL`].

use std::time::Duration;

use tokio::time::Instant;

use crate::handle::Redguard;
use crate::key::Key;
use crate::store::LockWatch;

/// With live notifications, how often a waiter still asks. Rarely: the ends that publish
/// nothing are rare and slow (a crashed first execution's record expires `expire` after its
/// last renewal, at least 1 s; an operator forgets the record), a lost subscription wakes
/// every waiter itself, and a waiter asks once more when its `wait` runs out anyway.
pub(super) const SAFETY_POLL: Duration = Duration::from_secs(5);

/// Without notifications, how often a waiter asks.
pub(super) const POLL: Duration = Duration::from_millis(100);

/// A duplicate's wait: the subscription, taken before its first begin, and the deadline.
pub(super) struct Waiting {
    watch: LockWatch,
    deadline: Instant,
}

impl Waiting {
    /// Subscribes to the end of the execution at `key`, before the begin that may find it in
    /// progress, so an end in between still wakes this waiter.
    pub(super) async fn start(handle: &Redguard, key: &Key, wait: Duration) -> Waiting {
        let deadline = Instant::now() + wait;
        Waiting {
            watch: handle.store().idem_watch(key).await,
            deadline,
        }
    }

    /// Sleeps until the record may have changed (a notification, a poll); false once the
    /// deadline has passed, and the duplicate is then refused as in progress.
    pub(super) async fn next(&mut self) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        let poll = if self.watch.is_live() {
            SAFETY_POLL
        } else {
            POLL
        };
        let wake = (now + poll).min(self.deadline);
        tokio::select! {
            () = self.watch.changed() => {}
            () = tokio::time::sleep_until(wake) => {}
        }
        true
    }
}
