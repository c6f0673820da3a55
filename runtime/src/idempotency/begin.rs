//! The begin: one store op that records PROCESSING (or finds the intent in progress, done,
//! unknown or reused), then the token; and what undoes a begin whose outcome is unknown.

use serde::de::DeserializeOwned;

use super::execution::Execution;
use super::wait::Waiting;
use super::{Idempotency, record_outcome, replay};
use crate::degrade::Degrade;
use crate::error::{BackendError, Error, Result};
use crate::handle::Redguard;
use crate::key::{GuardKind, Key};
use crate::store::{Begin, IdemBegin};
use crate::tokens;
use crate::undo::{Compensate, Undo};
use crate::values::Replicas;

impl Idempotency {
    /// Checks the settings, renders the keys, and begins: records PROCESSING (or finds the
    /// intent in progress, done, or reused), then consumes the token. Whatever is left half
    /// done when this returns early or is dropped — a begin or a token whose outcome is
    /// unknown, a record begun for a token that was refused — is undone.
    pub(super) async fn begin<T, E>(self, handle: &Redguard) -> Result<Begun<T>, E>
    where
        T: DeserializeOwned,
        E: From<Error>,
    {
        redguard_grammar::idempotency::expire(self.expire).map_err(Error::Config)?;
        if let Some(timeout) = self.timeout {
            redguard_grammar::idempotency::timeout(timeout).map_err(Error::Config)?;
        }
        let replicas = self
            .replicas
            .map(|(count, timeout)| Replicas::new(count, timeout))
            .transpose()?;
        let twin;
        let handle = if replicas.is_some() {
            twin = handle.for_replicas().await;
            &twin
        } else {
            handle
        };
        let fingerprint = self.fingerprint?;
        let key = match self.key {
            Some(body) => Some(handle.key(GuardKind::Idempotency, &self.scope, &body?)?),
            None => None,
        };
        let token = match self.token {
            Some((scene, Ok(token))) => Some(tokens::Token::new(handle, scene, &token)?),
            // A token that is not even well-formed was never issued.
            Some((_, Err(Error::InvalidKey { .. } | Error::MissingKey { .. }))) => {
                return Err(Error::TokenUnknown.into());
            }
            Some((_, Err(other))) => return Err(other.into()),
            None => None,
        };
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let store = handle.store();
        let mut undo = Undo::armed(Abandon {
            handle: handle.clone(),
            owner: owner.clone(),
            record: None,
            token: None,
        });
        let mut record = None;
        // The record's expire counts from before the begin was sent, as a lock's lease does:
        // the only origin that is never later than Redis's.
        let mut sent = tokio::time::Instant::now();
        if let Some(key) = key {
            redguard_grammar::idempotency::wait(self.wait).map_err(Error::Config)?;
            // A duplicate that may wait subscribes before its first begin (see `wait.rs`).
            let mut waiting = match self.wait.is_zero() {
                true => None,
                false => Some(Waiting::start(handle, &key, self.wait).await),
            };
            loop {
                sent = tokio::time::Instant::now();
                // Armed before the call: a begin that fails or is dropped may still have run.
                undo.record(Some(key.clone()));
                let begin = store
                    .idem_begin(Begin {
                        key: &key,
                        owner: &owner,
                        fingerprint: &fingerprint,
                        ttl: self.expire,
                        replicas,
                    })
                    .await
                    .or_degrade(handle, GuardKind::Idempotency, "idem_begin", &key);
                let outcome = match &begin {
                    Ok(None) => "fail_open",
                    Ok(Some(IdemBegin::Started)) => "started",
                    Ok(Some(IdemBegin::Retrying)) => "retried",
                    Ok(Some(IdemBegin::InProgress)) => "in_progress",
                    Ok(Some(IdemBegin::Unknown)) => "unknown",
                    Ok(Some(IdemBegin::Done(_))) => "replayed",
                    Ok(Some(IdemBegin::KeyReuse)) => "key_reuse",
                    Err(_) => "fail_closed",
                };
                // A waiting duplicate counts its last begin only.
                let waits = waiting.is_some() && outcome == "in_progress";
                if !waits {
                    record_outcome(&self.scope, outcome);
                }
                tracing::debug!(guard = "idem", %key, outcome);
                match begin? {
                    // The store is down and the policy is fail-open: run without a record (the
                    // begin, which may still run, is undone).
                    None => break,
                    // Answered after its expire: the record may have lapsed and been begun by a
                    // twin meanwhile, so the body must not run on it (the begin is undone).
                    Some(IdemBegin::Started | IdemBegin::Retrying)
                        if sent.elapsed() >= self.expire =>
                    {
                        return Err(Error::Backend(BackendError::Timeout {
                            op: "idem_begin",
                            after: self.expire,
                        })
                        .into());
                    }
                    Some(IdemBegin::Started | IdemBegin::Retrying) => {
                        record = Some(key);
                        break;
                    }
                    Some(IdemBegin::InProgress) => {
                        undo.record(None);
                        if let Some(waiting) = &mut waiting
                            && waiting.next().await
                        {
                            continue;
                        }
                        if waits {
                            record_outcome(&self.scope, outcome);
                        }
                        return Err(Error::InProgress.into());
                    }
                    Some(IdemBegin::Unknown) => {
                        undo.record(None);
                        return Err(Error::OutcomeUnknown.into());
                    }
                    Some(IdemBegin::KeyReuse) => {
                        undo.record(None);
                        return Err(Error::KeyReuse.into());
                    }
                    Some(IdemBegin::Done(result)) => {
                        undo.record(None);
                        replay::mark();
                        return serde_json::from_slice(&result)
                            .map(Begun::Replayed)
                            .map_err(|err| {
                                Error::Corrupt {
                                    key: key.to_string(),
                                    detail: format!(
                                        "the stored result does not deserialize as {}: {err}",
                                        std::any::type_name::<T>()
                                    ),
                                }
                                .into()
                            });
                    }
                }
            }
        }
        // The token is consumed only when the body is about to run: a replay, a request in
        // progress or a refusal above leaves it for the retry.
        if let Some(token) = &token {
            undo.token(Some(token.clone()));
            let consumed = token.consume(handle, &owner).await;
            if let Err(refused @ (Error::TokenUsed | Error::TokenUnknown | Error::TokenMismatch)) =
                consumed
            {
                // Definite: nothing of the token changed; the record begun for it goes now,
                // so the same key can carry a valid token right after.
                undo.token(None);
                undo.now().await;
                return Err(refused.into());
            }
            consumed?;
        }
        undo.token(None);
        // The execution owns what was begun; a fail-open begin stays armed and is undone.
        if record.is_some() {
            undo.record(None);
        }
        Ok(Begun::Run(Execution {
            handle: handle.clone(),
            scope: self.scope,
            owner,
            record,
            token,
            sent,
            expire: self.expire,
            timeout: self.timeout,
            replicas,
        }))
    }
}

