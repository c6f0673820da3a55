//! Every way a request can end, with its HTTP status and a stable `error` code; axum's own
//! rejections (body, path, unknown route, method) included, so every error is JSON.

use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::header::RETRY_AFTER;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use redguard::{Classify, ErrorClass};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::db::DbError;
use crate::orders::Shared;

/// A request's failure. `From<redguard::Error>` lets guards refuse through it; `Classify`
/// tells the idempotency guard which failures a retry may run again.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// 400 `bad_request`: missing or malformed input; nothing was written.
    BadRequest(String),
    /// 400 `malformed_json`, `invalid_body`; 413 `too_large`; 408 `body_timeout`; 415
    /// `unsupported_media_type`: the body could not be read as the route's JSON.
    Body(StatusCode, &'static str, String),
    /// 401 `unauthenticated`: no identity, or one that does not verify.
    Unauthenticated(&'static str),
    /// 403 `forbidden`: an identity without the right (a wrong admin token).
    Forbidden,
    /// 404 `not_found`: also another user's order, so ids do not reveal what exists.
    NotFound,
    /// 405 `method_not_allowed`.
    MethodNotAllowed,
    /// 409 `out_of_stock`: a business outcome; the same key may be retried after restock.
    OutOfStock,
    /// 409: a payment that cannot be applied (`order_closed`, `already_paid`,
    /// `payment_conflict`) or 422 `amount_mismatch`.
    Payment(StatusCode, &'static str, &'static str),
    /// 500: the database failed; the outcome of a write is unknown.
    Internal(String),
    /// 503 `busy` with `Retry-After`: the database stayed locked (by another instance's or
    /// the job's write) until the request's deadline; nothing was written.
    DbBusy,
    /// A guard refused (or its store failed), answered as the library maps it (its
    /// `Error::status` table); also the database's `key_reuse`, the same outcome.
    Guard(redguard::Error),
}

impl From<redguard::Error> for ApiError {
    fn from(err: redguard::Error) -> Self {
        ApiError::Guard(err)
    }
}

impl From<DbError> for ApiError {
    fn from(err: DbError) -> Self {
        match err {
            DbError::Busy => ApiError::DbBusy,
            DbError::Sql(err) => ApiError::Internal(err.to_string()),
        }
    }
}

impl Classify for ApiError {
    fn class(&self) -> ErrorClass {
        match self {
            // A failed commit may or may not have landed: never re-run blindly.
            ApiError::Internal(_) => ErrorClass::Indeterminate,
            ApiError::Guard(err) => err.class(),
            // Nothing was written: the retry that `Retry-After` invites runs the body again.
            ApiError::DbBusy => ErrorClass::Business,
            _ => ErrorClass::Business,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, message): (StatusCode, &str, String) = match self {
            // The library's status, stable code, Retry-After/RateLimit headers and a message
            // that never shows a store key (its Display does: it goes to the log).
            ApiError::Guard(err) => return err.into_response(),
            ApiError::DbBusy => {
                let body = json!({
                    "error": "busy",
                    "message": "the database is busy with another request; retry shortly",
                });
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(RETRY_AFTER, "1")],
                    Json(body),
                )
                    .into_response();
            }
            ApiError::BadRequest(message) => (StatusCode::BAD_REQUEST, "bad_request", message),
            ApiError::Body(status, code, message) => (status, code, message),
            ApiError::Unauthenticated(why) => {
                (StatusCode::UNAUTHORIZED, "unauthenticated", why.into())
            }
            ApiError::Forbidden => (
                StatusCode::FORBIDDEN,
                "forbidden",
                "this credential does not allow it".into(),
            ),
            ApiError::NotFound => (
                StatusCode::NOT_FOUND,
                "not_found",
                "no such resource".into(),
            ),
            ApiError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this resource does not take that method".into(),
            ),
            ApiError::OutOfStock => (
                StatusCode::CONFLICT,
                "out_of_stock",
                "not enough stock for this order; the same request may be retried later".into(),
            ),
            ApiError::Payment(status, code, why) => (status, code, why.into()),
            ApiError::Internal(message) => {
                tracing::error!(error = %message, "request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error".into(),
                )
            }
        };
        (status, Json(json!({ "error": code, "message": message }))).into_response()
    }
}

/// Reads a whole body within `BODY_TIMEOUT_MS` and `MAX_BODY_BYTES`: a client that trickles
/// or floods its body is cut off.
pub(crate) async fn read_body(body: Body, app: &Shared) -> Result<Bytes, ApiError> {
    let timeout = Duration::from_millis(app.config.body_timeout_ms);
    match tokio::time::timeout(
        timeout,
        axum::body::to_bytes(body, app.config.max_body_bytes),
    )
    .await
    {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(ApiError::Body(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "the body is larger than {} bytes, or was cut off",
                app.config.max_body_bytes
            ),
        )),
        Err(_) => Err(ApiError::Body(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            "the body did not arrive in time".into(),
        )),
    }
}

/// A JSON body, refused with a JSON error (axum's `Json` answers in plain text).
#[derive(Debug)]
pub(crate) struct ApiJson<T>(pub(crate) T);

impl<T: DeserializeOwned> FromRequest<Shared> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &Shared) -> Result<ApiJson<T>, ApiError> {
        let (parts, body) = req.into_parts();
        json_body(&parts.headers, body, app).await.map(ApiJson)
    }
}

/// A JSON body as `T`: `415` without the JSON content type, then `read_body`, then `parse`.
pub(crate) async fn json_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    app: &Shared,
) -> Result<T, ApiError> {
    let json = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(ApiError::Body(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send content-type: application/json".into(),
        ));
    }
    parse(&read_body(body, app).await?)
}

/// `bytes` as `T`, told apart: not JSON at all, or JSON of the wrong shape or range.
pub(crate) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|err| {
        let (code, what) = match err.classify() {
            serde_json::error::Category::Data => ("invalid_body", "the body's fields"),
            _ => ("malformed_json", "the body is not JSON"),
        };
        ApiError::Body(StatusCode::BAD_REQUEST, code, format!("{what}: {err}"))
    })
}

/// A path parameter, refused with a JSON error.
#[derive(Debug)]
pub(crate) struct ApiPath<T>(pub(crate) T);

impl<T: DeserializeOwned + Send> FromRequestParts<Shared> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Shared) -> Result<ApiPath<T>, ApiError> {
        Path::<T>::from_request_parts(parts, app)
            .await
            .map(|Path(value)| ApiPath(value))
            .map_err(|rejection| ApiError::BadRequest(rejection.body_text()))
    }
}

/// Unknown routes and methods.
pub(crate) async fn not_found() -> ApiError {
    ApiError::NotFound
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
