//! Idempotency tokens: the "fetch a token, then submit with it" flow.
//!
//! A page asks `GET /token` before showing a form; the submit carries the token, and the guard
//! consumes it atomically before the body runs. Consumed, already used, unknown and issued for
//! another scene are four distinct outcomes.

use std::time::Duration;

use crate::degrade::Degrade;
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, Key, KeyBuilder, check_name};
use crate::store::TokenOutcome;

/// Longest a token may live.
pub const MAX_TOKEN_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Scope under which token keys live.
const TOKEN_SCOPE: &str = "tokens";

/// Issues and consumes tokens on the installed handle (see [`Tokens`]).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
/// # use std::time::Duration;
/// # redguard::Redguard::memory().scope(async {
/// let token = redguard::tokens().issue("order-submit", Duration::from_secs(600)).await?;
/// redguard::tokens().consume("order-submit", &token).await?;
/// let again = redguard::tokens().consume("order-submit", &token).await;
/// assert!(matches!(again, Err(redguard::Error::TokenUsed)));
/// # Ok(()) }).await }
/// ```
pub fn tokens() -> Tokens {
    Tokens { handle: None }
}

/// Token operations on one handle, or on the current one when built by [`tokens()`].
#[derive(Debug, Clone)]
pub struct Tokens {
    handle: Option<Redguard>,
}

impl Tokens {
    pub(crate) fn new(handle: Redguard) -> Self {
        Tokens {
            handle: Some(handle),
        }
    }

    fn handle(&self) -> Result<Redguard> {
        match &self.handle {
            Some(handle) => Ok(handle.clone()),
            None => Redguard::current(),
        }
    }

    /// Issues a token for `scene` (`[A-Za-z0-9._@:-]`), valid for `ttl` (1 s to 7 days).
    /// The token is 122 random bits as 32 hex characters.
    pub async fn issue(&self, scene: &str, ttl: Duration) -> Result<String> {
        check_name("scene", scene, 64)?;
        if ttl < Duration::from_secs(1) || ttl > MAX_TOKEN_TTL {
            return Err(Error::Config(format!(
                "token ttl must be between 1 s and 7 days, got {ttl:?}"
            )));
        }
        let handle = self.handle()?;
        let token = uuid::Uuid::new_v4().simple().to_string();
        let key = token_key(&handle, &token)?;
        handle.store().token_issue(&key, scene, ttl).await?;
        Ok(token)
    }

    /// Consumes `token` for `scene`. `Ok` means this caller is the one that used it;
    /// [`Error::TokenUsed`], [`Error::TokenUnknown`] and [`Error::TokenMismatch`] tell the
    /// other outcomes apart. A malformed token is unknown.
    pub async fn consume(&self, scene: &str, token: &str) -> Result<()> {
        check_name("scene", scene, 64)?;
        let handle = self.handle()?;
        let key = match token_key(&handle, token) {
            Ok(key) => key,
            Err(Error::InvalidKey { .. } | Error::MissingKey { .. }) => {
                return Err(Error::TokenUnknown);
            }
            Err(other) => return Err(other),
        };
        let outcome = handle.store().token_consume(&key, scene).await;
        match outcome.or_degrade(&handle, GuardKind::Token, "token_consume", &key)? {
            None | Some(TokenOutcome::Consumed) => Ok(()),
            Some(TokenOutcome::AlreadyUsed) => Err(Error::TokenUsed),
            Some(TokenOutcome::Unknown) => Err(Error::TokenUnknown),
            Some(TokenOutcome::Mismatch) => Err(Error::TokenMismatch),
        }
    }
}

fn token_key(handle: &Redguard, token: &str) -> Result<Key> {
    let body = KeyBuilder::new().part("token", token).finish()?;
    handle.key(GuardKind::Token, TOKEN_SCOPE, &body)
}
