//! Attribute macros for [redguard](https://docs.rs/redguard). Use them through the `redguard`
//! crate, which re-exports them and provides the runtime they expand into.
//!
//! Each macro parses its arguments into typed values, checks them against the fn (every error
//! at once, each under what the user wrote), then expands into calls to
//! `::redguard::__private`. No guard logic runs here.

mod args;
mod check;
mod dist_lock;
mod errors;
mod expand;
mod guard;
mod idempotent;
mod rate_limit;
mod template;
mod value;

use proc_macro::TokenStream;

/// Runs the same business intent once; retries get the first result back.
///
/// ```ignore
/// #[redguard::idempotent(key = "{user_id}:{req.request_id}", expire = 600)]
/// async fn submit_order(user_id: u64, req: SubmitOrder) -> Result<Receipt, OrderError> { .. }
/// ```
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    guard::expand::<idempotent::Idempotent>(attr.into(), item.into()).into()
}

/// Lets one holder at a time across all instances run the fn.
///
/// ```ignore
/// #[redguard::dist_lock(key = "stock:{sku}", wait = "300ms")]
/// async fn reserve_stock(sku: &str, qty: u32) -> Result<(), OrderError> { .. }
/// ```
///
/// # Arguments
/// - `key = "stock:{sku}"` (required): the lock's key template; placeholders name parameters.
/// - `wait = "300ms"`: how long to wait for a held lock (default: try once), at most `60s`;
///   then the fn returns `redguard::Error::LockTimeout` without running.
/// - `lease = "30s"` (default): the key's TTL, `1s` to `1h`, renewed every lease/3 while the
///   body runs; how long a crashed holder blocks others.
/// - `scope = "..."`: the key's scope (default: the fn's module path and name).
/// - `skip_if_held`: return `redguard::Error::LockHeld` at once when held (scheduled jobs).
/// - `hold_at_least = "10s"`: keep the key taken at least this long after acquisition.
/// - `on_lost = "cancel"` (default) or `"continue"`: when the lock is lost mid-body, cancel
///   it and return `redguard::Error::LockLost`, or let it finish (logged and counted).
/// - `permits = 3`: a semaphore: up to that many holders at once.
/// - `read` / `write`: the key's read/write lock in that mode (many readers or one writer).
/// - `fair`: hand the lock over in arrival order (FIFO across all processes).
///
/// The body reads its fencing token with `redguard::fence()`.
///
/// # Equivalent code without `#[dist_lock]`
/// ```ignore
/// async fn reserve_stock(sku: &str, qty: u32) -> Result<(), OrderError> {
///     redguard::lock(redguard::KeyBuilder::new().text("stock:").part("sku", sku))
///         .scope(concat!(module_path!(), "::reserve_stock"))
///         .wait(Duration::from_millis(300))
///         .run(async move { .. })
///         .await
/// }
/// ```
#[proc_macro_attribute]
pub fn dist_lock(attr: TokenStream, item: TokenStream) -> TokenStream {
    guard::expand::<dist_lock::DistLock>(attr.into(), item.into()).into()
}

/// Admits at most N calls per period, decided in Redis with Redis's clock.
///
/// ```ignore
/// #[redguard::rate_limit(key = "order:submit:user:{user_id}", rate = "5/s", burst = 10)]
/// async fn submit_order(user_id: u64, req: SubmitOrder) -> Result<Receipt, OrderError> { .. }
/// ```
#[proc_macro_attribute]
pub fn rate_limit(attr: TokenStream, item: TokenStream) -> TokenStream {
    guard::expand::<rate_limit::RateLimit>(attr.into(), item.into()).into()
}
