//! One subscription per sentinel to its failover announcements, forwarded to the follower.

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::sync::mpsc::UnboundedSender;

use super::Shared;
use super::follow::Announcement;
use super::probe::CAP;

/// The sentinel channels that name the next master.
const CHANNELS: [&str; 3] = ["+switch-master", "+selected-slave", "+promoted-slave"];

/// Pause before subscribing again to a sentinel that is down.
const RETRY: Duration = Duration::from_secs(1);

/// Keeps a subscription to sentinel `index` up until the connection's state is dropped.
pub(super) async fn run(
    shared: Weak<Shared>,
    index: usize,
    announce: UnboundedSender<Announcement>,
) {
    loop {
        let (client, name) = match shared.upgrade() {
            Some(shared) => (
                shared.nodes.sentinels[index].clone(),
                shared.nodes.master_name.clone(),
            ),
            None => return,
        };
        let subscribed = tokio::time::timeout(CAP, async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&CHANNELS[..]).await?;
            Ok::<_, redis::RedisError>(pubsub)
        })
        .await;
        if let Ok(Ok(pubsub)) = subscribed {
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                let payload: String = message.get_payload().unwrap_or_default();
                if let Some(announcement) = parse(message.get_channel_name(), &payload, &name)
                    && announce.send(announcement).is_err()
                {
                    return;
                }
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// `+switch-master <name> <old ip> <old port> <new ip> <new port>`;
/// `+selected-slave slave <ip>:<port> <ip> <port> @ <name> <master ip> <master port>`.
fn parse(channel: &str, payload: &str, name: &str) -> Option<Announcement> {
    let fields: Vec<&str> = payload.split_whitespace().collect();
    if channel == "+switch-master" {
        return match fields[..] {
            [master, _, _, host, port] if master == name => Some(Announcement::Switched((
                host.to_owned(),
                port.parse().ok()?,
            ))),
            _ => None,
        };
    }
    match fields[..] {
        ["slave", _, host, port, "@", master, _, _] if master == name => Some(
            Announcement::Promoting((host.to_owned(), port.parse().ok()?)),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{Announcement, parse};

    #[test]
    fn announcements_of_our_master_only() {
        assert_eq!(
            parse(
                "+switch-master",
                "mymaster 127.0.0.1 6379 127.0.0.1 6380",
                "mymaster"
            ),
            Some(Announcement::Switched(("127.0.0.1".to_owned(), 6380)))
        );
        assert_eq!(
            parse(
                "+selected-slave",
                "slave 127.0.0.1:6381 127.0.0.1 6381 @ mymaster 127.0.0.1 6379",
                "mymaster"
            ),
            Some(Announcement::Promoting(("127.0.0.1".to_owned(), 6381)))
        );
        assert_eq!(
            parse(
                "+switch-master",
                "other 127.0.0.1 6379 127.0.0.1 6380",
                "mymaster"
            ),
            None
        );
        assert_eq!(parse("+selected-slave", "garbage", "mymaster"), None);
    }
}
