//! The `Idempotency-Key` request header, parsed and validated by the key rules.

use http::HeaderMap;

use super::headers::IDEMPOTENCY_KEY;
use crate::key::{KeyBody, KeyBuilder, KeyPart};

/// A validated `Idempotency-Key` header (draft-ietf-httpapi-idempotency-key-header).
///
/// The draft's value is a structured-field string (`Idempotency-Key: "8e03978e-40d5"`); a bare
/// token (`Idempotency-Key: 8e03978e-40d5`) is accepted too, since many clients send one. The
/// key must follow the key rules ([`KeyPart`]): `[A-Za-z0-9._@-]`, at most 64 bytes (a UUID
/// fits), so it can go into a guard key as it is.
///
/// With feature `axum` it is an extractor: `IdempotencyKey` rejects a request without a valid
/// key, `Option<IdempotencyKey>` accepts one without the header but still rejects a malformed
/// one; either rejection is a JSON `400` (see [`IdempotencyKeyRejection`]).
///
/// ```
/// use http::HeaderMap;
/// use redguard::http::IdempotencyKey;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("idempotency-key", "\"order-7f3a\"".parse().unwrap());
/// let key = IdempotencyKey::from_headers(&headers)?.expect("present");
/// assert_eq!(key.as_str(), "order-7f3a");
///
/// headers.insert("idempotency-key", "no spaces".parse().unwrap());
/// assert!(IdempotencyKey::from_headers(&headers).is_err());
/// # Ok::<(), redguard::http::IdempotencyKeyRejection>(())
/// ```
///
/// It is a [`KeyPart`], so a handler can pass it to `#[idempotent]`:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// use redguard::http::IdempotencyKey;
///
/// #[redguard::idempotent(key = "pay:{key}", expire = "1h")]
/// async fn pay(key: &IdempotencyKey, cents: u64) -> redguard::Result<u64> {
///     Ok(cents)
/// }
///
/// let key = IdempotencyKey::parse(b"9f1c-77").expect("valid");
/// let rg = redguard::Redguard::memory();
/// assert_eq!(rg.scope(pay(&key, 500)).await?, 500);
/// assert_eq!(rg.scope(redguard::idempotency::track_replay(pay(&key, 500))).await.1, true);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey {
    value: String,
    body: KeyBody,
}

impl IdempotencyKey {
    /// Parses a header value: an sf-string or a bare token, then the key rules.
    pub fn parse(value: &[u8]) -> Result<IdempotencyKey, IdempotencyKeyRejection> {
        let text = std::str::from_utf8(value).map_err(|_| IdempotencyKeyRejection::Invalid)?;
        let text = text.trim();
        let text = match text.strip_prefix('"') {
            Some(rest) => rest
                .strip_suffix('"')
                .ok_or(IdempotencyKeyRejection::Invalid)?,
            None => text,
        };
        if text.is_empty() {
            return Err(IdempotencyKeyRejection::Invalid);
        }
        let body = KeyBuilder::new()
            .part("Idempotency-Key", text)
            .finish()
            .map_err(|_| IdempotencyKeyRejection::Invalid)?;
        Ok(IdempotencyKey {
            value: text.to_owned(),
            body,
        })
    }

    /// The key from `headers`: `Ok(None)` when the header is absent, an error when it is
    /// malformed or given twice.
    pub fn from_headers(
        headers: &HeaderMap,
    ) -> Result<Option<IdempotencyKey>, IdempotencyKeyRejection> {
        let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
        let Some(first) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(IdempotencyKeyRejection::Invalid);
        }
        IdempotencyKey::parse(first.as_bytes()).map(Some)
    }

    /// The key as the client sent it (without the quotes).
    pub fn as_str(&self) -> &str {
        &self.value
    }

    /// The key as a validated key body, for [`redguard::idempotency`](crate::idempotency()).
    pub fn key_body(&self) -> &KeyBody {
        &self.body
    }
}

impl KeyPart for IdempotencyKey {
    fn write_key_part(&self, out: &mut String) {
        out.push_str(&self.value);
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.value)
    }
}

/// Why a request has no usable `Idempotency-Key`. Both are `400 Bad Request`; with feature
/// `axum` the response is `{"error": "bad_request", "message": ..}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdempotencyKeyRejection {
    /// The header is absent.
    #[error("this request needs an `Idempotency-Key` header (a UUID, for instance)")]
    Missing,
    /// The header is malformed, given twice, or breaks the key rules.
    #[error(
        "the `Idempotency-Key` header is invalid: use one value of letters, digits and `._@-`, at most 64 bytes"
    )]
    Invalid,
}

impl IdempotencyKeyRejection {
    /// `400 Bad Request`.
    pub fn status(&self) -> http::StatusCode {
        http::StatusCode::BAD_REQUEST
    }

    /// The stable code of the JSON body: `bad_request`.
    pub fn code(&self) -> &'static str {
        "bad_request"
    }

    /// Whether the header was absent (rather than malformed).
    pub fn is_missing(&self) -> bool {
        matches!(self, IdempotencyKeyRejection::Missing)
    }
}
