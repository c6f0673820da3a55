//! Questions to the sentinels and the data nodes, each bounded: a hung sentinel or node costs
//! one cap, never a stalled follower.

use std::sync::PoisonError;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;

use super::config::Nodes;

/// The cap on each question to one sentinel or node (connecting included).
pub(super) const CAP: Duration = Duration::from_millis(500);

/// Opens a multiplexed connection from `client` within `cap`. No response timeout of the
/// client's own: calls on data nodes are bounded by the store, probes by `cap`.
pub(super) async fn open(client: &redis::Client, cap: Duration) -> Option<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(cap))
        .set_response_timeout(None);
    tokio::time::timeout(
        cap,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    .ok()?
    .map_err(|err| tracing::debug!(error = %err, "Redis Sentinel: cannot connect"))
    .ok()
}

/// The masters the sentinels name, asked all at once: the most named first, then the others
/// (a sentinel that has not heard of a failover yet names the old one). Returns as soon as a
/// majority of the sentinels agree, so a hung one costs nothing then.
pub(super) async fn named_masters(nodes: &Nodes) -> Vec<(String, u16)> {
    let mut answers: FuturesUnordered<_> = nodes
        .sentinels
        .iter()
        .zip(&nodes.asked)
        .map(|(sentinel, asked)| async move {
            let cached = asked.lock().unwrap_or_else(PoisonError::into_inner).clone();
            let answer = tokio::time::timeout(CAP, async {
                let mut conn = match cached {
                    Some(conn) => conn,
                    None => open(sentinel, CAP).await?,
                };
                let reply = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&nodes.master_name)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await;
                Some((conn, reply))
            })
            .await
            .ok()
            .flatten();
            let mut asked = asked.lock().unwrap_or_else(PoisonError::into_inner);
            match answer {
                Some((conn, Ok(named))) => {
                    *asked = Some(conn);
                    named
                }
                Some((_, Err(err))) => {
                    tracing::debug!(error = %err, "Redis Sentinel: no answer");
                    *asked = None;
                    None
                }
                None => {
                    *asked = None;
                    None
                }
            }
        })
        .collect();
    let majority = nodes.sentinels.len() / 2 + 1;
    let mut votes: Vec<((String, u16), usize)> = Vec::new();
    while let Some(answer) = answers.next().await {
        let Some(addr) = answer else { continue };
        let n = match votes.iter_mut().find(|(named, _)| *named == addr) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                votes.push((addr, 1));
                1
            }
        };
        if n >= majority {
            break;
        }
    }
    votes.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    votes.into_iter().map(|(addr, _)| addr).collect()
}

/// The node's replication role (`master`, `slave`), `None` when it does not answer in time.
pub(super) async fn role(conn: &mut MultiplexedConnection) -> Option<String> {
    let reply = tokio::time::timeout(CAP, redis::cmd("ROLE").query_async::<redis::Value>(conn))
        .await
        .ok()?
        .ok()?;
    match reply {
        redis::Value::Array(fields) => match fields.into_iter().next()? {
            redis::Value::BulkString(role) => String::from_utf8(role).ok(),
            redis::Value::SimpleString(role) => Some(role),
            _ => None,
        },
        _ => None,
    }
}

/// Connects to the node at `addr` and returns the connection if it says it is the master.
pub(super) async fn master_at(
    nodes: &Nodes,
    addr: &(String, u16),
    cap: Duration,
) -> Option<(MultiplexedConnection, redis::Client)> {
    let client = nodes.node(&addr.0, addr.1).ok()?;
    let mut conn = open(&client, cap).await?;
    (role(&mut conn).await.as_deref() == Some("master")).then_some((conn, client))
}
