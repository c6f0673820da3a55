//! The HTTP contract. Handlers validate input, call one guarded fn, and map the outcome.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::json;

use crate::error::ApiError;
use crate::orders::{self, OrderRequest, PaymentCallback, Shared};

/// All routes.
pub(crate) fn router(app: Shared, metrics: PrometheusHandle) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/admin/stock", post(set_stock))
        .route("/stock/{sku}", get(stock))
        .route("/tokens", post(issue_token))
        .route("/orders", post(submit_order).get(list_orders))
        .route("/orders/{id}", get(order))
        .route("/payments/callback", post(payment_callback))
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move { metrics.render() }
            }),
        )
        .with_state(app)
}

async fn healthz(State(app): State<Shared>) -> Json<serde_json::Value> {
    Json(json!({ "status": "ok", "store": app.store, "instance": app.config.instance }))
}

#[derive(Debug, Deserialize)]
struct SetStock {
    sku: String,
    available: u32,
}

async fn set_stock(
    State(app): State<Shared>,
    Json(body): Json<SetStock>,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_id("sku", &body.sku)?;
    app.db.set_stock(body.sku.clone(), body.available).await?;
    Ok(Json(
        json!({ "sku": body.sku, "available": body.available }),
    ))
}

async fn stock(
    State(app): State<Shared>,
    Path(sku): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let available = app.db.stock(sku.clone()).await?.ok_or(ApiError::NotFound)?;
    Ok(Json(json!({ "sku": sku, "available": available })))
}

#[derive(Debug, Deserialize)]
struct Scene {
    scene: String,
}

async fn issue_token(Query(scene): Query<Scene>) -> Result<Response, ApiError> {
    let token = redguard::tokens()
        .issue(&scene.scene, std::time::Duration::from_secs(600))
        .await
        .map_err(|err| match err {
            redguard::Error::InvalidKey { .. } => {
                ApiError::BadRequest("scene must be [A-Za-z0-9._@:-]{1,64}".into())
            }
            other => other.into(),
        })?;
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

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, ApiError> {
    headers
        .get(name)
        .ok_or_else(|| ApiError::BadRequest(format!("the {name} header is required")))?
        .to_str()
        .map_err(|_| ApiError::BadRequest(format!("the {name} header is not text")))
}

async fn submit_order(
    State(app): State<Shared>,
    headers: HeaderMap,
    Json(req): Json<OrderRequest>,
) -> Result<Response, ApiError> {
    let user_id: u64 = header(&headers, "x-user-id")?
        .parse()
        .ok()
        .filter(|id| i64::try_from(*id).is_ok())
        .ok_or_else(|| {
            ApiError::BadRequest("X-User-Id must be an integer from 0 to 2^63-1".into())
        })?;
    let idem_key = header(&headers, "idempotency-key")?.to_owned();
    check_id("Idempotency-Key", &idem_key)?;
    check_id("sku", &req.sku)?;
    if req.qty == 0 {
        return Err(ApiError::BadRequest("qty must be at least 1".into()));
    }
    if let Some(token) = headers.get("x-idempotent-token") {
        let token = token
            .to_str()
            .map_err(|_| ApiError::BadRequest("X-Idempotent-Token is not text".into()))?;
        redguard::tokens().consume("order-submit", token).await?;
    }
    let (placed, replayed) =
        redguard::track_replay(orders::submit_order(&app, user_id, &idem_key, req)).await;
    let mut response = (StatusCode::CREATED, Json(placed?)).into_response();
    if replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

async fn order(
    State(app): State<Shared>,
    Path(id): Path<i64>,
) -> Result<Json<crate::db::Order>, ApiError> {
    app.db.order(id).await?.map(Json).ok_or(ApiError::NotFound)
}

#[derive(Debug, Deserialize)]
struct ByUser {
    user_id: u64,
}

async fn list_orders(
    State(app): State<Shared>,
    Query(by): Query<ByUser>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let orders = app.db.orders_of(by.user_id).await?;
    Ok(Json(json!({ "orders": orders })))
}

async fn payment_callback(
    State(app): State<Shared>,
    Json(callback): Json<PaymentCallback>,
) -> Result<Json<orders::Paid>, ApiError> {
    check_id("payment_id", &callback.payment_id)?;
    let payment_id = callback.payment_id.clone();
    Ok(Json(
        orders::payment_callback(&app, &payment_id, callback).await?,
    ))
}
