//! Operator operations on Redis: reads and repairs are scripts (one atomic step, Redis's
//! clock), listing is `SCAN` on every master.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use redis::Value;
#[cfg(feature = "cluster")]
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

#[cfg(feature = "cluster")]
use super::Conn;
use super::lua::{Lua, lua};
use super::{RedisStore, evalsha};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::store::admin::{
    AdminOps, ForceUnlock, Raw, RawEntry, SNAPSHOT_MEMBERS, ScanKeys, Snapshot, Unlocked,
};
use crate::store::lock::FENCE_TTL;

lua!(READ = "admin_read.lua" after "expiry.lua");
lua!(UNLOCK = "admin_unlock.lua" after "fence.lua");
lua!(REFUND = "admin_refund.lua" after "expiry.lua");
lua!(FORGET = "admin_forget.lua");
lua!(PREFIX = "admin_quota_prefix.lua");

pub(super) fn scripts() -> Vec<&'static Lua> {
    vec![&READ, &UNLOCK, &REFUND, &FORGET, &PREFIX]
}

/// Keys asked for per `SCAN` call.
const SCAN_COUNT: usize = 1000;

#[async_trait]
impl AdminOps for RedisStore {
    async fn admin_read(&self, keys: &[Key]) -> Result<Snapshot> {
        let mut cmd = evalsha(&READ, keys.len(), 1);
        for key in keys {
            cmd.arg(key.as_str());
        }
        cmd.arg(SNAPSHOT_MEMBERS);
        let reply: Value = self
            .run_script("admin_read", &READ, cmd, keys.first())
            .await?;
        parse_snapshot(keys, reply).ok_or_else(|| Error::Corrupt {
            key: keys.first().map(Key::to_string).unwrap_or_default(),
            detail: "admin_read returned an unexpected reply".to_owned(),
        })
    }

    async fn admin_scan(&self, prefix: &str, limit: usize) -> Result<ScanKeys> {
        let pattern = format!("{}*", escape_glob(prefix));
        #[cfg(feature = "cluster")]
        let nodes: Vec<Option<(String, u16)>> = match &self.conn {
            Conn::Cluster(_) => self.masters().await?.into_iter().map(Some).collect(),
            Conn::Single(_) => vec![None],
            #[cfg(feature = "sentinel")]
            Conn::Sentinel(_) => vec![None],
        };
        #[cfg(not(feature = "cluster"))]
        let nodes = vec![None::<(String, u16)>];
        let mut found = BTreeSet::new();
        // Each SCAN call is bounded by the timeout; their number by the limit: a keyspace
        // where few keys match cannot keep the loop going forever.
        let mut calls_left = limit.div_ceil(SCAN_COUNT).max(1) * 64;
        let mut truncated = false;
        'nodes: for node in nodes {
            let mut cursor = 0u64;
            loop {
                if found.len() >= limit || calls_left == 0 {
                    truncated = true;
                    break 'nodes;
                }
                calls_left -= 1;
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let (next, keys): (u64, Vec<String>) = self.on_node(node.as_ref(), cmd).await?;
                found.extend(keys);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        truncated |= found.len() > limit;
        let mut keys: Vec<String> = found.into_iter().collect();
        keys.truncate(limit);
        Ok(ScanKeys { keys, truncated })
    }

    async fn admin_unlock(&self, unlock: ForceUnlock<'_>) -> Result<Unlocked> {
        let mut keys = vec![unlock.lock, unlock.fence];
        keys.extend(unlock.readers);
        let mut cmd = evalsha(&UNLOCK, keys.len(), 2 + unlock.owners.len());
        for key in &keys {
            cmd.arg(key.as_str());
        }
        cmd.arg(if unlock.semaphore { "z" } else { "h" })
            .arg(FENCE_TTL.as_millis().to_string());
        for owner in unlock.owners {
            cmd.arg(*owner);
        }
        let (removed, fence): (i64, u64) = self
            .run_script("admin_unlock", &UNLOCK, cmd, Some(unlock.lock))
            .await?;
        match removed {
            -1 => Err(Error::Corrupt {
                key: unlock.fence.to_string(),
                detail: "the fencing counter is not a number".to_owned(),
            }),
            0 => Ok(Unlocked {
                removed: 0,
                fence: None,
            }),
            n => Ok(Unlocked {
                removed: n.unsigned_abs(),
                fence: Some(fence),
            }),
        }
    }

    async fn admin_delete(&self, keys: &[Key]) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let mut cmd = redis::cmd("DEL");
        for key in keys {
            cmd.arg(key.as_str());
        }
        let mut conn = self.conn();
        self.bounded(
            "admin_delete",
            async move { cmd.query_async(&mut conn).await },
        )
        .await
    }

