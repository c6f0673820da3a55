//! The HTTP contract. Handlers authenticate (the extractors), validate, call one guarded fn,
//! and map the outcome. Everything that would reach Redis is checked before it does.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use redguard::http::IdempotencyKey;
use serde::Deserialize;
use serde_json::json;

use crate::auth::{Admin, Signed, User, now_s};
use crate::error::{self, ApiError, ApiJson, ApiPath};
use crate::orders::{self, OrderRequest, PaymentCallback, Shared};

/// The largest quantity one order may ask for.
const MAX_QTY: u32 = 1000;
/// The longest a user token minted by `POST /admin/tokens` lives: 30 days.
const MAX_TOKEN_TTL_S: u64 = 30 * 24 * 3600;

/// All routes.
pub(crate) fn router(app: Shared, metrics: PrometheusHandle) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/admin/stock", post(set_stock))
        .route("/admin/tokens", post(user_token))
        .route("/stock/{sku}", get(stock))
        .route("/tokens", post(issue_token))
        .route("/orders", post(submit_order).get(list_orders))
        .route("/orders/{id}", get(order))
        .route("/payments/callback", post(payment_callback))
        .route(
            "/metrics",
            get(move |_: Admin| {
                let metrics = metrics.clone();
                async move { metrics.render() }
            }),
        )
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .with_state(app)
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
        .set_stock(body.sku.clone(), body.available, body.price)
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
    let (available, price) = app.db.stock(sku.clone()).await?.ok_or(ApiError::NotFound)?;
    Ok(Json(
        json!({ "sku": sku, "available": available, "price": price }),
    ))
}

async fn issue_token(User(user_id): User, State(app): State<Shared>) -> Result<Response, ApiError> {
    let token = orders::issue_token(&app, user_id).await?;
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

/// `key`: a missing or malformed `Idempotency-Key` is the library's JSON `400 bad_request`.
async fn submit_order(
    User(user_id): User,
    key: IdempotencyKey,
    State(app): State<Shared>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<OrderRequest>,
) -> Result<Response, ApiError> {
    check_id("sku", &req.sku)?;
    if !(1..=MAX_QTY).contains(&req.qty) {
        return Err(ApiError::BadRequest(format!(
            "qty must be from 1 to {MAX_QTY}"
        )));
    }
    let token = header(&headers, "x-idempotent-token")?;
    // An unknown SKU is refused before any guard writes state for it.
    app.db
        .stock(req.sku.clone())
        .await?
        .ok_or(ApiError::NotFound)?;
    let (placed, replayed) =
        redguard::track_replay(orders::submit_order(&app, user_id, key.as_str(), token, req))
            .await;
    let placed = placed?;
    let replayed = replayed || placed.from_database;
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
        .order(id)
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
    let orders = app.db.orders_of(user_id).await?;
    Ok(Json(json!({ "orders": orders })))
}

async fn payment_callback(
    State(app): State<Shared>,
    Signed(body): Signed,
) -> Result<Json<orders::Paid>, ApiError> {
    let callback: PaymentCallback = error::parse(&body)?;
    check_id("payment_id", &callback.payment_id)?;
    // A callback for no order leaves nothing behind, not even an idempotency record.
    app.db
        .order(callback.order_id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let payment_id = callback.payment_id.clone();
    Ok(Json(
        orders::payment_callback(&app, &payment_id, callback).await?,
    ))
}
