//! The HTTP contract. A writing route runs in three stages: a middleware that authenticates
//! and validates (nothing reaches Redis before it passes), the route's `RateLimitLayer` keyed
//! on the identity that middleware established, then the handler, which calls one guarded fn
//! and maps the outcome.

use axum::body::Body;
use axum::extract::{Extension, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use redguard::http::{Global, IdempotencyKey, Policy, RateLimitLayer};
use redguard::rate::Rate;
use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;

use crate::auth::{self, Admin, User, now_s};
use crate::error::{self, ApiError, ApiJson, ApiPath};
use crate::orders::{self, OrderRequest, PaymentCallback, Shared};

#[cfg(test)]
mod limits_under_faults;
#[cfg(test)]
mod orders_under_faults;

/// The largest quantity one order may ask for.
const MAX_QTY: u32 = 1000;
/// The longest a user token minted by `POST /admin/tokens` lives: 30 days.
const MAX_TOKEN_TTL_S: u64 = 30 * 24 * 3600;

/// All routes; `Err` for a limit the settings make invalid (a burst of 0), at startup.
///
/// `MethodRouter::layer` wraps the handlers given so far, the last layer outermost: the
/// admission middleware runs first, then the limits, then the handler. A request the
/// limits refuse is answered `429` with `Retry-After`, `RateLimit` and `RateLimit-Policy`
/// before its handler (so before its token) runs.
pub(crate) fn router(app: Shared, metrics: PrometheusHandle) -> redguard::Result<Router> {
    let config = &app.config;
    // A replay costs a point too: a retry storm is load as well.
    let orders = per_user_and_api(
        "orders",
        config.user_rate,
        config.user_burst,
        config.api_rate,
    )?;
    let tokens = per_user_and_api(
        "tokens",
        config.token_rate,
        config.token_burst,
        config.token_api_rate,
    )?;
    // Callbacks are the payment provider's, not a user's: one limit for all of them.
    let callbacks = RateLimitLayer::builder(Global)
        .limit("api", config.callback_rate)
        .scope("callbacks")
        .build()?;
    Ok(Router::new()
        .route("/healthz", get(healthz))
        .route("/admin/stock", post(set_stock))
        .route("/admin/tokens", post(user_token))
        .route("/stock/{sku}", get(stock))
        .route(
            "/tokens",
            post(issue_token)
                .layer(tokens)
                .layer(from_fn_with_state(app.clone(), auth::authenticate)),
        )
        .route(
            "/orders",
            post(submit_order)
                .layer(orders)
                .layer(from_fn_with_state(app.clone(), admit_order))
                .get(list_orders),
        )
        .route("/orders/{id}", get(order))
        .route(
            "/payments/callback",
            post(payment_callback)
                .layer(callbacks)
                .layer(from_fn_with_state(app.clone(), admit_callback)),
        )
        .route(
            "/metrics",
            get(move |_: Admin| {
                let metrics = metrics.clone();
                async move { metrics.render() }
            }),
        )
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .with_state(app))
}

/// A user's limit and the API-wide one, decided together in one store call: a request
/// refused by either is charged to neither.
fn per_user_and_api(
    scope: &str,
    user: Rate,
    burst: u64,
    api: Rate,
) -> redguard::Result<RateLimitLayer<UserKey>> {
    RateLimitLayer::builder(user_key as UserKey)
        .policy(Policy::new("user", user).burst(burst))
        .policy(Policy::new("api", api).global())
        .scope(scope)
        .build()
}

type UserKey = fn(&Parts) -> Option<String>;

/// The rate-limit key: the user the admission middleware authenticated, never a value the
/// client picks (a request extension, which no client can send). None: a `400` that writes
/// nothing.
fn user_key(parts: &Parts) -> Option<String> {
    parts
        .extensions
        .get::<User>()
        .map(|User(id)| id.to_string())
}

/// The request for its handler, with what its admission found: the body is read already.
fn admitted<T: Clone + Send + Sync + 'static>(mut parts: Parts, found: T) -> Request {
    parts.extensions.insert(found);
    Request::from_parts(parts, Body::empty())
}

async fn healthz(State(app): State<Shared>) -> Json<serde_json::Value> {
    Json(json!({ "status": "ok", "store": app.store, "instance": app.instance }))
}

#[derive(Debug, Deserialize)]
struct SetStock {
    sku: String,
    available: u32,
    /// In minor units (cents).
    price: u32,
}

async fn set_stock(
    _: Admin,
    State(app): State<Shared>,
    ApiJson(body): ApiJson<SetStock>,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_id("sku", &body.sku)?;
    app.db
        .set_stock(
            app.config.deadline(),
            body.sku.clone(),
            body.available,
            body.price,
        )
        .await?;
    Ok(Json(
        json!({ "sku": body.sku, "available": body.available, "price": body.price }),
    ))
}

#[derive(Debug, Deserialize)]
struct MintToken {
    user_id: u64,
    #[serde(default = "default_ttl")]
    ttl_s: u64,
}

fn default_ttl() -> u64 {
    3600
}