    async fn admin_announce_reset(&self, key: &Key) -> Result<()> {
        let mut conn = self.conn();
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(key.as_str()).arg(super::lock::RESET);
        self.bounded("admin_announce_reset", async move {
            cmd.query_async::<i64>(&mut conn).await
        })
        .await?;
        Ok(())
    }

    async fn admin_quota_set(&self, key: &Key, value: &str, ttl: Option<Duration>) -> Result<()> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key.as_str()).arg(value);
        if let Some(ttl) = ttl {
            cmd.arg("PX")
                .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        }
        let mut conn = self.conn();
        self.bounded("admin_quota_set", async move {
            cmd.query_async::<()>(&mut conn).await
        })
        .await
    }

    async fn admin_refund(&self, key: &Key, units: u64) -> Result<u64> {
        self.eval("admin_refund", &REFUND, &[key], &[&units]).await
    }

    async fn admin_quota_prefix(
        &self,
        hash: &Key,
        field: &str,
        value: Option<&str>,
        ttl: Option<Duration>,
        max: usize,
    ) -> Result<bool> {
        let ttl_ms = ttl.map_or(0, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
        let had: i64 = match value {
            Some(value) => {
                self.eval(
                    "admin_quota_prefix",
                    &PREFIX,
                    &[hash],
                    &[&"set", &field, &value, &ttl_ms, &max],
                )
                .await?
            }
            None => {
                self.eval("admin_quota_prefix", &PREFIX, &[hash], &[&"del", &field])
                    .await?
            }
        };
        if had < 0 {
            return Err(crate::store::admin::prefixes_full(max));
        }
        Ok(had == 1)
    }

    async fn admin_quota_prefixes(&self, hash: &Key) -> Result<(Duration, Vec<(String, String)>)> {
        let reply: Vec<String> = self
            .eval("admin_quota_prefix", &PREFIX, &[hash], &[&"list"])
            .await?;
        let corrupt = || Error::Corrupt {
            key: hash.to_string(),
            detail: "the prefix-override listing is malformed".to_owned(),
        };
        let (now, fields) = reply.split_first().ok_or_else(corrupt)?;
        let now = Duration::from_millis(now.parse().map_err(|_| corrupt())?);
        let fields = fields
            .chunks_exact(2)
            .map(|p| (p[0].clone(), p[1].clone()))
            .collect();
        Ok((now, fields))
    }

    async fn admin_forget(&self, key: &Key, fields: &[(String, String)]) -> Result<bool> {
        let mut cmd = evalsha(&FORGET, 1, 2 * fields.len());
        cmd.arg(key.as_str());
        for (field, value) in fields {
            cmd.arg(field).arg(value);
        }
        let deleted: i64 = self
            .run_script("admin_forget", &FORGET, cmd, Some(key))
            .await?;
        Ok(deleted == 1)
    }
}

