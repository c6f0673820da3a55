//! The one error type every guard returns.
//!
//! Each variant is an outcome a caller handles differently (a different HTTP status, a retry or
//! not); details that only help a human reading logs live in the message.

use std::time::Duration;

use crate::key::KeyRule;

/// Everything that can stop a guarded call.
///
/// Annotated fns return `Result<T, E>` with `E: From<redguard::Error>`, so a guard's refusal
/// flows out through the user's own error type.
///
/// ```
/// use redguard::Error;
///
/// fn status(err: &Error) -> u16 {
///     match err {
///         Error::InvalidKey { .. } | Error::MissingKey { .. } => 400,
///         Error::Backend(_) => 503,
///         _ => 500,
///     }
/// }
/// assert_eq!(status(&Error::MissingKey { part: "user_id".into() }), 400);
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A guard ran before any [`Redguard`](crate::Redguard) was installed.
    #[error(
        "no redguard store is installed: call `Redguard::from_env().await?.install()` \
         (or `Redguard::memory().install()`) once at startup, before the first guarded call"
    )]
    NotInstalled,

    /// A guard ran in a task with no handle while a [`Redguard::scope`](crate::Redguard::scope)
    /// is running elsewhere: a scope does not reach into tasks started with `tokio::spawn`.
    /// Start them with [`redguard::spawn`](crate::spawn), which carries the handle along, or
    /// [`Redguard::spawn`](crate::Redguard::spawn).
    #[error("{}", if *spawned_unscoped {
        "no redguard handle in this task: it was started by `redguard::spawn` outside any \
         scope, which takes the handle scoped where it is called; `rg.scope(redguard::spawn(fut))` \
         spawns before the scope exists. Write `rg.spawn(fut)` (a task on `rg`), or call \
         `redguard::spawn` inside the scope: `rg.scope(async { redguard::spawn(fut).await })`"
    } else {
        "no redguard handle in this task: `Redguard::scope` does not reach into tasks started \
         with `tokio::spawn`; start the task with `redguard::spawn(..)` (it carries the current \
         handle) or `rg.spawn(..)`, run its future under `handle.scope(..)`, or install a \
         default handle"
    })]
    NotInScope {
        /// The task was started by [`redguard::spawn`](crate::spawn) where no handle was
        /// scoped (not by `tokio::spawn`).
        spawned_unscoped: bool,
    },

    /// A value rendered into a key broke a key rule; nothing was sent to the store.
    #[error("invalid key part `{part}`: {rule}; reject this input before it reaches the guard")]
    InvalidKey {
        /// The placeholder (or `prefix`/`scope`/`key`) that broke the rule.
        part: String,
        /// Which rule it broke.
        rule: KeyRule,
    },

    /// A key part was absent (`None` or empty): the guard cannot tell intents apart.
    #[error("key part `{part}` is missing (None or empty); the request must carry it")]
    MissingKey {
        /// The placeholder that rendered empty.
        part: String,
    },

    /// The configuration given to a builder is unusable, or a guard was called outside a
    /// Tokio runtime (its waits, timers and tasks are Tokio's).
    #[error("invalid redguard configuration: {0}")]
    Config(String),

    /// The store could not answer (unreachable, timed out, refused the command).
    #[error(transparent)]
    Backend(#[from] BackendError),

    /// The store holds data at a guard key that redguard did not write in that shape.
    #[error("unexpected data at `{key}`: {detail}; inspect or delete that key")]
    Corrupt {
        /// The full store key.
        key: String,
        /// What was found instead.
        detail: String,
    },

    /// Another execution of this intent is running now (or crashed, and its record has not
    /// expired yet: a crash leaves no verdict). HTTP 409 with `Retry-After: 1`: a retry
    /// soon gets the twin's result.
    #[error("this request is already being processed; retry shortly with the same idempotency key")]
    InProgress,

    /// An earlier execution of this intent ended with an unknown outcome (an indeterminate
    /// error, a timeout, a panic, its caller dropped mid-body): its effects may or may not
    /// have happened, so it is not run again until an operator resolves it (`redguard
    /// resolve`, [`Admin::resolve`](crate::admin::Admin::resolve)) or the record expires.
    /// HTTP 409 without `Retry-After`: retrying soon does not help.
    #[error(
        "an earlier attempt of this request ended with an unknown outcome; it is not run again \
         until it is resolved (`redguard resolve`) or its record expires"
    )]
    OutcomeUnknown,

    /// The idempotency key was used before with a different payload. HTTP 422.
    #[error(
        "this idempotency key was already used with a different request payload; use a new \
         key for a new request"
    )]
    KeyReuse,

    /// A guarded body ran past its `timeout`; its outcome is unknown.
    #[error("the guarded operation did not finish within {after:?}; its outcome is unknown")]
    Timeout {
        /// The bound that elapsed.
        after: Duration,
    },

    /// A detached guarded body (see [`Idempotency::detach`](crate::idempotency::Idempotency::detach)) was
    /// dropped before it finished, because the runtime shut down; its outcome is unknown.
    #[error(
        "the guarded operation was stopped before it finished (the runtime shut down); its outcome is unknown"
    )]
    Cancelled,

    /// A rate limit rejected the call. The [`Decision`](crate::Decision) says when to retry
    /// and renders the `429` headers ([`Decision::headers`](crate::Decision::headers)).
    #[error(
        "rate limited: retry after {:.3}s ({} of {} remaining)",
        .0.retry_after.as_secs_f64(),
        .0.remaining,
        .0.limit
    )]
    RateLimited(crate::values::Decision),

    /// The rate-limit key is on its scope's deny list (`redguard deny add`,
    /// [`Admin::deny_add`](crate::admin::Admin::deny_add)): refused before its limit was
    /// read, so it consumed nothing. HTTP 403 (`"code": "denied"`): retrying does not help.
    ///
    /// ```
    /// let err = redguard::Error::Denied { key: "rg:rate:{api:tenant:acme}".into(), reason: Some("abuse".into()) };
    /// assert_eq!(err.to_string(), "denied: `rg:rate:{api:tenant:acme}` is on its deny list (abuse)");
    /// ```
    #[error("denied: `{key}` is on its deny list{}", reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default())]
    Denied {
        /// The full store key of the denied limit.
        key: String,
        /// The reason the operator gave, if any.
        reason: Option<String>,
    },

    /// A rate, burst, cost or block given at runtime (from configuration or an expression) is
    /// unusable; nothing was sent to the store.
    #[error("invalid rate limit: {0}")]
    InvalidLimit(String),

    /// An idempotency token was already consumed by an earlier request.
    #[error("this idempotency token was already used; fetch a new one before submitting again")]
    TokenUsed,

    /// An idempotency token is unknown: never issued, forged, or expired.
    #[error("unknown or expired idempotency token; fetch a new one")]
    TokenUnknown,

    /// An idempotency token exists but was issued for another scene.
    #[error("this idempotency token was issued for another operation")]
    TokenMismatch,

    /// The lock stayed held by someone else for the whole `wait`.
    #[error(
        "lock `{key}` is held by another owner; gave up after waiting {waited:?}: retry later, \
         or raise `wait` if the section is expected to be busy"
    )]
    LockTimeout {
        /// The full store key.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// `skip_if_held`: the lock is held, so this run was skipped without waiting (the
    /// scheduled-job outcome "another instance is doing it").
    #[error("lock `{key}` is held by another owner; skipped this run (`skip_if_held`)")]
    LockHeld {
        /// The full store key.
        key: String,
    },

    /// The lock was lost while held: its lease ran out or another process took the key. The
    /// section may have overlapped with another holder; storage writes should check the
    /// fencing token.
    #[error(
        "lock `{key}` was lost while held (lease expired or key taken); the guarded work was \
         cancelled or may have overlapped with another holder: retry it"
    )]
    LockLost {
        /// The full store key.
        key: String,
    },

    /// The same task entered a lock more times than the depth limit allows.
    #[error(
        "lock `{key}` re-entered {depth} levels deep by the same task, past the limit; \
         look for unbounded recursion into the locked section"
    )]
    LockTooDeep {
        /// The full store key.
        key: String,
        /// The depth reached.
        depth: u32,
    },
}

