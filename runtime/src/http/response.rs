//! Responses the layers answer by themselves, and their body and future types.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{Either, Full};

use crate::error::Error;

/// The body of a layer's response: the inner service's (`Left`), or one the layer wrote (a
/// rejection, a replay: `Right`).
pub type ResponseBody<B> = Either<B, Full<Bytes>>;

/// `{"error": code, "message": message}` as `application/json`.
pub(crate) fn json_error(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "error": code, "message": message }).to_string();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The response for a guard's error: [`Error::status`], its JSON body and headers. The body
/// holds only [`Error::public_message`]; server-side outcomes are logged in full.
pub(crate) fn error_response(err: &Error) -> Response<Full<Bytes>> {
    let status = err.status();
    if status.is_server_error() {
        tracing::warn!(error = %err, code = err.code(), "guard error answered with {status}");
    }
    let mut response = json_error(status, err.code(), &err.public_message());
    response.headers_mut().extend(err.headers());
    response
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
