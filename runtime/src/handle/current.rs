//! The process-wide current handle: the installed default, the one a future is scoped to,
//! and tasks that carry the handle they were started with.

use std::future::Future;
use std::sync::{Mutex, PoisonError};

use once_cell::sync::OnceCell;
use tokio::runtime;
use tokio::task::JoinHandle;

use super::Redguard;
use crate::error::{Error, Result};

static INSTALLED: OnceCell<Redguard> = OnceCell::new();

tokio::task_local! {
    static SCOPED: Redguard;
    /// Set in a task [`spawn`] started where no handle was scoped: told apart so its
    /// `NotInScope` can name the mistake (`rg.scope(redguard::spawn(..))`).
    static SPAWNED_UNSCOPED: ();
}

/// Scope futures being run now, per Tokio runtime, so a task without a handle can be told
/// that it was probably spawned from inside one (per runtime: a scope in another runtime, a
/// test running next to this one, says nothing about this task).
static LIVE_SCOPES: Mutex<Vec<(runtime::Id, usize)>> = Mutex::new(Vec::new());

struct LiveScope(Option<runtime::Id>);

impl LiveScope {
    fn enter() -> LiveScope {
        let Ok(rt) = runtime::Handle::try_current() else {
            return LiveScope(None);
        };
        let id = rt.id();
        let mut live = LIVE_SCOPES.lock().unwrap_or_else(PoisonError::into_inner);
        match live.iter_mut().find(|(rt, _)| *rt == id) {
            Some((_, n)) => *n += 1,
            None => live.push((id, 1)),
        }
        LiveScope(Some(id))
    }

    /// Whether a scope is being run on the current runtime.
    fn any_here() -> bool {
        let Ok(rt) = runtime::Handle::try_current() else {
            return false;
        };
        let id = rt.id();
        let live = LIVE_SCOPES.lock().unwrap_or_else(PoisonError::into_inner);
        live.iter().any(|(rt, _)| *rt == id)
    }
}

impl Drop for LiveScope {
    fn drop(&mut self) {
        let Some(id) = self.0 else { return };
        let mut live = LIVE_SCOPES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = live.iter().position(|(rt, _)| *rt == id) {
            live[i].1 -= 1;
            if live[i].1 == 0 {
                live.swap_remove(i);
            }
        }
    }
}

/// Why: outside a Tokio runtime, a guard's first timer or task would panic inside redguard
/// with Tokio's words ("there is no reactor running"); checked where a guard finds its handle,
/// so it is an [`Error::Config`] saying what to do instead.
pub(crate) fn need_runtime() -> Result<()> {
    match runtime::Handle::try_current() {
        Ok(_) => Ok(()),
        Err(_) => Err(Error::Config(NO_RUNTIME.to_owned())),
    }
}

/// [`need_runtime`] where the store needs it: the memory store answers a rate check or a
/// token without Tokio, and a check on it stays free of the runtime lookup (an atomic on a
/// cache line every thread shares).
pub(crate) fn need_runtime_for(handle: &Redguard) -> Result<()> {
    if handle.kind() == super::StoreKind::Memory {
        Ok(())
    } else {
        need_runtime()
    }
}

pub(crate) const NO_RUNTIME: &str = "redguard needs a Tokio runtime (with the time and io \
     drivers enabled): call guards from `#[tokio::main]`, `#[tokio::test]` or a runtime built \
     with `enable_all()`, not from another executor";

/// `tokio::spawn` carrying the current handle: guards in the task use the handle of the
/// [`Redguard::scope`] that spawned it (a scope does not reach into a plain `tokio::spawn`),
/// or the installed one outside any scope.
///
/// The handle is taken where `spawn` is called: `rg.scope(redguard::spawn(fut))` spawns
/// before the scope exists, and the task has none. Write [`rg.spawn(fut)`](Redguard::spawn)
/// for a task on a given handle.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use std::time::Duration;
///
/// let token = redguard::Redguard::memory()
///     .scope(async {
///         redguard::spawn(async { redguard::tokens().issue("signup", Duration::from_secs(60)).await })
///             .await
///             .expect("the task panicked")
///     })
///     .await?;
/// assert_eq!(token.len(), 32);
/// # Ok(()) }
/// ```
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match SCOPED.try_with(Redguard::clone) {
        Ok(handle) => tokio::spawn(handle.scope(future)),
        Err(_) => tokio::spawn(SPAWNED_UNSCOPED.scope((), future)),
    }
}

