//! Token operations on Redis.

use std::time::Duration;

use async_trait::async_trait;

use super::lua::{Lua, lua};
use super::{RedisStore, bounded, corrupt_or};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::store::{TokenOps, TokenOutcome};

lua!(CONSUME = "token_consume.lua");
lua!(RESTORE = "token_restore.lua");

pub(super) fn scripts() -> Vec<&'static Lua> {
    vec![&CONSUME, &RESTORE]
}

#[async_trait]
impl TokenOps for RedisStore {
    async fn token_issue(&self, key: &Key, scene: &str, ttl: Duration) -> Result<()> {
        let mut conn = self.conn();
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let key_str = key.as_str();
        let created: Option<String> = bounded("token_issue", self.timeout(), async move {
            redis::cmd("SET")
                .arg(key_str)
                .arg(scene)
                .arg("PX")
                .arg(ttl_ms)
                .arg("NX")
                .query_async(&mut conn)
                .await
        })
        .await
        .map_err(|err| corrupt_or(err, key))?;
        created.map(drop).ok_or_else(|| Error::Corrupt {
            key: key.to_string(),
            detail: "a freshly generated token already exists".to_owned(),
        })
    }

    async fn token_consume(&self, key: &Key, scene: &str, owner: &str) -> Result<TokenOutcome> {
        let code: i64 = self
            .eval("token_consume", &CONSUME, &[key], &[&scene, &owner])
            .await?;
        match code {
            0 => Ok(TokenOutcome::Consumed),
            1 => Ok(TokenOutcome::AlreadyUsed),
            2 => Ok(TokenOutcome::Unknown),
            3 => Ok(TokenOutcome::Mismatch),
            other => Err(Error::Corrupt {
                key: key.to_string(),
                detail: format!("token script returned {other}"),
            }),
        }
    }

    async fn token_restore(&self, key: &Key, scene: &str, owner: &str) -> Result<bool> {
        let restored: i64 = self
            .eval("token_restore", &RESTORE, &[key], &[&scene, &owner])
            .await?;
        Ok(restored == 1)
    }
}
