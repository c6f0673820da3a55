//! Attribute macros for [redguard](https://docs.rs/redguard). Use them through the `redguard`
//! crate, which re-exports them and provides the runtime they expand into.
//!
//! Each macro parses its arguments into typed values, checks them against the fn (every error
//! at once, each under what the user wrote), then expands into calls to
//! `::redguard::__private`. No guard logic runs here.

mod args;
mod check;
mod classify;
mod dist_lock;
mod errors;
mod expand;
mod guard;
mod idempotent;
mod rate_limit;
mod template;

use proc_macro::TokenStream;

/// Runs the same business intent once; retries get the first result back.
///
/// ```text
/// #[redguard::idempotent(key = "{user_id}:{req.request_id}", expire = "10m", payload = req)]
/// async fn submit_order(user_id: u64, req: SubmitOrder) -> Result<Receipt, OrderError> { .. }
/// ```
///
/// The first call records PROCESSING and runs the body; a concurrent call gets
/// `redguard::Error::InProgress`; once the body returned `Ok`, every retry gets the stored
/// value back without running it (`redguard::idempotency::track_replay` tells the caller); after a business
/// error a retry runs again; after an error whose outcome is unknown (an indeterminate error,
/// a `timeout`, a panic, the caller's future dropped) the record is UNKNOWN and retries get
/// `redguard::Error::OutcomeUnknown` until an operator resolves it (`redguard resolve`) or it
/// expires, so a retry cannot run blindly. While the body runs, its record is renewed every
/// `expire`/3 by a task of its own, so a slow body is never run twice.
///
/// # Requirements
/// - an `async fn` returning `Result<T, E>`, with `T: Serialize + DeserializeOwned` (the value
///   replayed to retries), `E: From<redguard::Error>` (a refusal is returned through it) and
///   `E: redguard::Classify` (which errors are safe to retry: `#[derive(redguard::Classify)]`).
///   `redguard::Error` itself, `Box<dyn Error + Send + Sync>` and (feature `anyhow`)
///   `anyhow::Error` qualify: a dynamic error classifies through a `redguard::Error` or a
///   `redguard::ErrorClass` in its chain (`.context(ErrorClass::Business)`), and is an
///   unknown outcome otherwise.
/// - every placeholder's value implements `redguard::key::KeyPart` (integers, strings, UUIDs,
///   `Option`s of them, `redguard::http::IdempotencyKey`, or your own type); a value breaking
///   the key rules at runtime is `redguard::Error::InvalidKey` / `MissingKey` before any store
///   call.
/// - a handle: installed (`Redguard::install`) or scoped (`Redguard::scope`, which does not
///   reach into `tokio::spawn`ed tasks: use `redguard::spawn`); otherwise
///   `redguard::Error::NotInstalled` / `NotInScope`.
/// - with `detach`: the body, `T` and `E` are `Send + 'static`.
/// - stacked guards apply outside-in in written order: put `#[rate_limit]` above
///   `#[idempotent]`, and `#[idempotent]` above `#[dist_lock]` (a warning says so otherwise).
///
/// # Arguments
/// - `key = "{user_id}:{req.request_id}"`: the intent's key template; placeholders name
///   parameters (and their fields), checked at compile time. Required unless `token` is given.
/// - `expire = 600` or `"10m"` (required with `key`): how long the record lives after each
///   transition, `1s` to `7d`; also how long an execution with an unknown outcome blocks
///   retries at most.
/// - `payload = req`: fingerprint the request (SHA-256 of its JSON); the same key with another
///   payload is `redguard::Error::KeyReuse`.
/// - `timeout = "5s"`: bound the body; elapsing is an unknown outcome
///   (`redguard::Error::Timeout`).
/// - `token = "{token}", scene = "order-submit"`: consume a token from
///   `redguard::tokens().issue(scene, ttl)` when the body is about to run (given back if the
///   body fails with a business error); alone, or with `key` (then a retry of a successful
///   submission replays its result).
/// - `detach`: run the body in its own task, so it completes and is recorded even when the
///   caller's future is dropped (a client that disconnected). The body must then be
///   `Send + 'static`: owned parameters only.
/// - `scope = "..."`: the key's namespace (default: the fn's path, impl type and trait
///   included, so two fns never share records).
/// - `replicas = 1` (1 to 16), optionally with `replicas_timeout = "50ms"` (the default; at
///   most half the handle's call timeout): the PROCESSING record and the outcome count only
///   once that many replicas confirm them (Redis `WAIT`), so a failover right after cannot
///   lose them. A begin too few confirm is undone and fails as the store being down does
///   (`Error::Backend`, the body does not run); an outcome too few confirm is still returned,
///   logged and counted. Needs `key`.
///
/// When Redis cannot answer, the call fails closed (`redguard::Error::Backend`) unless the
/// handle sets `FailMode::Open` for idempotency.
///
/// # Outcomes
/// | the call finds | it returns | HTTP (`Error::status`, feature `http`) |
/// |---|---|---|
/// | no record | the body's result, recorded | - |
/// | the intent running (or its process crashed) | `Error::InProgress` | 409 |
/// | the intent ended with an unknown outcome | `Error::OutcomeUnknown` | 409 |
/// | a success | the recorded value, without running | as the first |
/// | a business failure | runs again (whatever its `payload`) | - |
/// | the key with another `payload` | `Error::KeyReuse` | 422 |
/// | a bad key value | `Error::InvalidKey` / `MissingKey` | 400 |
/// | Redis unreachable | `Error::Backend` | 503 |
///
/// For whole HTTP responses (status, headers, body) keyed by the `Idempotency-Key` header,
/// use `redguard::http::IdempotencyLayer` (feature `tower`) instead of the attribute.
///
/// # Equivalent code without `#[idempotent]`
/// ```text
/// async fn submit_order(user_id: u64, req: SubmitOrder) -> Result<Receipt, OrderError> {
///     let key = redguard::key("{user_id}:{req.request_id}")
///         .part("user_id", &user_id)
///         .part("req.request_id", &req.request_id);
///     redguard::idempotency(key)
///         .scope("shop::submit_order")
///         .expire(Duration::from_secs(600))
///         .payload(&req)
///         .run(async move { .. })
///         .await
/// }
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
/// - `scope = "..."`: the key's scope (default: the fn's path, impl type and trait included).
/// - `skip_if_held`: return `redguard::Error::LockHeld` at once when held (scheduled jobs).
/// - `hold_at_least = "10s"`: keep the key taken at least this long after acquisition.
/// - `on_lost = "cancel"` (default) or `"continue"`: when the lock is lost mid-body, cancel
///   it and return `redguard::Error::LockLost`, or let it finish (logged and counted).
/// - `permits = 3`: a semaphore: up to that many holders at once.
/// - `read` / `write`: the key's read/write lock in that mode (many readers or one writer).
/// - `fair`: hand the lock over in arrival order (FIFO across all processes).
/// - `replicas = 1` (1 to 16), optionally with `replicas_timeout = "50ms"` (the default; at
///   most half the handle's call timeout): the acquisition counts only once that many replicas
///   confirm it (Redis `WAIT`), so a failover right after cannot hand the lock to a second
///   holder. Too few in time: released again, and `redguard::Error::Backend` (fail closed).
///
/// The body reads its fencing token with `redguard::lock::fence()`.
///
/// # Equivalent code without `#[dist_lock]`
/// ```text
/// async fn reserve_stock(sku: &str, qty: u32) -> Result<(), OrderError> {
///     redguard::lock(redguard::key::KeyBuilder::new().text("stock:").part("sku", sku))
///         .scope("shop::reserve_stock")
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
///   `redguard::rate::Rate` or text (`rate = config.login_rate()`), checked on each call — a bad
///   configured value is `Error::InvalidLimit`, never a panic.
/// - `burst = 10`: the capacity of `gcra`, `token_bucket` and `leaky_bucket` (default: the
///   rate's count); a literal or an expression. Window algorithms take no burst. The default
///   admits a full bucket at once: `rate = "10/s"` lets up to 19 through in its first second;
///   for an outgoing quota (a provider's 10 per second) write `burst = 1`, or what it allows.
/// - `algorithm = "gcra"`: `gcra` (default), `fixed_window`, `sliding_window` (exact log),
///   `sliding_counter` (approximate, O(1)), `token_bucket`, `leaky_bucket`.
/// - `cost = req.items.len()`: units this call consumes (default 1); more than the burst
///   is an error (a compile error for literals), not a forever-rejected key.
/// - `block = "15m"`: penalty — once the key exceeds its limit, reject it for that long
///   without counting.
/// - `wait = "200ms"`: wait up to this long to be admitted instead of failing at once (at
///   most 1 minute): callers of one key on one instance wait in arrival order, none admitted
///   earlier than the limit allows, and a call is refused only if the limit cannot admit it
///   within its wait.
/// - `local = true`: an in-process first tier that repeats the store's rejections of a key
///   until its `retry_after` without a round trip (never admits more than the store).
/// - `shadow = cfg.dry_run` (or `true`): shadow mode — decided and counted as if enforced,
///   admitted anyway (`outcome="shadow_rejected"`); a bool expression, read per call.
/// - `scope = "..."`: key namespace (default: the fn's path, impl type and trait included).
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
///         .scope("shop::submit_order")
///         .rate("5/s")
///         .burst(10)
///         .check()
///         .await?;
///     // ... the body
/// }
/// ```
#[proc_macro_attribute]
pub fn rate_limit(attr: TokenStream, item: TokenStream) -> TokenStream {
    guard::expand::<rate_limit::RateLimit>(attr.into(), item.into()).into()
}

