//! Everything macro expansions name. Not a public API: it changes with the macros, which are
//! pinned to this crate's exact version.

pub use crate::handle::Redguard;
pub use crate::key::{KeyBuilder, KeyPart};

/// Identity on a `KeyPart`: expansions call it at each placeholder's span, so a value of the
/// wrong type is reported there.
#[inline(always)]
pub fn key_part<T: KeyPart + ?Sized>(value: &T) -> &T {
    value
}

/// What a guarded fn must return: a `Result` whose error can carry a guard's refusal.
#[diagnostic::on_unimplemented(
    message = "a guarded fn must return `Result<T, E>` where `E: From<redguard::Error>`, \
               not `{Self}`",
    label = "a guard returns its refusals (in progress, rate limited, lock timeout) through \
             this type",
    note = "add `impl From<redguard::Error> for YourError`, or return `redguard::Result<T>`"
)]
pub trait GuardedReturn {}

impl<T, E: From<crate::Error>> GuardedReturn for Result<T, E> {}

/// Expansions call this first, spanned at the return type.
#[inline(always)]
pub fn assert_guarded_return<R: GuardedReturn>() {}

/// `#[dist_lock]`'s prelude: the lock as written on the fn, its key rendered. `permits` 0
/// means not a semaphore; `read_write` is 0 (exclusive), 1 (read) or 2 (write).
#[allow(clippy::too_many_arguments)]
pub fn dist_lock_builder(
    scope: &'static str,
    key: crate::Result<crate::KeyBody>,
    wait: std::time::Duration,
    lease: std::time::Duration,
    skip_if_held: bool,
    hold_at_least: std::time::Duration,
    continue_on_lost: bool,
    permits: u32,
    read_write: u8,
    fair: bool,
) -> crate::LockBuilder {
    let mut builder = crate::lock::LockBuilder::new(None, key)
        .scope(scope)
        .wait(wait)
        .lease(lease)
        .hold_at_least(hold_at_least);
    if skip_if_held {
        builder = builder.skip_if_held();
    }
    if continue_on_lost {
        builder = builder.on_lost(crate::OnLost::Continue);
    }
    if permits > 0 {
        builder = builder.permits(permits);
    }
    match read_write {
        1 => builder = builder.read(),
        2 => builder = builder.write(),
        _ => {}
    }
    if fair {
        builder = builder.fair();
    }
    builder
}

/// `#[dist_lock]`'s wrapper: runs the body under the lock.
pub async fn dist_lock<T, E, F>(lock: crate::LockBuilder, body: F) -> Result<T, E>
where
    E: From<crate::Error>,
    F: std::future::Future<Output = Result<T, E>>,
{
    lock.run(body).await
}
