//! Who is calling. Users: a bearer token this service signed, or `X-User-Id` from a trusted
//! proxy. Admins: `Authorization: Bearer <ADMIN_TOKEN>`. The payment provider: an HMAC over
//! the timestamp and body. Nothing is written anywhere before one of these is established.

use std::net::{IpAddr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, FromRequestParts, Request};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::orders::Shared;

type HmacSha256 = Hmac<Sha256>;

/// The secrets, as the extractors use them.
#[derive(Debug)]
pub(crate) struct Keys {
    user: Vec<u8>,
    /// SHA-256 of the admin token: compared in constant time at a fixed length.
    admin: [u8; 32],
    payment: Vec<u8>,
    trusted_proxies: Vec<IpAddr>,
    callback_window_s: u64,
}

impl Keys {
    pub(crate) fn new(config: &crate::Config) -> Keys {
        let bytes = |value: &Option<crate::config::Secret>| {
            value
                .as_ref()
                .map(|secret| secret.0.clone().into_bytes())
                .unwrap_or_default()
        };
        Keys {
            user: bytes(&config.auth_secret),
            admin: Sha256::digest(bytes(&config.admin_token)).into(),
            payment: bytes(&config.payment_secret),
            trusted_proxies: config.trusted_proxies.0.clone(),
            callback_window_s: config.callback_window_s,
        }
    }

    /// A bearer token for `user_id`, valid until `expires` (Unix seconds):
    /// `<user_id>.<expires>.<hex HMAC-SHA256(AUTH_SECRET, "<user_id>.<expires>")>`.
    pub(crate) fn user_token(&self, user_id: u64, expires: u64) -> String {
        let claims = format!("{user_id}.{expires}");
        let tag = hex(&mac(&self.user, &[claims.as_bytes()])
            .finalize()
            .into_bytes());
        format!("{claims}.{tag}")
    }

    /// The user a token names, if this service signed it and it has not expired.
    fn verify_user(&self, token: &str) -> Option<u64> {
        let (claims, tag) = token.rsplit_once('.')?;
        let (user, expires) = claims.split_once('.')?;
        mac(&self.user, &[claims.as_bytes()])
            .verify_slice(&unhex(tag)?)
            .ok()?;
        let expires: u64 = expires.parse().ok()?;
        (expires > now_s()).then_some(())?;
        user_id(user)
    }
}

fn mac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part);
    }
    mac
}

pub(crate) fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// User ids fit SQLite's signed 64-bit integers.
fn user_id(text: &str) -> Option<u64> {
    text.parse().ok().filter(|id| i64::try_from(*id).is_ok())
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// An authenticated user. A bearer token wins; `X-User-Id` is believed only from a peer in
/// `TRUSTED_PROXIES`, which must strip the header from what its clients send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct User(pub(crate) u64);

impl FromRequestParts<Shared> for User {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Shared) -> Result<User, ApiError> {
        // Established by `authenticate` or an admission in front: an extension, which no
        // client can send.
        if let Some(user) = parts.extensions.get::<User>() {
            return Ok(*user);
        }
        let keys = &app.keys;
        if let Some(token) = bearer(&parts.headers) {
            return keys
                .verify_user(token)
                .map(User)
                .ok_or(ApiError::Unauthenticated(
                    "the bearer token is invalid or expired",
                ));
        }
        let Some(claimed) = parts.headers.get("x-user-id") else {
            return Err(ApiError::Unauthenticated(
                "send Authorization: Bearer <token> (from POST /admin/tokens)",
            ));
        };
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            // An IPv4 client of a dual-stack listener shows as ::ffff:a.b.c.d.
            .map(|ConnectInfo(peer)| peer.ip().to_canonical());
        if !peer.is_some_and(|peer| keys.trusted_proxies.contains(&peer)) {
            return Err(ApiError::Unauthenticated(
                "X-User-Id is only accepted from a trusted proxy",
            ));
        }
        claimed
            .to_str()
            .ok()
            .and_then(user_id)
            .map(User)
            .ok_or_else(|| {
                ApiError::BadRequest("X-User-Id must be an integer from 0 to 2^63-1".into())
            })
    }
}

/// A middleware that refuses an unauthenticated request before the layers behind it (a rate
/// limit keyed on the user writes nothing for it), and hands them the `User`.
pub(crate) async fn authenticate(user: User, mut request: Request, next: Next) -> Response {
    request.extensions_mut().insert(user);
    next.run(request).await
}

/// The operator: `Authorization: Bearer <ADMIN_TOKEN>`; 401 without it, 403 with another.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admin;

impl FromRequestParts<Shared> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Shared) -> Result<Admin, ApiError> {
        let token = bearer(&parts.headers).ok_or(ApiError::Unauthenticated(
            "send Authorization: Bearer <ADMIN_TOKEN>",
        ))?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if bool::from(digest.ct_eq(&app.keys.admin)) {
            Ok(Admin)
        } else {
            Err(ApiError::Forbidden)
        }
    }
}

/// The body, if the payment provider signed it: `X-Signature-Timestamp: <Unix seconds>` within
/// the replay window of this server's clock, and `X-Signature: <hex HMAC-SHA256(PAYMENT_SECRET,
/// "<timestamp>." + body)>`. Checked before the body is parsed.
pub(crate) async fn verify_callback(
    headers: &HeaderMap,
    body: Body,
    app: &Shared,
) -> Result<Bytes, ApiError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let unsigned = ApiError::Unauthenticated("the callback's signature is missing or wrong");
    let (Some(timestamp), Some(signature)) =
        (header("x-signature-timestamp"), header("x-signature"))
    else {
        return Err(unsigned);
    };
    let keys = &app.keys;
    let fresh = timestamp
        .parse::<u64>()
        .is_ok_and(|at| at.abs_diff(now_s()) <= keys.callback_window_s);
    if !fresh {
        return Err(ApiError::Unauthenticated(
            "the callback's timestamp is outside the replay window",
        ));
    }
    let body = crate::error::read_body(body, app).await?;
    let tag = unhex(signature).ok_or(ApiError::Unauthenticated(
        "the callback's signature is missing or wrong",
    ))?;
    mac(&keys.payment, &[timestamp.as_bytes(), b".", &body])
        .verify_slice(&tag)
        .map_err(|_| unsigned)?;
    Ok(body)
}

/// What a payment provider (or a test) sends as `X-Signature` for `body` at `timestamp`
/// (Unix seconds, sent as `X-Signature-Timestamp`).
///
/// ```
/// let signature = order_service::sign_callback(b"shared-payment-secret", 1_700_000_000, br#"{"amount":1}"#);
/// assert_eq!(signature.len(), 64);
/// ```
pub fn sign_callback(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    let timestamp = timestamp.to_string();
    hex(&mac(secret, &[timestamp.as_bytes(), b".", body])
        .finalize()
        .into_bytes())
}
