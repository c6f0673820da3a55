//! Telling a caller that its result was replayed from a record.

use std::cell::Cell;
use std::future::Future;

tokio::task_local! {
    static REPLAYED: Cell<bool>;
}

/// Runs `future` and reports whether an idempotency guard inside it answered from a stored
/// result instead of running the body (an HTTP handler sets `Idempotent-Replayed: true`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use redguard::idempotency::track_replay;
///
/// let rg = redguard::Redguard::memory();
/// let call = || {
///     redguard::idempotency("order-1").scope("checkout").run(async { Ok::<_, redguard::Error>(7) })
/// };
/// let (first, replayed) = rg.scope(track_replay(call())).await;
/// assert_eq!((first?, replayed), (7, false));
/// let (again, replayed) = rg.scope(track_replay(call())).await;
/// assert_eq!((again?, replayed), (7, true));
/// # Ok(()) }
/// ```
pub fn track_replay<F: Future>(future: F) -> impl Future<Output = (F::Output, bool)> {
    // Boxed here, once: the returned future and its poll frames stay small however large
    // `future` is (a debug build's frames hold each layer's copy of it).
    let future = Box::pin(future);
    REPLAYED.scope(Cell::new(false), async move {
        let output = future.await;
        (output, REPLAYED.with(Cell::get))
    })
}

/// Called by the guard when it replays; a no-op outside [`track_replay`].
pub(crate) fn mark() {
    let _ = REPLAYED.try_with(|replayed| replayed.set(true));
}
