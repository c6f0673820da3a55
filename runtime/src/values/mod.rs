//! Values the guards and the stores share: what a limit is and what it decided, which kind a
//! lock is.
//!
//! Below the guards and the stores, beside keys, errors and clocks: nothing here imports a
//! guard, the handle or a store, so a store depends on these values and never on a guard.

mod decision;
mod deny;
mod lock;
mod quota;
mod rate;
mod replicas;

pub use self::decision::Decision;
#[cfg(feature = "http")]
pub(crate) use self::decision::{render_headers, secs_ceil};
pub(crate) use self::deny::{
    DENY_HASH, DENY_SUFFIX, check_reason, denies, deny_hash, exact_reason,
};
pub use self::deny::{DenyPattern, MAX_DENY_PATTERNS, MAX_DENY_REASON};
pub use self::lock::LockKind;
pub use self::quota::{MAX_PREFIX_OVERRIDES, MAX_QUOTA_TTL, Quota, QuotaTtl};
pub(crate) use self::quota::{QUOTA_SUFFIX, prefix_hash};
pub(crate) use self::rate::micros;
pub use self::rate::{
    Algorithm, IntoRate, Limit, MAX_RATE_COUNT, MAX_RATE_PERIOD, MAX_SLIDING_WINDOW_COUNT, Rate,
};
// Reached by users only through the builders' `replicas(count, timeout)`; redguard's own
// tests name it through the store seam (feature `test-util`).
#[cfg(feature = "test-util")]
pub use self::replicas::Replicas;
#[cfg(not(feature = "test-util"))]
pub(crate) use self::replicas::Replicas;
