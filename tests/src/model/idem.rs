//! Idempotency records as README ("`#[idempotent]`") and the `IdemOps` contract describe
//! them: PROCESSING (owned by one execution, renewed while its body runs), SUCCESS with its
//! result, FAIL (the next begin takes it over); a fingerprint that differs is key reuse;
//! every record lives `expire` after its last transition or renewal.

use std::collections::BTreeMap;

/// A record's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Processing,
    Success(Vec<u8>),
    Fail,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub status: Status,
    pub owner: String,
    /// The first begin's fingerprint; empty for none.
    pub fingerprint: String,
    pub expires: u64,
}

/// What a begin found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    Started,
    Retrying,
    InProgress,
    Done(Vec<u8>),
    KeyReuse,
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    Success(Vec<u8>),
    Fail,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdemModel {
    pub records: BTreeMap<String, Record>,
}

impl IdemModel {
    fn expire(&mut self, now: u64) {
        self.records.retain(|_, record| record.expires > now);
    }

    fn owned(&self, key: &str, owner: &str) -> bool {
        self.records
            .get(key)
            .is_some_and(|r| r.status == Status::Processing && r.owner == owner)
    }

    /// No record → PROCESSING for `owner`; PROCESSING → in progress; SUCCESS → its result;
    /// FAIL → taken over. Fingerprints are compared when both sides have one.
    pub fn begin(
        &mut self,
        key: &str,
        owner: &str,
        fingerprint: &str,
        ttl: u64,
        now: u64,
    ) -> Begin {
        self.expire(now);
        let Some(record) = self.records.get_mut(key) else {
            let record = Record {
                status: Status::Processing,
                owner: owner.to_owned(),
                fingerprint: fingerprint.to_owned(),
                expires: now + ttl,
            };
            self.records.insert(key.to_owned(), record);
            return Begin::Started;
        };
        if !fingerprint.is_empty()
            && !record.fingerprint.is_empty()
            && record.fingerprint != fingerprint
        {
            return Begin::KeyReuse;
        }
        match &record.status {
            Status::Processing => Begin::InProgress,
            Status::Success(result) => Begin::Done(result.clone()),
            Status::Fail => {
                record.status = Status::Processing;
                owner.clone_into(&mut record.owner);
                record.expires = now + ttl;
                Begin::Retrying
            }
        }
    }

    /// Keeps `owner`'s PROCESSING record alive for `ttl` from now.
    pub fn renew(&mut self, key: &str, owner: &str, ttl: u64, now: u64) -> bool {
        self.expire(now);
        let owned = self.owned(key, owner);
        if let Some(record) = self.records.get_mut(key).filter(|_| owned) {
            record.expires = now + ttl;
        }
        owned
    }

    /// Undoes `owner`'s begin: its PROCESSING record goes; anything else stays.
    pub fn abandon(&mut self, key: &str, owner: &str, now: u64) {
        self.expire(now);
        if self.owned(key, owner) {
            self.records.remove(key);
        }
    }

    /// Records `owner`'s outcome, for `ttl` more; false when the record is no longer its
    /// PROCESSING one.
    pub fn finish(&mut self, key: &str, owner: &str, outcome: Finish, ttl: u64, now: u64) -> bool {
        self.expire(now);
        if !self.owned(key, owner) {
            return false;
        }
        let record = self.records.get_mut(key).expect("owned");
        record.status = match outcome {
            Finish::Success(result) => Status::Success(result),
            Finish::Fail => Status::Fail,
        };
        record.expires = now + ttl;
        true
    }
}
