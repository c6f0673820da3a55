//! The core idiom: an operation whose outcome is unknown is undone.
//!
//! A store call that failed, or whose future was dropped in flight, may still have run (a
//! stalled store resumes); so may one that succeeded for a caller that is gone. [`Undo`] holds
//! what undoes such an operation, armed until a definite reply disarms it, as tokio-util's
//! `DropGuard` holds a cancellation. Dropped armed (an early return, a panic, a cancelled
//! future), it sends the undo at once: polled in place as far as it goes, the rest in a task
//! (see [`clean_up`]).

use std::future::Future;

tokio::task_local! {
    /// Set while an undo runs: a store sends it even while it fails other calls at once
    /// (the Redis store's breaker), since it must follow its operation on the connection.
    static COMPENSATING: ();
}

/// Whether the current task is sending an undo (see [`COMPENSATING`]).
pub(crate) fn compensating() -> bool {
    COMPENSATING.try_with(|()| ()).is_ok()
}

/// What undoes one operation whose outcome is unknown.
pub(crate) trait Compensate: Send + 'static {
    /// Logged when dropped outside a Tokio runtime, where nothing can be sent: how the state
    /// left behind ends anyway (a lease, an expire).
    const ABANDONED: &'static str;

    /// Undoes the operation. Each undo names its owner, so sending it twice (once in place,
    /// once from `Drop`) changes nothing the second time.
    fn undo(self) -> impl Future<Output = ()> + Send + 'static;

    /// True when there is nothing left to undo (what was begun is all accounted for), so a
    /// drop sends nothing.
    fn is_noop(&self) -> bool {
        false
    }
}

/// An operation whose outcome is unknown, undone when dropped armed; see the module docs.
#[must_use = "dropping an `Undo` undoes its operation at once"]
pub(crate) struct Undo<T: Compensate> {
    armed: Option<T>,
}

impl<T: Compensate> Undo<T> {
    /// Armed with `op`.
    pub(crate) fn armed(op: T) -> Self {
        Undo { armed: Some(op) }
    }

    /// Disarmed: the operation's outcome became known.
    pub(crate) fn disarmed() -> Self {
        Undo { armed: None }
    }

    /// Arms it with `op` (replacing what it held).
    pub(crate) fn arm(&mut self, op: T) {
        self.armed = Some(op);
    }

    /// What it would undo, if armed.
    pub(crate) fn get(&self) -> Option<&T> {
        self.armed.as_ref()
    }

    /// See [`get`](Undo::get).
    pub(crate) fn get_mut(&mut self) -> Option<&mut T> {
        self.armed.as_mut()
    }

    /// Disarms it, handing back what it would have undone.
    pub(crate) fn disarm(&mut self) -> Option<T> {
        self.armed.take()
    }

    /// Undoes now, waiting for it. Armed until it is done: dropped meanwhile, it leaves the
    /// undo to `Drop`, which sends it again.
    pub(crate) async fn now(mut self)
    where
        T: Clone,
    {
        if let Some(op) = self.armed.clone() {
            COMPENSATING.scope((), op.undo()).await;
        }
        self.armed = None;
    }
}

impl<T: Compensate> Drop for Undo<T> {
    fn drop(&mut self) {
        let Some(op) = self.armed.take().filter(|op| !op.is_noop()) else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => clean_up(&runtime, COMPENSATING.scope((), op.undo())),
            Err(_) => tracing::debug!("{}", T::ABANDONED),
        }
    }
}

impl<T: Compensate + std::fmt::Debug> std::fmt::Debug for Undo<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Undo").field("armed", &self.armed).finish()
    }
}

/// Runs what a drop left to do as far as it goes at once, the rest in a task of its own.
/// Polled in place, a store that answers at once (memory) has applied it before the drop
/// returns, and Redis has it queued on the connection right behind the call it follows: a
/// retry made next sees it done, however long a loaded machine takes to run the task.
pub(crate) fn clean_up(
    runtime: &tokio::runtime::Handle,
    cleanup: impl Future<Output = ()> + Send + 'static,
) {
    let mut cleanup = Box::pin(cleanup);
    // Not while unwinding (a body that panicked): a panic of the cleanup would abort.
    if !std::thread::panicking() {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if cleanup.as_mut().poll(&mut cx).is_ready() {
            return;
        }
    }
    drop(runtime.spawn(cleanup));
}
