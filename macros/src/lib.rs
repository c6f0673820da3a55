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
/// ```text
/// #[redguard::idempotent(key = "{user_id}:{req.request_id}", expire = 600)]
/// async fn submit_order(user_id: u64, req: SubmitOrder) -> Result<Receipt, OrderError> { .. }
/// ```
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    guard::expand::<idempotent::Idempotent>(attr.into(), item.into()).into()
}

/// Lets one holder at a time across all instances run the fn.
///
/// ```text
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
/// ```text
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
/// ```text
/// #[redguard::rate_limit(key = "order:submit", rate = "500/s", burst = 1000)]            // whole API
/// #[redguard::rate_limit(key = "order:submit:user:{user_id}", rate = "5/s", burst = 10)] // per user
/// async fn submit_order(user_id: u64, req: SubmitOrder) -> Result<Receipt, OrderError> { .. }
/// ```
///
/// A rejected call does not run: it returns `Err(redguard::Error::RateLimited(decision))`
/// through the fn's error type; `decision.headers()` renders `Retry-After` and the IETF
/// `RateLimit` / `RateLimit-Policy` headers for a `429`.
///
/// # Arguments
/// - `key = "..."` (required): the key template; placeholders name parameters
///   (`"login:ip:{ip}"`, `"{user.id}"`), checked at compile time.
/// - `rate = "100/s"` (required): `count/period` with `ms`, `s`, `m`/`min`, `h`, `d`
///   (`"5/10s"`, `"1000/min"`), checked at compile time; or any expression giving a
///   `redguard::Rate` or text (`rate = config.login_rate()`), checked on each call — a bad
///   configured value is `Error::InvalidLimit`, never a panic.
/// - `burst = 10`: the capacity of `gcra`, `token_bucket` and `leaky_bucket` (default: the
///   rate's count); a literal or an expression. Window algorithms take no burst.
/// - `algorithm = "gcra"`: `gcra` (default), `fixed_window`, `sliding_window` (exact log),
///   `sliding_counter` (approximate, O(1)), `token_bucket`, `leaky_bucket`.
/// - `cost = req.items.len()`: units this call consumes (default 1); more than the burst
///   is an error (a compile error for literals), not a forever-rejected key.
/// - `block = "15m"`: penalty — once the key exceeds its limit, reject it for that long
///   without counting.
/// - `wait = "200ms"`: when rejected with a `retry_after` within this bound, wait (with
///   jitter) and try once more instead of failing at once (at most 1 minute).
/// - `local = true`: an in-process first tier that repeats the store's rejections of a key
///   until its `retry_after` without a round trip (never admits more than the store).
/// - `scope = "..."`: key namespace (default: the fn's module path and name).
///
/// Several `#[rate_limit]`s written next to each other are decided together in one store
/// call: the call runs only if every limit admits, and a rejection by one charges none of
/// the others.
///
/// # Equivalent code without `#[rate_limit]`
/// ```text
/// async fn submit_order(user_id: u64, req: SubmitOrder) -> Result<Receipt, OrderError> {
///     redguard::limiter("order:submit:user:")
///         .part("user_id", &user_id)
///         .scope(concat!(module_path!(), "::submit_order"))
///         .rate("5/s")
///         .burst(10)
///         .enforce()
///         .await?;
///     // ... the body
/// }
/// ```
#[proc_macro_attribute]
pub fn rate_limit(attr: TokenStream, item: TokenStream) -> TokenStream {
    guard::expand::<rate_limit::RateLimit>(attr.into(), item.into()).into()
}
