//! Idempotency records in memory.

use std::time::Duration;

use async_trait::async_trait;

use super::MemoryStore;
use crate::error::Result;
use crate::key::Key;
use crate::store::admin::Raw;
use crate::store::{
    Begin, Finish, IdemBegin, IdemFinish, IdemFinished, IdemOps, IdemStatus, LockWatch, Resolve,
    Resolved,
};

#[derive(Debug)]
pub(super) struct Record {
    status: Status,
    owner: String,
    fingerprint: String,
    /// When the current execution began (the store's clock).
    started: Duration,
}

impl Record {
    /// The record as the Redis scripts store it (see `store::admin`).
    pub(super) fn raw(&self) -> Raw {
        let (status, result_len) = match &self.status {
            Status::Processing => ("P", None),
            Status::Success(result) => ("S", Some(result.len() as u64)),
            Status::Fail => ("F", None),
            Status::Unknown => ("U", None),
        };
        let fields = vec![
            ("status".to_owned(), status.to_owned()),
            ("owner".to_owned(), self.owner.clone()),
            ("fp".to_owned(), self.fingerprint.clone()),
            ("started".to_owned(), self.started.as_millis().to_string()),
        ];
        Raw::Hash { fields, result_len }
    }
}

#[derive(Debug)]
enum Status {
    Processing,
    Success(Vec<u8>),
    Fail,
    Unknown,
}

impl Status {
    fn name(&self) -> IdemStatus {
        match self {
            Status::Processing => IdemStatus::Processing,
            Status::Success(_) => IdemStatus::Success,
            Status::Fail => IdemStatus::Fail,
            Status::Unknown => IdemStatus::Unknown,
        }
    }
}

#[async_trait]
impl IdemOps for MemoryStore {
    async fn idem_begin(&self, begin: Begin<'_>) -> Result<IdemBegin> {
        let Begin {
            key,
            owner,
            fingerprint,
            ttl,
            // No replicas: a record here is as durable as it gets, so it counts as confirmed.
            replicas: _,
        } = begin;
        let (mut shard, now) = self.shard(key);
        let mut records = shard.idem.at(now);
        let Some(record) = records.get_mut(key) else {
            let record = Record {
                status: Status::Processing,
                owner: owner.to_owned(),
                fingerprint: fingerprint.to_owned(),
                started: now,
            };
            records.put(key, record, now + ttl);
            return Ok(IdemBegin::Started);
        };
        let reused = !fingerprint.is_empty()
            && !record.fingerprint.is_empty()
            && record.fingerprint != fingerprint;
        Ok(match &record.status {
            // A failure releases the key for any payload: the retry's is the one that runs.
            Status::Fail => {
                record.status = Status::Processing;
                owner.clone_into(&mut record.owner);
                fingerprint.clone_into(&mut record.fingerprint);
                record.started = now;
                records.set_expiry(key, now + ttl);
                IdemBegin::Retrying
            }
            _ if reused => IdemBegin::KeyReuse,
            Status::Processing => IdemBegin::InProgress,
            Status::Success(result) => IdemBegin::Done(result.clone()),
            Status::Unknown => IdemBegin::Unknown,
        })
    }

    async fn idem_renew(&self, key: &Key, owner: &str, ttl: Duration) -> Result<bool> {
        let (mut shard, now) = self.shard(key);
        let mut records = shard.idem.at(now);
        let owned = records.get(key).is_some_and(|record| {
            matches!(record.status, Status::Processing) && record.owner == owner
        });
        if owned {
            records.set_expiry(key, now + ttl);
        }
        Ok(owned)
    }

    async fn idem_abandon(&self, key: &Key, owner: &str) -> Result<()> {
        let (mut shard, now) = self.shard(key);
        let mut records = shard.idem.at(now);
        let owned = records.get(key).is_some_and(|record| {
            matches!(record.status, Status::Processing) && record.owner == owner
        });
        if owned {
            records.remove(key);
            drop(shard);
            self.tables.lock_waiters.notify(key.as_str());
        }
        Ok(())
    }

    async fn idem_finish(&self, finish: Finish<'_>) -> Result<IdemFinished> {
        let Finish {
            key,
            owner,
            outcome,
            ttl,
            replicas: _,
        } = finish;
        let (mut shard, now) = self.shard(key);
        let mut records = shard.idem.at(now);
        let Some(record) = records.get_mut(key) else {
            return Ok(IdemFinished::NotOwner);
        };
        if !matches!(record.status, Status::Processing) || record.owner != owner {
            return Ok(IdemFinished::NotOwner);
        }
        record.status = match outcome {
            IdemFinish::Success(result) => Status::Success(result.to_vec()),
            IdemFinish::Fail => Status::Fail,
            IdemFinish::Unknown => Status::Unknown,
        };
        records.set_expiry(key, now + ttl);
        drop(shard);
        // Waiting duplicates (see `idem_watch`) take their replay or their retry now.
        self.tables.lock_waiters.notify(key.as_str());
        Ok(IdemFinished::Recorded)
    }

    async fn idem_resolve(&self, resolve: Resolve<'_>) -> Result<Resolved> {
        let Resolve { key, result, force } = resolve;
        let (mut shard, now) = self.shard(key);
        let mut records = shard.idem.at(now);
        let Some(record) = records.get_mut(key) else {
            return Ok(Resolved::Missing);
        };
        let was = record.status.name();
        if matches!(was, IdemStatus::Processing | IdemStatus::Success) && !force {
            return Ok(Resolved::Refused(was));
        }
        // The expiry stays as it is: every record keeps its TTL.
        record.status = match result {
            Some(result) => Status::Success(result.to_vec()),
            None => Status::Fail,
        };
        "resolved".clone_into(&mut record.owner);
        drop(shard);
        self.tables.lock_waiters.notify(key.as_str());
        Ok(Resolved::Done(was))
    }

    async fn idem_watch(&self, key: &Key) -> LockWatch {
        // The same in-process fan-out as lock releases: an end here is seen at once.
        self.tables.lock_waiters.watch(key.as_str(), true)
    }
}
