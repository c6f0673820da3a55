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
/// use redguard::rate::Rate;
///
/// let limiter = redguard::limiter(redguard::key("login:ip:{ip}").part("ip", "10.0.0.7")).rate(Rate::per_minute(2));
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

/// Whole seconds, rounded up: a client waiting that long is admitted.
pub(crate) fn secs_ceil(d: Duration) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(retry_after: Duration, reset_after: Duration) -> Decision {
        let mut d = Decision::degraded(10, Duration::from_secs(60));
        d.allowed = false;
        d.remaining = 0;
        d.retry_after = retry_after;
        d.reset_after = reset_after;
        d
    }

    #[test]
    fn seconds_round_up_never_down() {
        assert_eq!(secs_ceil(Duration::ZERO), 0);
        assert_eq!(secs_ceil(Duration::from_nanos(1)), 1);
        assert_eq!(secs_ceil(Duration::from_secs(2)), 2);
        assert_eq!(secs_ceil(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn a_refusal_tells_when_to_come_back() {
        // A client told `Retry-After: 0` after 300 ms would be refused again at once.
        let d = refused(Duration::from_millis(300), Duration::from_millis(59_001));
        assert_eq!(
            d.headers_named("per-ip"),
            vec![
                ("Retry-After", "1".to_owned()),
                ("RateLimit-Policy", "\"per-ip\";q=10;w=60".to_owned()),
                ("RateLimit", "\"per-ip\";r=0;t=60".to_owned()),
            ]
        );
    }

    #[test]
    fn an_admission_has_no_retry_after() {
        let mut d = refused(Duration::ZERO, Duration::ZERO);
        d.allowed = true;
        d.remaining = 9;
        d.window = Duration::from_millis(1);
        assert_eq!(
            d.headers(),
            vec![
                ("RateLimit-Policy", "\"default\";q=10;w=1".to_owned()),
                ("RateLimit", "\"default\";r=9;t=0".to_owned()),
            ]
        );
    }

    #[test]
    fn stacked_limits_show_every_policy_the_tightest_and_the_longest_wait() {
        let mut loose = refused(Duration::from_secs(2), Duration::from_secs(30));
        loose.limit = 100;
        loose.remaining = 0;
        let tight = refused(Duration::from_millis(4500), Duration::from_secs(50));
        let mut admitting = refused(Duration::ZERO, Duration::from_secs(1));
        admitting.allowed = true;
        admitting.remaining = 5;
        assert_eq!(
            render_headers(&[("a", loose), ("b", tight), ("c", admitting)]),
            vec![
                ("Retry-After", "5".to_owned()),
                (
                    "RateLimit-Policy",
                    "\"a\";q=100;w=60, \"b\";q=10;w=60, \"c\";q=10;w=60".to_owned()
                ),
                // Both refusing limits have nothing left: the one resetting later is tighter.
                ("RateLimit", "\"b\";r=0;t=50".to_owned()),
            ]
        );
    }
}
