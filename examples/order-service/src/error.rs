//! Every way a request can end, with its HTTP status and error code.

use axum::Json;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use redguard::{Classify, ErrorClass};
use serde_json::json;

/// A request's failure. `From<redguard::Error>` lets guards refuse through it; `Classify`
/// tells `#[idempotent]` which failures a retry may run again.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// 400: missing or malformed input; nothing was written.
    BadRequest(String),
    /// 404.
    NotFound,
    /// 409 `out_of_stock`: a business outcome; the same key may be retried after restock.
    OutOfStock,
    /// 500: the database failed; the outcome of a write is unknown.
    Internal(String),
    /// A guard refused (or its store failed).
    Guard(redguard::Error),
}

impl From<redguard::Error> for ApiError {
    fn from(err: redguard::Error) -> Self {
        ApiError::Guard(err)
    }
}

impl From<rusqlite::Error> for ApiError {
    fn from(err: rusqlite::Error) -> Self {
        ApiError::Internal(err.to_string())
    }
}

impl Classify for ApiError {
    fn class(&self) -> ErrorClass {
        match self {
            ApiError::BadRequest(_) | ApiError::NotFound | ApiError::OutOfStock => {
                ErrorClass::Business
            }
            // A failed commit may or may not have landed: never re-run blindly.
            ApiError::Internal(_) => ErrorClass::Indeterminate,
            ApiError::Guard(err) => err.class(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        use redguard::Error as G;
        let mut headers: Vec<(&'static str, String)> = Vec::new();
        let (status, code, message) = match &self {
            ApiError::BadRequest(message) => {
                (StatusCode::BAD_REQUEST, "bad_request", message.clone())
            }
            ApiError::NotFound => (
                StatusCode::NOT_FOUND,
                "not_found",
                "no such resource".into(),
            ),
            ApiError::OutOfStock => (
                StatusCode::CONFLICT,
                "out_of_stock",
                "not enough stock for this order; the same request may be retried later".into(),
            ),
            ApiError::Internal(message) => {
                tracing::error!(error = %message, "request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error".into(),
                )
            }
            ApiError::Guard(err) => {
                let (status, code) = match err {
                    G::InvalidKey { .. } | G::MissingKey { .. } => {
                        (StatusCode::BAD_REQUEST, "bad_request")
                    }
                    G::InProgress => (StatusCode::CONFLICT, "in_progress"),
                    G::KeyReuse => (StatusCode::UNPROCESSABLE_ENTITY, "key_reuse"),
                    G::TokenUsed => (StatusCode::CONFLICT, "token_used"),
                    G::TokenUnknown | G::TokenMismatch => {
                        (StatusCode::BAD_REQUEST, "token_invalid")
                    }
                    G::RateLimited(decision) => {
                        headers.extend(decision.headers());
                        (StatusCode::TOO_MANY_REQUESTS, "rate_limited")
                    }
                    G::LockTimeout { .. } | G::LockHeld { .. } => {
                        headers.push(("retry-after", "1".to_owned()));
                        (StatusCode::SERVICE_UNAVAILABLE, "busy")
                    }
                    G::Backend(_) | G::LockLost { .. } | G::Timeout { .. } => {
                        headers.push(("retry-after", "1".to_owned()));
                        (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
                    }
                    _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
                };
                (status, code, err.to_string())
            }
        };
        let mut response =
            (status, Json(json!({ "error": code, "message": message }))).into_response();
        for (name, value) in headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                response.headers_mut().insert(name, value);
            }
        }
        response
    }
}