/// Mints a user's bearer token. A real service does this at login; here the operator does.
/// Writes nothing: the token is verified by its signature alone.
async fn user_token(
    _: Admin,
    State(app): State<Shared>,
    ApiJson(body): ApiJson<MintToken>,
) -> Result<Response, ApiError> {
    if i64::try_from(body.user_id).is_err() || !(1..=MAX_TOKEN_TTL_S).contains(&body.ttl_s) {
        return Err(ApiError::BadRequest(format!(
            "user_id must be at most 2^63-1 and ttl_s from 1 to {MAX_TOKEN_TTL_S}"
        )));
    }
    let expires = now_s() + body.ttl_s;
    let token = app.keys.user_token(body.user_id, expires);
    let body = json!({ "token": token, "user_id": body.user_id, "expires_at": expires });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn stock(
    State(app): State<Shared>,
    ApiPath(sku): ApiPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_id("sku", &sku)?;
    let (available, price) = app
        .db
        .stock(app.config.deadline(), sku.clone())
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(Json(
        json!({ "sku": sku, "available": available, "price": price }),
    ))
}

/// Behind `auth::authenticate` and the token limits.
async fn issue_token() -> Result<Response, ApiError> {
    let token = orders::issue_token().await?;
    Ok((StatusCode::CREATED, Json(json!({ "token": token }))).into_response())
}

/// The charset and length the guards accept for values from requests; checked here first so
/// an invalid request writes nothing anywhere (not even a rate-limit point).
fn check_id(what: &str, value: &str) -> Result<(), ApiError> {
    let valid = !value.is_empty()
        && value.len() <= redguard::key::MAX_PART_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "{what} must be 1 to 64 characters from [A-Za-z0-9._@-]"
        )))
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    headers
        .get(name)
        .map(|value| {
            value
                .to_str()
                .map_err(|_| ApiError::BadRequest(format!("the {name} header is not text")))
        })
        .transpose()
}

/// `POST /orders` as checked before its limits and guards: the key, the token and the body,
/// and the request's deadline, set once its body is read.
#[derive(Debug, Clone)]
struct Admitted {
    deadline: Instant,
    key: IdempotencyKey,
    token: Option<String>,
    order: OrderRequest,
}

/// `POST /orders`' admission: the user, the headers (a missing or malformed
/// `Idempotency-Key` is the extractor's JSON `400 bad_request`), the body, then the SKU, so
/// an unknown one is `404` before any guard writes state for it.
async fn admit_order(
    State(app): State<Shared>,
    user: User,
    key: IdempotencyKey,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let (mut parts, body) = request.into_parts();
    let token = header(&parts.headers, "x-idempotent-token")?.map(str::to_owned);
    let order: OrderRequest = error::json_body(&parts.headers, body, &app).await?;
    let deadline = app.config.deadline();
    check_id("sku", &order.sku)?;
    if !(1..=MAX_QTY).contains(&order.qty) {
        return Err(ApiError::BadRequest(format!(
            "qty must be from 1 to {MAX_QTY}"
        )));
    }
    app.db
        .stock(deadline, order.sku.clone())
        .await?
        .ok_or(ApiError::NotFound)?;
    parts.extensions.insert(user);
    let admitted = admitted(
        parts,
        Admitted {
            deadline,
            key,
            token,
            order,
        },
    );
    Ok(next.run(admitted).await)
}

async fn submit_order(
    User(user_id): User,
    State(app): State<Shared>,
    Extension(Admitted {
        deadline,
        key,
        token,
        order,
    }): Extension<Admitted>,
) -> Result<Response, ApiError> {
    let submitted = orders::submit_order(
        &app,
        deadline,
        user_id,
        key.as_str(),
        token.as_deref(),
        order,
    );
    let placed = submitted.await?;
    let replayed = placed.replayed;
    let mut response = (StatusCode::CREATED, Json(placed)).into_response();
    if replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// Another user's order is `404`, as a missing one: ids do not tell what exists.
async fn order(
    User(user_id): User,
    State(app): State<Shared>,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<crate::db::Order>, ApiError> {
    app.db
        .order(app.config.deadline(), id)
        .await?
        .filter(|order| order.user_id == user_id)
        .map(Json)
        .ok_or(ApiError::NotFound)
}

/// The caller's own orders; there is no way to name another user.
async fn list_orders(
    User(user_id): User,
    State(app): State<Shared>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let orders = app.db.orders_of(app.config.deadline(), user_id).await?;
    Ok(Json(json!({ "orders": orders })))
}

/// The payment provider's callback, admitted when signed (before its body is parsed), valid,
/// and for an existing order: a callback for no order leaves nothing behind, not even a
/// rate-limit point or an idempotency record.
async fn admit_callback(
    State(app): State<Shared>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let body = auth::verify_callback(&parts.headers, body, &app).await?;
    let callback: PaymentCallback = error::parse(&body)?;
    let deadline = app.config.deadline();
    check_id("payment_id", &callback.payment_id)?;
    app.db
        .order(deadline, callback.order_id)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(next.run(admitted(parts, (deadline, callback))).await)
}

async fn payment_callback(
    State(app): State<Shared>,
    Extension((deadline, callback)): Extension<(Instant, PaymentCallback)>,
) -> Result<Json<orders::Paid>, ApiError> {
    let payment_id = callback.payment_id.clone();
    Ok(Json(
        orders::payment_callback(&app, deadline, &payment_id, callback).await?,
    ))
}
