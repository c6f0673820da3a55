//! Idempotency tokens: the "fetch a token, then submit with it" flow.
//!
//! A page asks `GET /token` before showing a form; the submit carries the token, and the guard
//! consumes it atomically when the body is about to run (not for a replay, a request in
//! progress or a refusal), giving it back when the body fails cleanly. Consumed, already used,
//! unknown and issued for another scene are four distinct outcomes.

use std::time::Duration;

use crate::degrade::Degrade;
use crate::error::{Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, Key, KeyBody, KeyBuilder, check_name};
use crate::store::TokenOutcome;
use crate::undo::{Compensate, Undo};
use crate::values::Replicas;

pub use redguard_grammar::tokens::MAX_TOKEN_TTL;

/// Scope under which token keys live.
const TOKEN_SCOPE: &str = "tokens";

impl Redguard {
    /// Idempotency tokens on this handle (see [`Tokens`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// let rg = redguard::Redguard::memory();
    /// let token = rg.tokens().issue("signup", std::time::Duration::from_secs(60)).await?;
    /// rg.tokens().consume("signup", &token).await?;
    /// # Ok(()) }
    /// ```
    pub fn tokens(&self) -> Tokens {
        Tokens {
            handle: Some(self.clone()),
            replicas: None,
        }
    }
}

/// Token operations on one handle, or on the current one when built by [`tokens()`](crate::tokens()).
#[derive(Debug, Clone)]
pub struct Tokens {
    handle: Option<Redguard>,
    /// `(count, timeout)` as given, checked at the issue.
    replicas: Option<(u32, Duration)>,
}

impl Tokens {
    /// See [`redguard::tokens`](crate::tokens()).
    pub(crate) fn current() -> Tokens {
        Tokens {
            handle: None,
            replicas: None,
        }
    }

    fn handle(&self) -> Result<Redguard> {
        let handle = match &self.handle {
            Some(handle) => handle.clone(),
            None => Redguard::current()?,
        };
        crate::handle::need_runtime_for(&handle)?;
        Ok(handle)
    }

    /// Hands out an issued token only once `count` replicas have it, waiting up to `timeout`
    /// (Redis `WAIT`, on the connection and node that stored it; see
    /// [`Replicas`]). Without it a master that fails right after the issue
    /// can be replaced by a replica without the token, and its submit is refused as unknown.
    /// When too few confirm, [`issue`](Tokens::issue) returns [`Error::Backend`] with
    /// [`BackendError::Unconfirmed`](crate::BackendError::Unconfirmed) (the stored token was
    /// given to nobody and is deleted again). Consuming is not confirmed. `count` is 1 to 16;
    /// `timeout` 1 ms to 10 s and at most half the handle's
    /// [`timeout`](crate::handle::Builder::timeout). The memory store counts every issue as
    /// confirmed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> redguard::Result<()> {
    /// use std::time::Duration;
    /// let rg = redguard::Redguard::memory();
    /// let tokens = rg.tokens().replicas(1, Duration::from_millis(50));
    /// let token = tokens.issue("signup", Duration::from_secs(60)).await?;
    /// tokens.consume("signup", &token).await?;
    /// # Ok(()) }
    /// ```
    pub fn replicas(mut self, count: u32, timeout: Duration) -> Self {
        self.replicas = Some((count, timeout));
        self
    }

    /// Issues a token for `scene` (`[A-Za-z0-9._@:-]`), valid for `ttl` (1 s to 7 days).
    /// The token is 122 random bits as 32 hex characters.
    pub async fn issue(&self, scene: &str, ttl: Duration) -> Result<String> {
        check_name("scene", scene, 64)?;
        redguard_grammar::tokens::ttl(ttl).map_err(Error::Config)?;
        let replicas = self
            .replicas
            .map(|(count, timeout)| Replicas::new(count, timeout))
            .transpose()?;
        let mut handle = self.handle()?;
        if replicas.is_some() {
            handle = handle.for_replicas().await;
        }
        let token = uuid::Uuid::new_v4().simple().to_string();
        let key = token_key(&handle, &token)?;
        handle
            .store()
            .token_issue(&key, scene, ttl, replicas)
            .await?;
        Ok(token)
    }

