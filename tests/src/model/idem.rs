//! Idempotency records as the guide ("`#[idempotent]`") and the `IdemOps` contract describe
//! them: PROCESSING (owned by one execution, renewed while its body runs), SUCCESS with its
//! result, FAIL (the next begin takes it over, whatever its fingerprint), UNKNOWN (ended with
//! an unknown outcome: refused until resolved); a fingerprint that differs is key reuse;
//! every record lives `expire` after its last transition or renewal (an operator's verdict
//! keeps the record's expiry).

use std::collections::BTreeMap;

/// A record's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Processing,
    Success(Vec<u8>),
    Fail,
    Unknown,
}

impl Status {
    /// The name `IdemStatus::as_str` gives it.
    pub fn name(&self) -> &'static str {
        match self {
            Status::Processing => "processing",
            Status::Success(_) => "success",
            Status::Fail => "fail",
            Status::Unknown => "unknown",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub status: Status,
    pub owner: String,
    /// The fingerprint of the begin that took it (the first, or the one after a FAIL); empty
    /// for none.
    pub fingerprint: String,
    pub expires: u64,
}

/// What a begin found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    Started,
    Retrying,
    InProgress,
    Unknown,
    Done(Vec<u8>),
    KeyReuse,
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    Success(Vec<u8>),
    Fail,
    Unknown,
}

/// What an operator's verdict did (status names as `IdemStatus::as_str`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    Done(&'static str),
    Refused(&'static str),
    Missing,
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

    /// No record → PROCESSING for `owner`; FAIL → taken over, with this begin's fingerprint;
    /// otherwise fingerprints are compared when both sides have one, then PROCESSING → in
    /// progress, SUCCESS → its result, UNKNOWN → unknown.
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
        let reused = !fingerprint.is_empty()
            && !record.fingerprint.is_empty()
            && record.fingerprint != fingerprint;
        match &record.status {
            Status::Fail => {
                record.status = Status::Processing;
                owner.clone_into(&mut record.owner);
                fingerprint.clone_into(&mut record.fingerprint);
                record.expires = now + ttl;
                Begin::Retrying
            }
            _ if reused => Begin::KeyReuse,
            Status::Processing => Begin::InProgress,
            Status::Success(result) => Begin::Done(result.clone()),
            Status::Unknown => Begin::Unknown,
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
            Finish::Unknown => Status::Unknown,
        };
        record.expires = now + ttl;
        true
    }

    /// An operator's verdict: SUCCESS with `result`, or FAIL (`None`). An UNKNOWN or FAIL
    /// record takes it; a PROCESSING or SUCCESS one only when `force`. The expiry stays.
    pub fn resolve(
        &mut self,
        key: &str,
        result: Option<Vec<u8>>,
        force: bool,
        now: u64,
    ) -> Resolved {
        self.expire(now);
        let Some(record) = self.records.get_mut(key) else {
            return Resolved::Missing;
        };
        let was = record.status.name();
        if matches!(record.status, Status::Processing | Status::Success(_)) && !force {
            return Resolved::Refused(was);
        }
        record.status = result.map_or(Status::Fail, Status::Success);
        "resolved".clone_into(&mut record.owner);
        Resolved::Done(was)
    }
}
