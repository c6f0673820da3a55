//! Store operations of idempotency tokens.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::key::Key;
use crate::values::Replicas;

/// Token operations of a [`Store`](super::Store).
#[async_trait]
pub trait TokenOps {
    /// Stores a fresh token for `scene`, living `ttl`. With `replicas`, a token stored but not
    /// confirmed in time is [`BackendError::Unconfirmed`](crate::BackendError::Unconfirmed)
    /// (nobody knows it: deleted before this returns, or it expires unused); a store without
    /// replicas treats it as confirmed.
    async fn token_issue(
        &self,
        key: &Key,
        scene: &str,
        ttl: Duration,
        replicas: Option<Replicas>,
    ) -> Result<()>;

    /// Consumes a token atomically for the execution `owner`. A consumed token leaves a
    /// tombstone naming `owner` until its TTL ends, so a second use is told apart from a
    /// token that never existed.
    async fn token_consume(&self, key: &Key, scene: &str, owner: &str) -> Result<TokenOutcome>;

    /// Gives a token `owner` consumed back to `scene` (its body failed, and the retry its error
    /// invites may use it), keeping its expiry; false when `owner` had not consumed it.
    async fn token_restore(&self, key: &Key, scene: &str, owner: &str) -> Result<bool>;
}

/// What [`TokenOps::token_consume`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenOutcome {
    /// The token was live for this scene and is now used up.
    Consumed,
    /// The token was consumed before.
    AlreadyUsed,
    /// No such token: never issued, forged, or expired.
    Unknown,
    /// The token is live but belongs to another scene; it was left untouched.
    Mismatch,
}