/// Derives `redguard::Classify`: which errors of the type leave an `#[idempotent]` execution's
/// outcome unknown (the record stays PROCESSING, retries are refused) and which are business
/// errors (the record becomes FAIL, a retry runs again).
///
/// ```text
/// #[derive(Debug, redguard::Classify)]
/// enum OrderError {
///     OutOfStock,                                // business (the default)
///     #[classify(indeterminate)] GatewayTimeout, // the charge may have gone through
///     #[classify(from)]                          // + `impl From<redguard::Error>`
///     Guard(redguard::Error),                    // classifies itself: a lost lock is unknown,
///                                                // a lock timeout is business
///     #[classify(delegate)] Db(DbError),         // DbError's own `Classify`
/// }
/// ```
///
/// - A variant (or newtype struct) with one field of type `redguard::Error` delegates to it.
/// - `#[classify(business)]`, `#[classify(indeterminate)]` or `#[classify(delegate)]` (one
///   field implementing `Classify`) on a variant sets its rule.
/// - `#[classify(indeterminate)]` on the enum makes that the default for unmarked variants:
///   the cautious choice when most errors come from calls whose effect is unknown.
/// - `#[classify(from)]` on the variant (or newtype struct) holding the `redguard::Error` also
///   derives `From<redguard::Error>`, which every guarded fn's error type needs (a guard
///   returns its refusals through it). Opt-in, as a `From` written by hand or by
///   `thiserror`'s `#[from]` would conflict with it.
#[proc_macro_derive(Classify, attributes(classify))]
pub fn derive_classify(item: TokenStream) -> TokenStream {
    classify::derive(item.into()).into()
}