impl Redguard {
    /// Makes this handle the process-wide default used by the attribute macros and the free
    /// functions (`redguard::tokens`, …). Once per process; a second call is an error
    /// (use [`Redguard::scope`] to run code against another handle).
    pub fn install(self) -> Result<Redguard> {
        let mut fresh = false;
        let installed = INSTALLED.get_or_init(|| {
            fresh = true;
            self.clone()
        });
        if fresh {
            Ok(installed.clone())
        } else {
            Err(Error::Config(
                "a redguard handle is already installed; install once at startup, or use \
                 `Redguard::scope` to run a future against another handle"
                    .to_owned(),
            ))
        }
    }

    /// Runs `future` with this handle as the default, overriding the installed one for that
    /// future only. Made for tests: each can use its own in-memory store and clock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// use redguard::Redguard;
    ///
    /// let token = Redguard::memory()
    ///     .scope(async { redguard::tokens().issue("signup", Duration::from_secs(60)).await })
    ///     .await?;
    /// assert_eq!(token.len(), 32);
    /// # Ok(()) }
    /// ```
    ///
    /// The scope covers `future` only, not tasks it starts with `tokio::spawn`: start those
    /// with [`redguard::spawn`](crate::spawn), or [`Redguard::spawn`].
    pub fn scope<F: Future>(&self, future: F) -> impl Future<Output = F::Output> + use<F> {
        // Boxed here, once: the scope's future and its poll frames stay small however large
        // `future` is (a debug build's frames hold each layer's copy of it).
        let future = SCOPED.scope(self.clone(), Box::pin(future));
        async move {
            // Entered when first polled: only then is the runtime known.
            let _live = LiveScope::enter();
            future.await
        }
    }

    /// `tokio::spawn` of `future` scoped to this handle: guards in the task use it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    ///
    /// let rg = redguard::Redguard::memory();
    /// let token = rg
    ///     .spawn(async { redguard::tokens().issue("signup", Duration::from_secs(60)).await })
    ///     .await
    ///     .expect("the task panicked")?;
    /// assert_eq!(token.len(), 32);
    /// # Ok(()) }
    /// ```
    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        tokio::spawn(self.scope(future))
    }

    /// The handle a guard should use right now: the scoped one, else the installed one.
    ///
    /// Neither is [`Error::NotInstalled`], or [`Error::NotInScope`] while a scope runs
    /// elsewhere (the usual cause: a task spawned from inside a scope).
    pub fn current() -> Result<Redguard> {
        SCOPED
            .try_with(Redguard::clone)
            .ok()
            .or_else(|| INSTALLED.get().cloned())
            .ok_or_else(|| {
                if LiveScope::any_here() {
                    Error::NotInScope {
                        spawned_unscoped: SPAWNED_UNSCOPED.try_with(|()| ()).is_ok(),
                    }
                } else {
                    Error::NotInstalled
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    use crate::{Error, Redguard};

    /// Polls `future` on this thread, outside any Tokio runtime (as another executor would).
    fn block_on<F: Future>(future: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut future = pin!(future);
        loop {
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                return out;
            }
            std::thread::park();
        }
    }

    fn says_runtime<T: std::fmt::Debug>(result: crate::Result<T>) {
        match result {
            Err(Error::Config(why)) => assert!(why.starts_with("redguard needs a Tokio runtime")),
            other => panic!("expected the missing runtime to be named, got {other:?}"),
        }
    }

    #[test]
    fn guards_outside_a_tokio_runtime_say_so() {
        let rg = Redguard::memory();
        says_runtime(block_on(
            rg.lock("outside").run(async { Ok::<_, Error>(()) }),
        ));
        says_runtime(block_on(
            rg.idempotency("outside")
                .expire(std::time::Duration::from_secs(60))
                .run(async { Ok::<_, Error>(1u8) }),
        ));
        says_runtime(block_on(
            rg.idempotency("outside")
                .detach()
                .run(async { Ok::<_, Error>(1u8) }),
        ));
        // The memory store answers these without Tokio, as it did before the check.
        assert!(block_on(rg.limiter("outside").rate("1/s").check()).is_ok());
        assert!(
            block_on(
                rg.tokens()
                    .issue("scene", std::time::Duration::from_secs(60))
            )
            .is_ok()
        );
        // Waiting for a limit needs Tokio's timers.
        says_runtime(block_on(
            rg.limiter("outside")
                .rate("1/s")
                .wait(std::time::Duration::from_secs(1))
                .check(),
        ));
    }
}