    /// Consumes `token` for `scene`. `Ok` means this caller is the one that used it;
    /// [`Error::TokenUsed`], [`Error::TokenUnknown`] and [`Error::TokenMismatch`] tell the
    /// other outcomes apart. A malformed token is unknown. When the store cannot answer, the
    /// idempotency [`FailMode`](crate::handle::FailMode) applies (closed by default:
    /// [`Error::Backend`]).
    pub async fn consume(&self, scene: &str, token: &str) -> Result<()> {
        let handle = self.handle()?;
        let body = match KeyBuilder::new().part("token", token).finish() {
            Ok(body) => body,
            Err(Error::InvalidKey { .. } | Error::MissingKey { .. }) => {
                return Err(Error::TokenUnknown);
            }
            Err(other) => return Err(other),
        };
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let token = Token::new(&handle, scene.to_owned(), &body)?;
        // A consume that fails or is dropped may still have run: give the token back after
        // it, as the caller was told it did not get it.
        let mut undo = Undo::armed(Unconsume {
            handle: handle.clone(),
            token: token.clone(),
            owner: owner.clone(),
        });
        let consumed = token.consume(&handle, &owner).await;
        if !matches!(consumed, Err(Error::Backend(_))) {
            undo.disarm();
        }
        consumed
    }
}

/// A consume whose outcome is unknown, given back unless disarmed; see [`Tokens::consume`].
struct Unconsume {
    handle: Redguard,
    token: Token,
    owner: String,
}

impl Compensate for Unconsume {
    const ABANDONED: &'static str =
        "token consume abandoned outside a Tokio runtime; the token may stay used";

    async fn undo(self) {
        self.token.restore(&self.handle, &self.owner).await
    }
}

/// One token of one scene, as an idempotent execution consumes it and gives it back.
#[derive(Debug, Clone)]
pub(crate) struct Token {
    key: Key,
    scene: String,
}

impl Token {
    pub(crate) fn new(handle: &Redguard, scene: String, token: &KeyBody) -> Result<Token> {
        check_name("scene", &scene, 64)?;
        let key = handle.key(GuardKind::Token, TOKEN_SCOPE, token)?;
        Ok(Token { key, scene })
    }

    /// Consumes the token for the execution `owner`.
    pub(crate) async fn consume(&self, handle: &Redguard, owner: &str) -> Result<()> {
        let outcome = handle
            .store()
            .token_consume(&self.key, &self.scene, owner)
            .await;
        match outcome.or_degrade(handle, GuardKind::Token, "token_consume", &self.key)? {
            None | Some(TokenOutcome::Consumed) => Ok(()),
            Some(TokenOutcome::AlreadyUsed) => Err(Error::TokenUsed),
            Some(TokenOutcome::Unknown) => Err(Error::TokenUnknown),
            Some(TokenOutcome::Mismatch) => Err(Error::TokenMismatch),
        }
    }

    /// Gives the token back if `owner` consumed it; a failure only means the token stays
    /// used (logged).
    pub(crate) async fn restore(&self, handle: &Redguard, owner: &str) {
        let restored = handle
            .store()
            .token_restore(&self.key, &self.scene, owner)
            .await;
        if let Err(err) = restored {
            tracing::warn!(guard = "token", key = %self.key, error = %err, "could not give the token back; it stays used");
        }
    }
}

fn token_key(handle: &Redguard, token: &str) -> Result<Key> {
    let body = KeyBuilder::new().part("token", token).finish()?;
    handle.key(GuardKind::Token, TOKEN_SCOPE, &body)
}
