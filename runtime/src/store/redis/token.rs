//! Token operations on Redis.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::lua::{Lua, lua};
use super::{RedisStore, bounded, confirmed_by, corrupt_or, wait_behind};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::store::{TokenOps, TokenOutcome};
use crate::values::Replicas;

lua!(CONSUME = "token_consume.lua");
lua!(RESTORE = "token_restore.lua");

pub(super) fn scripts() -> Vec<&'static Lua> {
    vec![&CONSUME, &RESTORE]
}

#[async_trait]
impl TokenOps for RedisStore {
    async fn token_issue(
        &self,
        key: &Key,
        scene: &str,
        ttl: Duration,
        replicas: Option<Replicas>,
    ) -> Result<()> {
        let mut conn = self.conn();
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut set = redis::cmd("SET");
        set.arg(key.as_str())
            .arg(scene)
            .arg("PX")
            .arg(ttl_ms)
            .arg("NX");
        let created: Option<String> = match replicas {
            None => {
                self.bounded(
                    "token_issue",
                    async move { set.query_async(&mut conn).await },
                )
                .await
            }
            Some(replicas) => {
                self.check_replicas(replicas)?;
                let started = Instant::now();
                let mut undo_conn = conn.clone();
                // `WAIT` in the same pipeline: same connection, same node (see
                // `RedisStore::eval_confirmed`).
                let mut pipe = redis::pipe();
                pipe.add_command(set);
                wait_behind(&mut pipe, replicas);
                // Not through the breaker: a `WAIT` holds its connection by design.
                let (created, confirmed): (Option<String>, u32) =
                    bounded("token_issue", self.timeout(), async move {
                        pipe.query_async(&mut conn).await
                    })
                    .await
                    .map_err(|err| corrupt_or(err, key))?;
                let confirmed = match created {
                    Some(_) => confirmed_by("token_issue", replicas, confirmed),
                    None => Ok(()),
                };
                // A token too few replicas have is handed to nobody: deleted before the
                // refusal returns, on the connection that stored it.
                let delete = async {
                    let mut del = redis::cmd("DEL");
                    del.arg(key.as_str());
                    bounded("token_discard", self.timeout(), async move {
                        del.query_async::<i64>(&mut undo_conn).await
                    })
                    .await
                    .map(drop)
                };
                self.undo_unconfirmed(confirmed, started, delete).await?;
                Ok(created)
            }
        }
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