/// Why the store could not answer.
///
/// Guards map this through their degradation policy ([`FailMode`](crate::handle::FailMode)) before it
/// reaches a caller: a fail-open guard logs it and lets the call through.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The call did not complete within the configured per-call timeout.
    #[error("store call `{op}` timed out after {after:?}; is Redis overloaded or unreachable?")]
    Timeout {
        /// The guard operation that timed out.
        op: &'static str,
        /// The configured timeout.
        after: Duration,
    },
    /// The store refused or failed the call: an error reply (out of memory, no permission),
    /// a broken connection.
    #[error("store call `{op}` failed: {source}")]
    Failed {
        /// The guard operation that failed.
        op: &'static str,
        /// What the store's client reported.
        #[source]
        source: StoreFailure,
    },
    /// The write was made, but fewer replicas than asked confirmed it in time (see
    /// [`Replicas`](crate::store::Replicas)): a failover now could lose it. A lock acquisition or an
    /// idempotency begin is undone; a token is not handed out.
    #[error(
        "store call `{op}` was confirmed by {confirmed} of {wanted} replica(s) within {after:?}; \
         are the replicas up and keeping up?"
    )]
    Unconfirmed {
        /// The guard operation whose write was not confirmed.
        op: &'static str,
        /// How many replicas were asked for.
        wanted: u32,
        /// How many confirmed (`WAIT`'s reply).
        confirmed: u32,
        /// How long `WAIT` waited.
        after: Duration,
    },
}

