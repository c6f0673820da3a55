//! HTTP integration (feature `http`; the layers with `tower`, the extractor and
//! `IntoResponse` with `axum`). Empty without them.
//!
//! Without feature `axum`, an axum handler returning `redguard::Error` is refused by axum
//! with an opaque "the trait `Handler<_, _>` is not implemented" (E0277): `IntoResponse` is
//! axum's trait, so redguard cannot name the feature there. Enable `axum`.
//!
//! - [`Error::status`](crate::Error::status), [`code`](crate::Error::code),
//!   [`public_message`](crate::Error::public_message), [`headers`](crate::Error::headers): one
//!   status table for every guard outcome, and a message safe to send to a client.
//! - [`Decision::header_map`](crate::Decision::header_map): `RateLimit`, `RateLimit-Policy`
//!   and `Retry-After` (draft-ietf-httpapi-ratelimit-headers-09).
//! - [`IdempotencyKey`]: the `Idempotency-Key` header, validated (an axum extractor with
//!   feature `axum`).
//!
//! - [`RateLimitLayer`] (feature `tower`): limits keyed by a [`KeyExtractor`] (client IP
//!   through trusted proxies, a header, a path segment, a global key, any closure), `429`
//!   answered by the layer.
//! - [`IdempotencyLayer`] (feature `tower`): the `Idempotency-Key` draft for any route, the
//!   whole response recorded and replayed.
//!
//! Code map: `status.rs` the status table; `headers.rs` header names and the decision
//! headers; `idempotency_key.rs` the header's parsing; `axum.rs` `IntoResponse` and the
//! extractor; `extract.rs` key extractors; `rate_limit.rs` the rate-limit layer; `idempotency.rs` the idempotency layer;
//! `response.rs` the layers' own responses, body and future types.

#[cfg(feature = "axum")]
mod axum;
#[cfg(feature = "tower")]
mod extract;
#[cfg(feature = "http")]
mod headers;
#[cfg(feature = "tower")]
pub mod idempotency;
#[cfg(feature = "http")]
mod idempotency_key;
#[cfg(feature = "tower")]
pub mod rate_limit;
#[cfg(feature = "tower")]
mod response;
#[cfg(feature = "http")]
mod status;

#[cfg(feature = "tower")]
pub use self::extract::{ClientIp, Global, HeaderKey, KeyExtractor, PathSegment};
#[cfg(feature = "http")]
pub use self::headers::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RATELIMIT, RATELIMIT_POLICY};
#[cfg(feature = "tower")]
pub use self::idempotency::{
    IdempotencyBuilder, IdempotencyLayer, IdempotencyService, RequestBody,
};
#[cfg(feature = "http")]
pub use self::idempotency_key::{IdempotencyKey, IdempotencyKeyRejection};
#[cfg(feature = "tower")]
pub use self::rate_limit::{Policy, RateLimit, RateLimitBuilder, RateLimitLayer};
#[cfg(feature = "tower")]
pub use self::response::{Rejection, ResponseBody, ResponseFuture};