pub(super) enum Begun<T> {
    /// A SUCCESS record's result.
    Replayed(T),
    /// The body is to run.
    Run(Execution),
}

/// What a begin left unknown or half done: a record begun (or perhaps begun) by `owner`, a
/// token consumed (or perhaps consumed) by it. Undone when dropped armed (the call failed, or
/// its future was dropped), sent after the begin on the same connection, so the store applies
/// it after whatever the begin did.
#[derive(Debug, Clone)]
pub(super) struct Abandon {
    pub(super) handle: Redguard,
    pub(super) owner: String,
    pub(super) record: Option<Key>,
    pub(super) token: Option<tokens::Token>,
}

impl Compensate for Abandon {
    const ABANDONED: &'static str =
        "idempotent begin abandoned outside a Tokio runtime; its record expires";

    fn is_noop(&self) -> bool {
        self.record.is_none() && self.token.is_none()
    }

    async fn undo(self) {
        if let Some(token) = &self.token {
            token.restore(&self.handle, &self.owner).await;
        }
        if let Some(key) = &self.record
            && let Err(err) = self.handle.store().idem_abandon(key, &self.owner).await
        {
            tracing::warn!(guard = "idem", %key, error = %err, "could not undo a begin whose outcome is unknown; the record expires");
        }
    }
}

impl Undo<Abandon> {
    /// Sets (or clears) the record it undoes.
    fn record(&mut self, record: Option<Key>) {
        if let Some(abandon) = self.get_mut() {
            abandon.record = record;
        }
    }

    /// Sets (or clears) the token it gives back.
    fn token(&mut self, token: Option<tokens::Token>) {
        if let Some(abandon) = self.get_mut() {
            abandon.token = token;
        }
    }
}
