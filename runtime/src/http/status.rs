//! One HTTP status table for every guard outcome, used by `IntoResponse` and by the layers.

use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode, header};

use crate::error::Error;
use crate::values::secs_ceil;

/// How long a client is told to wait before retrying when the service cannot answer now (a
/// busy lock, a store outage): short, since those clear quickly.
const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

impl Error {
    /// The HTTP status this outcome answers with:
    ///
    /// | outcome | status | [`code`](Error::code) |
    /// |---|---|---|
    /// | [`InvalidKey`](Error::InvalidKey), [`MissingKey`](Error::MissingKey) | 400 | `bad_request` |
    /// | [`TokenUnknown`](Error::TokenUnknown), [`TokenMismatch`](Error::TokenMismatch) | 400 | `token_invalid` |
    /// | [`InProgress`](Error::InProgress) | 409 + `Retry-After: 1` | `in_progress` |
    /// | [`OutcomeUnknown`](Error::OutcomeUnknown) | 409 | `outcome_unknown` |
    /// | [`TokenUsed`](Error::TokenUsed) | 409 | `token_used` |
    /// | [`KeyReuse`](Error::KeyReuse) | 422 | `key_reuse` |
    /// | [`Denied`](Error::Denied) | 403 (no `Retry-After`: retrying does not help) | `denied` |
    /// | [`RateLimited`](Error::RateLimited) | 429 + `Retry-After`, `RateLimit`, `RateLimit-Policy` | `rate_limited` |
    /// | [`LockTimeout`](Error::LockTimeout), [`LockHeld`](Error::LockHeld) | 503 + `Retry-After` | `busy` |
    /// | [`Backend`](Error::Backend), [`Timeout`](Error::Timeout), [`LockLost`](Error::LockLost), [`Cancelled`](Error::Cancelled) | 503 + `Retry-After` | `unavailable` |
    /// | anything else (configuration, corrupt data, no handle) | 500 | `internal` |
    ///
    /// ```
    /// use http::StatusCode;
    /// use redguard::Error;
    ///
    /// assert_eq!(Error::InProgress.status(), StatusCode::CONFLICT);
    /// assert_eq!(Error::KeyReuse.status(), StatusCode::UNPROCESSABLE_ENTITY);
    /// assert_eq!(Error::MissingKey { part: "user_id".into() }.status(), StatusCode::BAD_REQUEST);
    /// ```
    pub fn status(&self) -> StatusCode {
        match self {
            Error::InvalidKey { .. }
            | Error::MissingKey { .. }
            | Error::TokenUnknown
            | Error::TokenMismatch => StatusCode::BAD_REQUEST,
            Error::InProgress | Error::OutcomeUnknown | Error::TokenUsed => StatusCode::CONFLICT,
            Error::KeyReuse => StatusCode::UNPROCESSABLE_ENTITY,
            Error::Denied { .. } => StatusCode::FORBIDDEN,
            Error::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            Error::LockTimeout { .. }
            | Error::LockHeld { .. }
            | Error::Backend(_)
            | Error::Timeout { .. }
            | Error::LockLost { .. }
            | Error::Cancelled => StatusCode::SERVICE_UNAVAILABLE,
            Error::NotInstalled
            | Error::NotInScope { .. }
            | Error::Config(_)
            | Error::Corrupt { .. }
            | Error::InvalidLimit(_)
            | Error::LockTooDeep { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A stable snake_case code for the outcome, for a JSON body's `error` field (see the
    /// table at [`status`](Error::status)); clients may match on it.
    ///
    /// ```
    /// assert_eq!(redguard::Error::KeyReuse.code(), "key_reuse");
    /// ```
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidKey { .. } | Error::MissingKey { .. } => "bad_request",
            Error::TokenUnknown | Error::TokenMismatch => "token_invalid",
            Error::InProgress => "in_progress",
            Error::OutcomeUnknown => "outcome_unknown",
            Error::TokenUsed => "token_used",
            Error::KeyReuse => "key_reuse",
            Error::Denied { .. } => "denied",
            Error::RateLimited(_) => "rate_limited",
            Error::LockTimeout { .. } | Error::LockHeld { .. } => "busy",
            Error::Backend(_)
            | Error::Timeout { .. }
            | Error::LockLost { .. }
            | Error::Cancelled => "unavailable",
            Error::NotInstalled
            | Error::NotInScope { .. }
            | Error::Config(_)
            | Error::Corrupt { .. }
            | Error::InvalidLimit(_)
            | Error::LockTooDeep { .. } => "internal",
        }
    }

    /// A message safe to send to a client: what happened and what to do, never a store key,
    /// a Redis error, a host name or a configuration detail (those are in `Display`, for
    /// logs).
    ///
    /// ```
    /// let err = redguard::Error::LockTimeout {
    ///     key: "shop:lock:{orders:stock:sku-1}".into(),
    ///     waited: std::time::Duration::from_millis(300),
    /// };
    /// assert!(err.to_string().contains("shop:lock"));
    /// assert!(!err.public_message().contains("shop"));
    /// ```
    pub fn public_message(&self) -> String {
        let fixed = match self {
            Error::InvalidKey { .. } => {
                "a value of this request cannot identify it: only letters, digits and `._@-` are allowed, at most 64 bytes"
            }
            Error::MissingKey { .. } => "a value this request must carry to identify it is missing",
            Error::TokenUnknown => "unknown or expired idempotency token; fetch a new one",
            Error::TokenMismatch => "this idempotency token was issued for another operation",
            Error::TokenUsed => {
                "this idempotency token was already used; fetch a new one before submitting again"
            }
            Error::InProgress => {
                "this request is already being processed; retry shortly with the same idempotency key"
            }
            Error::OutcomeUnknown => {
                "an earlier attempt of this request ended with an unknown outcome; it is not run again until it has been checked"
            }
            Error::KeyReuse => {
                "this idempotency key was already used with a different request payload; use a new key for a new request"
            }
            Error::RateLimited(decision) => {
                return format!(
                    "too many requests; retry after {} s",
                    secs_ceil(decision.retry_after)
                );
            }
            // The operator's reason stays in logs: it may name what the client must not see.
            Error::Denied { .. } => "this client is not allowed to make this request",
            Error::LockTimeout { .. } | Error::LockHeld { .. } => {
                "the resource is busy with another request; retry shortly"
            }
            Error::Backend(_) | Error::Cancelled => {
                "the service is temporarily unavailable; retry shortly"
            }
            Error::Timeout { .. } | Error::LockLost { .. } => {
                "the outcome of this request is unknown; retry later with the same idempotency key"
            }
            _ => "internal error",
        };
        fixed.to_owned()
    }

    /// How long the client should wait before retrying, when the outcome says to wait: the
    /// limit's `retry_after` for a rejection, one second for a twin in progress, a busy lock
    /// or an unavailable store. None for an unknown outcome: a retry is refused until an
    /// operator resolves it or its record expires, however soon it comes.
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(redguard::Error::KeyReuse.retry_after(), None);
    /// assert_eq!(redguard::Error::InProgress.retry_after(), Some(Duration::from_secs(1)));
    /// assert_eq!(redguard::Error::OutcomeUnknown.retry_after(), None);
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::RateLimited(decision) => Some(decision.retry_after),
            // A twin is typically a concurrent duplicate of a request: done within seconds.
            Error::InProgress => Some(BUSY_RETRY_AFTER),
            _ if self.status() == StatusCode::SERVICE_UNAVAILABLE => Some(BUSY_RETRY_AFTER),
            _ => None,
        }
    }

    /// The headers the response carries: `Retry-After` (whole seconds, rounded up) and, for
    /// a rate limit, `RateLimit` and `RateLimit-Policy`.
    ///
    /// ```
    /// let err = redguard::Error::Timeout { after: std::time::Duration::from_secs(2) };
    /// assert_eq!(err.headers()["retry-after"], "1");
    /// ```
    pub fn headers(&self) -> HeaderMap {
        if let Error::RateLimited(decision) = self {
            return decision.header_map();
        }
        let mut headers = HeaderMap::new();
        if let Some(wait) = self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs_ceil(wait)));
        }
        headers
    }
}
