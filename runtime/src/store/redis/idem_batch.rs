//! A batch of idempotency begins on Redis: one script per slot group, the groups at once.

use futures_util::future::join_all;
use redis::Value;

use super::idem::{bytes, corrupt, millis, unrecognised};
use super::lua::{Lua, lua};
use super::{RedisStore, evalsha};
use crate::error::{BackendError, Error, Result, StoreFailure};
use crate::key::Key;
use crate::store::{Begin, IdemBegin, IdemOps as _};

lua!(BEGIN_BATCH = "idem_begin_batch.lua");

pub(super) fn scripts() -> Vec<&'static Lua> {
    vec![&BEGIN_BATCH]
}

impl RedisStore {
    /// [`IdemOps::idem_begin_batch`](crate::store::IdemOps::idem_begin_batch): on a single
    /// node one script for every begin; on a Cluster one per hash tag (keys that share a tag
    /// share a slot), all sent before any reply is awaited, so the batch still takes one
    /// round trip per node. Begins that ask for replicas go one by one (`idem_begin` pairs
    /// each with its `WAIT`).
    pub(super) async fn begin_batch(&self, begins: &[Begin<'_>]) -> Vec<Result<IdemBegin>> {
        if begins.iter().any(|begin| begin.replicas.is_some()) {
            let mut begun = Vec::with_capacity(begins.len());
            for begin in begins {
                begun.push(self.idem_begin(*begin).await);
            }
            return begun;
        }
        let mut groups: Vec<Vec<usize>> = Vec::new();
        if self.is_cluster() {
            for (i, begin) in begins.iter().enumerate() {
                let tag = begin.key.hash_tag();
                match groups
                    .iter_mut()
                    .find(|group| begins[group[0]].key.hash_tag() == tag)
                {
                    Some(group) => group.push(i),
                    None => groups.push(vec![i]),
                }
            }
        } else if !begins.is_empty() {
            groups.push((0..begins.len()).collect());
        }
        let replies = join_all(groups.iter().map(|group| self.begin_slot(begins, group))).await;
        let mut begun: Vec<Option<Result<IdemBegin>>> = begins.iter().map(|_| None).collect();
        for (group, reply) in groups.iter().zip(replies) {
            match reply {
                Ok(results) => {
                    for (&i, result) in group.iter().zip(results) {
                        begun[i] = Some(result);
                    }
                }
                Err(err) => {
                    // The script may have run: each begin of the group is in doubt.
                    for &i in group {
                        begun[i] = Some(Err(copy(&err)));
                    }
                }
            }
        }
        begun
            .into_iter()
            .zip(begins)
            .map(|(result, begin)| {
                result.unwrap_or_else(|| Err(corrupt(begin.key, "no reply for this begin")))
            })
            .collect()
    }

    /// The begins at `indices` (one slot) in one script.
    async fn begin_slot(
        &self,
        begins: &[Begin<'_>],
        indices: &[usize],
    ) -> Result<Vec<Result<IdemBegin>>> {
        let first = begins[indices[0]];
        let mut cmd = evalsha(&BEGIN_BATCH, indices.len(), 1 + 2 * indices.len());
        for &i in indices {
            cmd.arg(begins[i].key.as_str());
        }
        // One expire for the batch: the batch API gives every message the same.
        cmd.arg(millis(first.ttl));
        for &i in indices {
            cmd.arg(begins[i].owner).arg(begins[i].fingerprint);
        }
        let reply: Vec<Value> = self
            .run_script("idem_begin_batch", &BEGIN_BATCH, cmd, Some(first.key))
            .await?;
        if reply.len() != 2 * indices.len() {
            return Err(corrupt(
                first.key,
                format!(
                    "idem_begin_batch replied {} values for {} keys",
                    reply.len(),
                    indices.len()
                ),
            ));
        }
        Ok(indices
            .iter()
            .zip(reply.chunks(2))
            .map(|(&i, pair)| decode(begins[i].key, &pair[0], &pair[1]))
            .collect())
    }
}

/// One begin's `{code, value}`, as `idem_begin` reads its reply.
fn decode(key: &Key, code: &Value, value: &Value) -> Result<IdemBegin> {
    match code {
        Value::Int(0) => Ok(IdemBegin::Started),
        Value::Int(1) => Ok(IdemBegin::Retrying),
        Value::Int(2) => Ok(IdemBegin::InProgress),
        Value::Int(3) => bytes(value)
            .map(IdemBegin::Done)
            .ok_or_else(|| corrupt(key, "the stored result is not a string")),
        Value::Int(4) => Ok(IdemBegin::KeyReuse),
        Value::Int(5) => Err(unrecognised(key, Some(value))),
        Value::Int(6) => Ok(IdemBegin::Unknown),
        other => Err(corrupt(key, format!("idem_begin_batch replied {other:?}"))),
    }
}

/// The group's error for each of its begins (`Error` is not `Clone`).
fn copy(err: &Error) -> Error {
    match err {
        Error::Backend(BackendError::Timeout { op, after }) => {
            BackendError::Timeout { op, after: *after }.into()
        }
        Error::Backend(BackendError::Failed { op, source }) => BackendError::Failed {
            op,
            source: source.duplicate(),
        }
        .into(),
        Error::Corrupt { key, detail } => Error::Corrupt {
            key: key.clone(),
            detail: detail.clone(),
        },
        other => BackendError::Failed {
            op: "idem_begin_batch",
            source: StoreFailure::new(other.to_string()),
        }
        .into(),
    }
}
