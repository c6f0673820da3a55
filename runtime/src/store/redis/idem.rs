//! Idempotency records on Redis: a hash per record, one script per transition.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::Value;

use super::RedisStore;
use super::lua::{Lua, lua};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::store::{
    Begin, Finish, IdemBegin, IdemFinish, IdemFinished, IdemOps, IdemStatus, LockWatch, Resolve,
    Resolved,
};

lua!(BEGIN = "idem_begin.lua");
lua!(FINISH = "idem_finish.lua");
lua!(RENEW = "idem_renew.lua");
lua!(ABANDON = "idem_abandon.lua");
lua!(RESOLVE = "idem_resolve.lua");

pub(super) fn scripts() -> Vec<&'static Lua> {
    vec![&BEGIN, &FINISH, &RENEW, &ABANDON, &RESOLVE]
}

fn status(value: Option<&Value>) -> Option<IdemStatus> {
    match value.and_then(bytes).as_deref() {
        Some(b"P") => Some(IdemStatus::Processing),
        Some(b"S") => Some(IdemStatus::Success),
        Some(b"F") => Some(IdemStatus::Fail),
        Some(b"U") => Some(IdemStatus::Unknown),
        _ => None,
    }
}

pub(super) fn unrecognised(key: &Key, status: Option<&Value>) -> Error {
    corrupt(
        key,
        format!(
            "not an idempotency record (status {:?})",
            status
                .and_then(bytes)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        ),
    )
}

pub(super) fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

pub(super) fn corrupt(key: &Key, detail: impl Into<String>) -> Error {
    Error::Corrupt {
        key: key.to_string(),
        detail: detail.into(),
    }
}

pub(super) fn bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes.clone()),
        Value::SimpleString(text) => Some(text.as_bytes().to_vec()),
        _ => None,
    }
}

#[async_trait]
impl IdemOps for RedisStore {
    async fn idem_begin(&self, begin: Begin<'_>) -> Result<IdemBegin> {
        let Begin {
            key,
            owner,
            fingerprint,
            ttl,
            replicas,
        } = begin;
        // Only a begin that took the record (0: started, 1: retrying) wrote it.
        let started = Instant::now();
        let reply: Result<Vec<Value>> = self
            .eval_confirmed(
                "idem_begin",
                &BEGIN,
                &[key],
                &[&owner, &fingerprint, &millis(ttl)],
                replicas,
                |reply: &Vec<Value>| matches!(reply.first(), Some(Value::Int(0 | 1))),
            )
            .await;
        let reply = self
            .undo_unconfirmed(reply, started, self.idem_abandon(key, owner))
            .await?;
        let code = match reply.first() {
            Some(Value::Int(code)) => *code,
            other => return Err(corrupt(key, format!("idem_begin replied {other:?}"))),
        };
        match (code, reply.get(1)) {
            (0, _) => Ok(IdemBegin::Started),
            (1, _) => Ok(IdemBegin::Retrying),
            (2, _) => Ok(IdemBegin::InProgress),
            (3, Some(result)) => bytes(result)
                .map(IdemBegin::Done)
                .ok_or_else(|| corrupt(key, "the stored result is not a string")),
            (4, _) => Ok(IdemBegin::KeyReuse),
            (5, status) => Err(unrecognised(key, status)),
            (6, _) => Ok(IdemBegin::Unknown),
            (other, _) => Err(corrupt(key, format!("idem_begin returned {other}"))),
        }
    }

    async fn idem_begin_batch(&self, begins: &[Begin<'_>]) -> Vec<Result<IdemBegin>> {
        self.begin_batch(begins).await
    }

    async fn idem_renew(&self, key: &Key, owner: &str, ttl: Duration) -> Result<bool> {
        let renewed: i64 = self
            .eval("idem_renew", &RENEW, &[key], &[&owner, &millis(ttl)])
            .await?;
        Ok(renewed == 1)
    }

    async fn idem_abandon(&self, key: &Key, owner: &str) -> Result<()> {
        let _: i64 = self
            .eval("idem_abandon", &ABANDON, &[key], &[&owner])
            .await?;
        Ok(())
    }

    async fn idem_finish(&self, finish: Finish<'_>) -> Result<IdemFinished> {
        let Finish {
            key,
            owner,
            outcome,
            ttl,
            replicas,
        } = finish;
        let (status, result): (&str, &[u8]) = match outcome {
            IdemFinish::Success(result) => ("S", result),
            IdemFinish::Fail => ("F", b""),
            IdemFinish::Unknown => ("U", b""),
        };
        let code: i64 = self
            .eval_confirmed(
                "idem_finish",
                &FINISH,
                &[key],
                &[&owner, &status, &result, &millis(ttl)],
                replicas,
                |code: &i64| *code == 1,
            )
            .await?;
        Ok(match code {
            1 => IdemFinished::Recorded,
            _ => IdemFinished::NotOwner,
        })
    }

    async fn idem_resolve(&self, resolve: Resolve<'_>) -> Result<Resolved> {
        let Resolve { key, result, force } = resolve;
        let (verdict, result) = match result {
            Some(result) => ("S", result),
            None => ("F", &b""[..]),
        };
        let force = if force { "1" } else { "0" };
        let reply: Vec<Value> = self
            .eval(
                "idem_resolve",
                &RESOLVE,
                &[key],
                &[&verdict, &result, &force],
            )
            .await?;
        let found = || status(reply.get(1)).ok_or_else(|| unrecognised(key, reply.get(1)));
        match reply.first() {
            Some(Value::Int(0)) => Ok(Resolved::Done(found()?)),
            Some(Value::Int(1)) => Ok(Resolved::Refused(found()?)),
            Some(Value::Int(2)) => Ok(Resolved::Missing),
            Some(Value::Int(3)) => Err(unrecognised(key, reply.get(1))),
            other => Err(corrupt(key, format!("idem_resolve replied {other:?}"))),
        }
    }

    async fn idem_watch(&self, key: &Key) -> LockWatch {
        // The lock releases' subscription: its pattern covers every key under the prefix, and
        // the idem scripts publish on the record's own name.
        self.bus.watch(key, None, self.timeout()).await
    }
}
