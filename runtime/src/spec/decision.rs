//! The answer of a limit: admitted or not, and everything a `429` response needs.

use std::time::Duration;

/// What a limit decided for one call.
///
/// Carries what `429 Too Many Requests`, `Retry-After` and the IETF `RateLimit` /
/// `RateLimit-Policy` headers need; [`Decision::headers`] renders them.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// # redguard::Redguard::memory().scope(async {
/// use redguard::Rate;
///
/// let limiter = redguard::limiter("login:ip:").part("ip", "10.0.0.7").rate(Rate::per_minute(2));
/// assert!(limiter.decide().await?.allowed);
/// assert!(limiter.decide().await?.allowed);
/// let third = limiter.decide().await?;
/// assert!(!third.allowed);
/// assert_eq!(third.remaining, 0);
/// assert!(third.retry_after > std::time::Duration::from_secs(29));
/// let headers = third.headers();
/// assert_eq!(headers[0].0, "Retry-After");
/// # Ok(()) }).await }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether the call was admitted (and, unless peeked, counted).
    pub allowed: bool,
    /// The capacity: the burst (bucket algorithms) or the count per window.
    pub limit: u64,
    /// Units still available right after this decision.
    pub remaining: u64,
    /// Time until the full capacity is available again.
    pub reset_after: Duration,
    /// When rejected: the time until the same call would be admitted. Zero when allowed.
    pub retry_after: Duration,
    /// The time the full capacity takes to come back (the policy's window).
    pub window: Duration,
}

impl Decision {
    /// The decision for a call let through without asking the store (store down, fail open).
    pub(crate) fn degraded(limit: u64, window: Duration) -> Decision {
        Decision {
            allowed: true,
            limit,
            remaining: limit,
            reset_after: Duration::ZERO,
            retry_after: Duration::ZERO,
            window,
        }
    }

    /// The response headers, as `(name, value)` pairs, following
    /// draft-ietf-httpapi-ratelimit-headers: `RateLimit-Policy: "default";q=<limit>;w=<secs>`
    /// and `RateLimit: "default";r=<remaining>;t=<secs until reset>`, plus `Retry-After:
    /// <secs>` on a rejection. Seconds are rounded up, so a client waiting that long is
    /// admitted.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # let mut d = redguard::Decision::__example();
    /// d.allowed = false;
    /// d.limit = 10;
    /// d.remaining = 0;
    /// d.retry_after = Duration::from_millis(1500);
    /// d.reset_after = Duration::from_secs(9);
    /// d.window = Duration::from_secs(10);
    /// assert_eq!(
    ///     d.headers(),
    ///     vec![
    ///         ("Retry-After", "2".to_owned()),
    ///         ("RateLimit-Policy", "\"default\";q=10;w=10".to_owned()),
    ///         ("RateLimit", "\"default\";r=0;t=9".to_owned()),
    ///     ]
    /// );
    /// ```
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        self.headers_named("default")
    }

    /// [`Decision::headers`] with a policy name other than `default` (a structured-field
    /// key: lowercase letters, digits, `_-.*`).
    pub fn headers_named(&self, policy: &str) -> Vec<(&'static str, String)> {
        render_headers(&[(policy, *self)])
    }

    /// A decision to edit in examples.
    #[doc(hidden)]
    pub fn __example() -> Decision {
        Decision::degraded(1, Duration::from_secs(1))
    }
}

fn secs_ceil(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The one renderer of rate-limit headers (draft-ietf-httpapi-ratelimit-headers-09), for one
/// limit or several decided together: every policy in `RateLimit-Policy`; in `RateLimit` the
/// tightest (fewest units remaining, then the longest until reset); on a rejection,
/// `Retry-After` the longest wait among the rejecting limits. Seconds are rounded up.
pub(crate) fn render_headers(policies: &[(&str, Decision)]) -> Vec<(&'static str, String)> {
    let mut headers = Vec::with_capacity(3);
    let longest_wait = policies
        .iter()
        .filter(|(_, d)| !d.allowed)
        .map(|(_, d)| d.retry_after)
        .max();
    if let Some(wait) = longest_wait {
        headers.push(("Retry-After", secs_ceil(wait).to_string()));
    }
    let Some((tightest, d)) = policies
        .iter()
        .min_by_key(|(_, d)| (d.remaining, std::cmp::Reverse(d.reset_after)))
    else {
        return headers;
    };
    let policy_list: Vec<String> = policies
        .iter()
        .map(|(policy, d)| {
            format!(
                "\"{policy}\";q={};w={}",
                d.limit,
                secs_ceil(d.window).max(1)
            )
        })
        .collect();
    headers.push(("RateLimit-Policy", policy_list.join(", ")));
    headers.push((
        "RateLimit",
        format!(
            "\"{tightest}\";r={};t={}",
            d.remaining,
            secs_ceil(d.reset_after)
        ),
    ));
    headers
}
