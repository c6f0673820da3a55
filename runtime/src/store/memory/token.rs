//! Token operations in memory.

use std::time::Duration;

use async_trait::async_trait;

use super::MemoryStore;
use crate::error::Result;
use crate::key::Key;
use crate::store::{TokenOps, TokenOutcome};
use crate::values::Replicas;

#[derive(Debug)]
pub(super) enum TokenState {
    Live { scene: String },
    Used { by: String },
}

#[async_trait]
impl TokenOps for MemoryStore {
    async fn token_issue(
        &self,
        key: &Key,
        scene: &str,
        ttl: Duration,
        // One process, no replicas: the write is as durable as it gets, so it counts as
        // confirmed (the memory store is for tests and single-process use).
        _replicas: Option<Replicas>,
    ) -> Result<()> {
        let (mut shard, now) = self.shard(key);
        let mut tokens = shard.tokens.at(now);
        let state = TokenState::Live {
            scene: scene.to_owned(),
        };
        tokens.put(key, state, now + ttl);
        Ok(())
    }

    async fn token_consume(&self, key: &Key, scene: &str, owner: &str) -> Result<TokenOutcome> {
        let (mut shard, now) = self.shard(key);
        let mut tokens = shard.tokens.at(now);
        let Some(token) = tokens.get_mut(key) else {
            return Ok(TokenOutcome::Unknown);
        };
        Ok(match token {
            TokenState::Used { .. } => TokenOutcome::AlreadyUsed,
            TokenState::Live { scene: issued } if issued != scene => TokenOutcome::Mismatch,
            TokenState::Live { .. } => {
                // The tombstone keeps the token's expiry, as the Redis script's KEEPTTL does.
                *token = TokenState::Used {
                    by: owner.to_owned(),
                };
                TokenOutcome::Consumed
            }
        })
    }

    async fn token_restore(&self, key: &Key, scene: &str, owner: &str) -> Result<bool> {
        let (mut shard, now) = self.shard(key);
        let mut tokens = shard.tokens.at(now);
        let Some(token) = tokens.get_mut(key) else {
            return Ok(false);
        };
        if !matches!(token, TokenState::Used { by } if by == owner) {
            return Ok(false);
        }
        *token = TokenState::Live {
            scene: scene.to_owned(),
        };
        Ok(true)
    }
}