impl RedisStore {
    /// The Cluster's masters that are up, as `(host, port)`.
    #[cfg(feature = "cluster")]
    async fn masters(&self) -> Result<Vec<(String, u16)>> {
        let nodes: String = self
            .on_node(None, redis::cmd("CLUSTER").arg("NODES").clone())
            .await?;
        let masters: Vec<(String, u16)> = nodes
            .lines()
            .filter_map(|line| {
                let mut fields = line.split(' ');
                let address = fields.nth(1)?;
                let flags = fields.next()?;
                let up = flags.split(',').any(|f| f == "master")
                    && !flags.split(',').any(|f| f == "fail" || f == "noaddr");
                // host:port@cport[,hostname]
                let (host, port) = address.split('@').next()?.rsplit_once(':')?;
                up.then(|| Some((host.to_owned(), port.parse().ok()?)))
                    .flatten()
            })
            .collect();
        if masters.is_empty() {
            return Err(Error::Config(
                "CLUSTER NODES listed no master that is up".to_owned(),
            ));
        }
        Ok(masters)
    }

    /// Runs `cmd` on the single node, or on the Cluster node at `node` (any node: `None`).
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    async fn on_node<T: redis::FromRedisValue>(
        &self,
        node: Option<&(String, u16)>,
        cmd: redis::Cmd,
    ) -> Result<T> {
        let mut conn = self.conn();
        let value = self
            .bounded("admin_scan", async move {
                match &mut conn {
                    #[cfg(feature = "cluster")]
                    Conn::Cluster(cluster) => {
                        let routing = match node {
                            Some((host, port)) => SingleNodeRoutingInfo::ByAddress {
                                host: host.clone(),
                                port: *port,
                            },
                            None => SingleNodeRoutingInfo::Random,
                        };
                        cluster
                            .route_command(cmd, RoutingInfo::SingleNode(routing))
                            .await
                    }
                    single => cmd.query_async::<Value>(single).await,
                }
            })
            .await?;
        redis::from_redis_value(value)
            .map_err(|err| Error::Config(format!("unexpected reply to an admin command: {err}")))
    }
}

/// `prefix` as a `SCAN MATCH` pattern matching itself literally.
fn escape_glob(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 4);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

/// The reply of `admin_read.lua` (see there) as a [`Snapshot`]; `None` when it has another
/// shape.
fn parse_snapshot(keys: &[Key], reply: Value) -> Option<Snapshot> {
    let Value::Array(items) = reply else {
        return None;
    };
    let secs = u64::try_from(int(items.first()?)?).ok()?;
    let micros = u64::try_from(int(items.get(1)?)?).ok()?;
    let mut entries = Vec::with_capacity(keys.len());
    for (key, item) in keys.iter().zip(items.get(2..)?) {
        let Value::Array(parts) = item else {
            return None;
        };
        let [ty, at, value] = parts.as_slice() else {
            return None;
        };
        let values = match value {
            Value::Array(values) => values.iter().map(text).collect::<Option<Vec<_>>>()?,
            _ => Vec::new(),
        };
        let ty = text(ty)?;
        let value = match ty.as_str() {
            "none" => Raw::Absent,
            "string" => Raw::Text(values.into_iter().next()?),
            "hash" => {
                let mut fields = Vec::new();
                let mut result_len = None;
                for pair in values.chunks(2) {
                    let [field, value] = pair else { return None };
                    if field == "#result" {
                        result_len = value.parse().ok();
                    } else {
                        fields.push((field.clone(), value.clone()));
                    }
                }
                Raw::Hash { fields, result_len }
            }
            "zset" => {
                let (card, rest) = values.split_first()?;
                let members = rest
                    .chunks(2)
                    .map(|pair| match pair {
                        [member, score] => Some((member.clone(), score.parse().ok()?)),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()?;
                Raw::ZSet {
                    card: card.parse().ok()?,
                    members,
                }
            }
            _ => Raw::Other(ty),
        };
        entries.push(RawEntry {
            key: key.to_string(),
            value,
            expires_at_ms: u64::try_from(int(at)?).ok(),
        });
    }
    Some(Snapshot {
        now: Duration::from_secs(secs) + Duration::from_micros(micros),
        entries,
    })
}
