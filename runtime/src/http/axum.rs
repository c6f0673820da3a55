//! Feature `axum`: `IntoResponse` for the guards' errors and the `IdempotencyKey` extractor.

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::request::Parts;

use super::idempotency_key::{IdempotencyKey, IdempotencyKeyRejection};
use super::response::Rejection;
use crate::error::Error;

/// `{"error": code(), "message": public_message()}` with [`status`](Error::status) and
/// [`headers`](Error::headers). The body never holds a store key or an internal detail;
/// server-side outcomes (`500`, `503`) are logged with the full error.
///
/// The response's extensions hold the [`Rejection`] and the error's
/// [`ErrorClass`](crate::ErrorClass), which an
/// [`IdempotencyLayer`](super::IdempotencyLayer) uses before the status: a busy lock's `503`
/// ran nothing, so the retry runs.
///
/// ```
/// use axum::response::IntoResponse;
/// use redguard::ErrorClass;
///
/// let response = redguard::Error::KeyReuse.into_response();
/// assert_eq!(response.status(), 422);
/// assert_eq!(response.headers()["content-type"], "application/json");
/// assert_eq!(response.extensions().get(), Some(&ErrorClass::Business));
/// ```
impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let rejection = Rejection::from_error(&self);
        let mut response = rejection.to_json_response().into_response();
        rejection.attach(&mut response);
        response
    }
}

/// A JSON `400`: `{"error": "bad_request", "message": ..}` (a business failure: nothing ran).
impl IntoResponse for IdempotencyKeyRejection {
    fn into_response(self) -> Response {
        let rejection = Rejection::new(self.status(), self.code(), self.to_string());
        let mut response = rejection.to_json_response().into_response();
        rejection.attach(&mut response);
        response
    }
}

/// Requires a valid `Idempotency-Key` header.
///
/// ```
/// use axum::{Router, routing::post};
/// use redguard::http::IdempotencyKey;
///
/// async fn pay(key: IdempotencyKey) -> String {
///     format!("paying once for {key}")
/// }
/// let app: Router = Router::new().route("/pay", post(pay));
/// ```
impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = IdempotencyKeyRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        IdempotencyKey::from_headers(&parts.headers)?.ok_or(IdempotencyKeyRejection::Missing)
    }
}

/// `Option<IdempotencyKey>`: `None` without the header; a malformed one is still a `400`.
impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = IdempotencyKeyRejection;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        IdempotencyKey::from_headers(&parts.headers)
    }
}
