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
