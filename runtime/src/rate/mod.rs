//! Rate limits: the [`limiter`](crate::limiter()) API and what `#[rate_limit]` expands into.
//!
//! A call names one or more limits; the store decides them together, at its own time, in one
//! round trip ([`RateOps`](crate::store::RateOps)): either every limit admits and all are
//! charged, or the call is turned away and none is. When the store cannot answer, the
//! rate-limit [`FailMode`](crate::handle::FailMode) applies: by default the call is let through,
//! logged and counted (`redguard_backend_errors_total`); `FailMode::Local` decides it in
//! process at the instance's share of the limit.
//!
//! Code map: `limiter.rs` the API ([`Limiter`], [`RateLimits`]); `decide.rs` asking the store
//! (or the local tier), metrics; `pace.rs` the wait, in arrival order; `local.rs` the
//! in-process first tier; `fallback.rs` the local limiter of [`FailMode::Local`](crate::handle::FailMode::Local);
//! `charge.rs` cost charged after the call ([`Charge`], [`Cost`]); `top.rs` the tally of the
//! keys each scope admits and refuses most (`redguard top`).

mod charge;
mod decide;
mod fallback;
mod limiter;
mod local;
mod pace;
pub(crate) mod top;

pub use self::charge::{Charge, Cost};
pub(crate) use self::fallback::Table as FallbackTable;
pub use self::top::{KEEP as TOP_KEEP, MAX_MEMBERS as TOP_MAX_MEMBERS};
pub(crate) use self::top::{Outcome as TallyOutcome, Tally, minute, tally_key};

pub use self::limiter::{Limiter, RateLimits};
pub use crate::values::{
    Algorithm, IntoRate, Limit, MAX_RATE_COUNT, MAX_RATE_PERIOD, MAX_SLIDING_WINDOW_COUNT, Rate,
};

/// Scope of keys built by [`limiter`](crate::limiter()) unless [`Limiter::scope`] says
/// otherwise: the entry point's name, as for [`lock`](crate::lock()) and
/// [`idempotency`](crate::idempotency()).
pub const DEFAULT_LIMITER_SCOPE: &str = "limiter";
