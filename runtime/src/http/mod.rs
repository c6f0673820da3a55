//! HTTP integration (feature `http`; the layers with `tower`, the extractor and
//! `IntoResponse` with `axum`).
//!
//! - [`Error::status`](crate::Error::status), [`code`](crate::Error::code),
//!   [`public_message`](crate::Error::public_message), [`headers`](crate::Error::headers): one
//!   status table for every guard outcome, and a message safe to send to a client.
//! - [`Decision::header_map`](crate::Decision::header_map): `RateLimit`, `RateLimit-Policy`
//!   and `Retry-After` (draft-ietf-httpapi-ratelimit-headers-09).
//! - [`IdempotencyKey`]: the `Idempotency-Key` header, validated (an axum extractor with
//!   feature `axum`).
//!
//! Code map: `status.rs` the status table; `headers.rs` header names and the decision
//! headers; `idempotency_key.rs` the header's parsing; `axum.rs` `IntoResponse` and the
//! extractor.

#[cfg(feature = "axum")]
mod axum;
mod headers;
mod idempotency_key;
mod status;

pub use self::headers::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RATELIMIT, RATELIMIT_POLICY};
pub use self::idempotency_key::{IdempotencyKey, IdempotencyKeyRejection};
