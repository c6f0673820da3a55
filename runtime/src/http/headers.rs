//! Header names, and rate-limit decisions as an [`http::HeaderMap`].

use http::{HeaderMap, HeaderName, HeaderValue, header};

use crate::values::{Decision, render_headers};

/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-09): the remaining quota of the tightest
/// policy.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-09): every policy applied.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// `Idempotent-Replayed: true` marks a response replayed from the idempotency record.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

impl Decision {
    /// [`Decision::headers`] as an [`http::HeaderMap`]: `RateLimit-Policy`, `RateLimit`, and
    /// `Retry-After` on a rejection (feature `http`).
    ///
    /// ```
    /// # let mut d = redguard::Decision::__example();
    /// d.allowed = false;
    /// d.retry_after = std::time::Duration::from_millis(1500);
    /// let headers = d.header_map();
    /// assert_eq!(headers["retry-after"], "2");
    /// assert_eq!(headers["ratelimit-policy"], "\"default\";q=1;w=1");
    /// ```
    pub fn header_map(&self) -> HeaderMap {
        to_header_map(&[("default", *self)])
    }
}

/// Renders the decisions of limits decided together, one policy name each (see
/// `render_headers`).
pub(crate) fn to_header_map(policies: &[(&str, Decision)]) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(3);
    for (name, value) in render_headers(policies) {
        let name = match name {
            "Retry-After" => header::RETRY_AFTER,
            "RateLimit-Policy" => RATELIMIT_POLICY,
            "RateLimit" => RATELIMIT,
            _ => continue,
        };
        // Policy names are checked when a layer is built, so every value is valid; one that
        // is not is left out rather than panicking on a request.
        if let Ok(value) = HeaderValue::from_str(&value) {
            map.insert(name, value);
        }
    }
    map
}
