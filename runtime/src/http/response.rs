//! Responses the layers answer by themselves, and their body and future types.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body_util::{Either, Full};

use crate::error::Error;
use crate::idempotency::{Classify, ErrorClass};

/// The body of a layer's response: the inner service's (`Left`), or one the layer wrote (a
/// rejection, a replay: `Right`).
pub type ResponseBody<B> = Either<B, Full<Bytes>>;

/// Why a layer answered a request itself (a rate limit, a missing or invalid key, an
/// idempotency refusal, a store outage): the status, a stable code, a message safe for
/// clients, and the headers the response must carry (`Retry-After`, `RateLimit`, ...).
///
/// Every such response carries its `Rejection` in its extensions, so outer layers (logging,
/// metrics) can see why, and its [`ErrorClass`], so an
/// [`IdempotencyLayer`](super::IdempotencyLayer) around it releases or keeps its record by
/// what happened rather than by the status code. A layer's `on_rejection` hook renders the
/// body; the default is [`to_json_response`](Rejection::to_json_response).
///
/// ```
/// use redguard::ErrorClass;
/// use redguard::http::Rejection;
///
/// let rejection = Rejection::from_error(&redguard::Error::InProgress);
/// assert_eq!(rejection.status(), 409);
/// assert_eq!(rejection.code(), "in_progress");
/// assert_eq!(rejection.class(), ErrorClass::Business);
/// let response = rejection.to_json_response();
/// assert_eq!(response.headers()["content-type"], "application/json");
/// ```
#[derive(Debug, Clone)]
pub struct Rejection {
    status: StatusCode,
    code: &'static str,
    message: String,
    headers: HeaderMap,
    class: ErrorClass,
}

impl Rejection {
    /// A refusal by the layer itself, before anything downstream ran: business.
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Rejection {
            status,
            code,
            message: message.into(),
            headers: HeaderMap::new(),
            class: ErrorClass::Business,
        }
    }

    /// The rejection for a guard's error: [`Error::status`], [`Error::code`],
    /// [`Error::public_message`], [`Error::headers`]. A server-side outcome (`5xx`) is
    /// logged in full here, since the response will not show it.
    pub fn from_error(err: &Error) -> Rejection {
        let status = err.status();
        if status.is_server_error() {
            tracing::warn!(error = %err, code = err.code(), "guard error answered with {status}");
        }
        Rejection {
            status,
            code: err.code(),
            message: err.public_message(),
            headers: err.headers(),
            class: err.class(),
        }
    }

    /// The response status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable snake_case code (`rate_limited`, `bad_request`, ...).
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// A message safe to show a client.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The headers the response carries whatever renders its body.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// Whether a retry may run: [`ErrorClass::Business`] when nothing was applied (a refusal,
    /// a busy lock), [`ErrorClass::Indeterminate`] when the outcome is unknown (a store
    /// timeout, a lock lost mid-body). Also in the response's extensions.
    pub fn class(&self) -> ErrorClass {
        self.class
    }

    pub(crate) fn headers_mut(&mut self) -> &mut HeaderMap {
        &mut self.headers
    }

    /// The default response: the status, the headers and
    /// `{"error": code, "message": message}` as `application/json`.
    pub fn to_json_response(&self) -> Response<Full<Bytes>> {
        let body = serde_json::json!({ "error": self.code, "message": self.message }).to_string();
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }
}

/// A layer's `on_rejection` hook.
pub(crate) type OnRejection = Arc<dyn Fn(&Rejection) -> Response<Full<Bytes>> + Send + Sync>;

/// The response for `rejection`: rendered by `hook` or as JSON, with the rejection's headers,
/// and the rejection itself and its class in its extensions.
pub(crate) fn reject<B>(
    hook: Option<&OnRejection>,
    rejection: Rejection,
) -> Response<ResponseBody<B>> {
    let mut response = match hook {
        Some(hook) => hook(&rejection),
        None => rejection.to_json_response(),
    };
    rejection.attach(&mut response);
    response.map(Either::Right)
}

impl Rejection {
    /// Adds the headers, the rejection and its class to `response`.
    pub(crate) fn attach<B>(self, response: &mut Response<B>) {
        response.headers_mut().extend(self.headers.clone());
        response.extensions_mut().insert(self.class);
        response.extensions_mut().insert(self);
    }
}

/// The future of a layer's service: ready at once when the layer answered without a store
/// call, else boxed (the store's decision is an `async fn`).
pub struct ResponseFuture<R, E> {
    kind: Kind<R, E>,
}

enum Kind<R, E> {
    Ready(Option<Result<R, E>>),
    Boxed(BoxFuture<'static, Result<R, E>>),
}

impl<R, E> ResponseFuture<R, E> {
    pub(crate) fn ready(response: R) -> Self {
        ResponseFuture {
            kind: Kind::Ready(Some(Ok(response))),
        }
    }

    pub(crate) fn boxed(future: BoxFuture<'static, Result<R, E>>) -> Self {
        ResponseFuture {
            kind: Kind::Boxed(future),
        }
    }
}

// Nothing is pinned structurally: the ready output is moved out, the boxed future is pinned
// on the heap.
impl<R, E> Unpin for ResponseFuture<R, E> {}

impl<R, E> Future for ResponseFuture<R, E> {
    type Output = Result<R, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().kind {
            Kind::Ready(ready) => match ready.take() {
                Some(output) => Poll::Ready(output),
                None => Poll::Pending,
            },
            Kind::Boxed(future) => future.as_mut().poll(cx),
        }
    }
}

impl<R, E> fmt::Debug for ResponseFuture<R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