/// What a store's client reported when a call failed.
///
/// Opaque on purpose: the public API does not change with the Redis client's version. The
/// message is the client's; [`code`](StoreFailure::code) is the server's error code when it
/// sent one.
///
/// ```
/// use redguard::StoreFailure;
/// let failure = StoreFailure::new(std::io::Error::other("connection reset"));
/// assert_eq!(failure.to_string(), "connection reset");
/// assert_eq!(failure.code(), None);
/// ```
#[derive(Debug)]
pub struct StoreFailure {
    code: Option<String>,
    detail: Option<String>,
    /// The address a connection was tried at, which the client's own message leaves out.
    address: Option<String>,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl StoreFailure {
    /// A failure with `source` as its cause (for stores of your own).
    pub fn new(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        StoreFailure {
            code: None,
            detail: None,
            address: None,
            source: source.into(),
        }
    }

    /// An error reply or connection failure of the Redis client.
    pub(crate) fn redis(err: redis::RedisError) -> Self {
        let (code, detail) = match (err.code(), err.detail()) {
            (Some(code), Some(detail)) => {
                let (code, detail) = unwrap_script_error(code, detail);
                (Some(code.to_owned()), Some(detail.to_owned()))
            }
            (code, detail) => (code.map(str::to_owned), detail.map(str::to_owned)),
        };
        StoreFailure {
            code,
            detail,
            address: None,
            source: Box::new(err),
        }
    }

    /// The same failure for another caller of one shared call (the cause as its message).
    pub(crate) fn duplicate(&self) -> Self {
        StoreFailure {
            code: self.code.clone(),
            detail: self.detail.clone(),
            address: self.address.clone(),
            source: self.source.to_string().into(),
        }
    }

    /// The same failure, naming the address (`host:port`) a connection was tried at.
    pub(crate) fn at(mut self, address: String) -> Self {
        self.address = Some(address);
        self
    }

    /// The server's error code (`OOM`, `NOPERM`, `WRONGTYPE`, …), when it sent an error reply.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The server's message after the code, when it sent an error reply.
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }
}

/// Redis 6.2 reports an error a command raised inside a script as `ERR Error running script
/// (call to f_<sha>): @user_script:<line>: [@user_script: <line>: -]<CODE> <message>`, where
/// 7.0+ sends `<CODE> <message> script: …`: the inner code and message, so that `WRONGTYPE`,
/// `OOM` or `NOPERM` read the same on every server.
fn unwrap_script_error<'a>(code: &'a str, detail: &'a str) -> (&'a str, &'a str) {
    let Some(mut rest) = (code == "ERR")
        .then(|| detail.strip_prefix("Error running script (call to "))
        .flatten()
        .and_then(|rest| rest.split_once("): ").map(|(_, rest)| rest))
    else {
        return (code, detail);
    };
    while let Some(inner) = rest.strip_prefix("@user_script:") {
        rest = inner.split_once(": ").map_or("", |(_, inner)| inner);
    }
    match rest.trim_start_matches('-').split_once(' ') {
        Some((inner, message))
            if !inner.is_empty() && inner.bytes().all(|b| b.is_ascii_uppercase()) =>
        {
            (inner, message)
        }
        _ => (code, detail),
    }
}

impl std::fmt::Display for StoreFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(address) = &self.address {
            write!(f, "{address}: ")?;
        }
        std::fmt::Display::fmt(&self.source, f)
    }
}

impl std::error::Error for StoreFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

impl BackendError {
    /// True when the call gave up waiting rather than being refused.
    pub fn is_timeout(&self) -> bool {
        matches!(self, BackendError::Timeout { .. })
    }
}

/// Shorthand used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod script_error_tests {
    use super::unwrap_script_error;

    // Replies of Redis 6.2.14 to a script whose command failed.
    #[test]
    fn redis_6_2_script_errors_read_as_their_inner_code() {
        let wrongtype = "Error running script (call to f_d3c21d0c2b9ca22f82737626a27bcaf5d288f99f): \
            @user_script:1: WRONGTYPE Operation against a key holding the wrong kind of value";
        assert_eq!(
            unwrap_script_error("ERR", wrongtype),
            (
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value"
            )
        );
        let oom = "Error running script (call to f_bd6f3018b28bbdb36260f19d3c44afed740db987): \
            @user_script:1: @user_script: 1: -OOM command not allowed when used memory > 'maxmemory'.";
        assert_eq!(
            unwrap_script_error("ERR", oom),
            ("OOM", "command not allowed when used memory > 'maxmemory'.")
        );
        // Anything else is left as it came.
        let lua = "Error running script (call to f_0): @user_script:3: attempt to compare nil";
        assert_eq!(unwrap_script_error("ERR", lua), ("ERR", lua));
        assert_eq!(
            unwrap_script_error("ERR", "unknown command"),
            ("ERR", "unknown command")
        );
        assert_eq!(
            unwrap_script_error("WRONGTYPE", "Operation against a key"),
            ("WRONGTYPE", "Operation against a key")
        );
    }
}
