//! The follower task: finds the master, and moves to the new one when a call finds the old
//! one gone, a sentinel announces a promotion, or the 1 s check finds the sentinels naming
//! another.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use super::config::Nodes;
use super::probe::{CAP, master_at, named_masters, open, role};
use super::{Master, Node, Shared};
use crate::error::{BackendError, Result, StoreFailure};

/// How often the sentinels are asked while no master answers.
const RETRY: Duration = Duration::from_millis(100);
/// How often the current master is checked (its `ROLE`, and whom the sentinels name).
const CHECK: Duration = Duration::from_secs(1);
/// How often an announced candidate is asked whether it is master yet.
const POLL: Duration = Duration::from_millis(20);
/// How long an announced candidate is waited for before the sentinels are asked again.
const PROMOTION: Duration = Duration::from_secs(2);
/// How long a master left for an announced promotion is not returned to, unless the
/// sentinels name another first: they name the promoted replica within a few seconds (a
/// failover that fails after its promotion leaves the old master named, after this).
const DEMOTION: Duration = Duration::from_secs(10);

/// What a sentinel announced about our master.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Announcement {
    /// `+selected-slave` / `+promoted-slave`: the replica at this address is being promoted.
    Promoting((String, u16)),
    /// `+switch-master`: the master is now at this address.
    Switched((String, u16)),
}

static GENERATION: AtomicU64 = AtomicU64::new(1);

fn node(
    addr: (String, u16),
    conn: redis::aio::MultiplexedConnection,
    client: redis::Client,
) -> Node {
    Node {
        addr,
        conn,
        client,
        generation: GENERATION.fetch_add(1, Ordering::Relaxed),
    }
}

/// The master at connect time: the sentinels are asked until one names a node that says it
/// is master, within `within`.
pub(super) async fn first_master(nodes: &Nodes, within: Duration) -> Result<Node> {
    let deadline = Instant::now() + within;
    loop {
        for addr in named_masters(nodes).await {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Some((conn, client)) = master_at(nodes, &addr, CAP.min(left)).await {
                tracing::info!(host = %addr.0, port = addr.1, "Redis master found through Sentinel");
                return Ok(node(addr, conn, client));
            }
        }
        if Instant::now() + RETRY >= deadline {
            return Err(BackendError::Failed {
                op: "connect",
                source: StoreFailure::new(std::io::Error::other(format!(
                    "no sentinel named a reachable master for {:?} within {within:?}",
                    nodes.master_name
                ))),
            }
            .into());
        }
        tokio::time::sleep(RETRY).await;
    }
}

enum Wake {
    Kick,
    Timer,
    Announced(Announcement),
}

/// A master left for an announced promotion: it says master until the sentinels demote it,
/// and until they have all heard of the promotion they name it, but what it acknowledges now
/// is lost (Redis 6.2 and 8.2 name the promoted replica about a second after promoting it).
/// So it is not returned to for [`DEMOTION`], unless the sentinels name another master first.
#[derive(Default)]
struct Demoted(Option<((String, u16), Instant)>);

impl Demoted {
    fn is(&mut self, addr: &(String, u16)) -> bool {
        if self
            .0
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() >= DEMOTION)
        {
            self.0 = None;
        }
        self.0.as_ref().is_some_and(|(left, _)| left == addr)
    }
}

/// Runs until the connection's shared state is dropped.
pub(super) async fn run(shared: Weak<Shared>, mut announced: UnboundedReceiver<Announcement>) {
    let mut next_check = Instant::now() + CHECK;
    let mut demoted = Demoted::default();
    // The check's own connection to the master, by the master's generation.
    let mut probe = None;
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let broken = matches!(*shared.master.borrow(), Master::Broken);
        let until = if broken {
            Instant::now() + RETRY
        } else {
            next_check
        };
        let wake = tokio::select! {
            () = shared.kick.notified() => Wake::Kick,
            announcement = announced.recv() => match announcement {
                Some(announcement) => Wake::Announced(announcement),
                None => return,
            },
            () = tokio::time::sleep_until(until) => Wake::Timer,
        };
        match wake {
            Wake::Announced(Announcement::Promoting(addr)) => {
                promote(&shared, addr, &mut demoted).await;
            }
            Wake::Announced(Announcement::Switched(addr)) => {
                switched(&shared, addr, &mut demoted).await;
            }
            Wake::Kick | Wake::Timer if matches!(*shared.master.borrow(), Master::Broken) => {
                resolve(&shared, &mut demoted).await;
            }
            Wake::Kick => {}
            Wake::Timer => {
                check(&shared, &mut demoted, &mut probe).await;
                next_check = Instant::now() + CHECK;
            }
        }
    }
}

fn current(shared: &Shared) -> Option<Arc<Node>> {
    match &*shared.master.borrow() {
        Master::Up(node) => Some(node.clone()),
        Master::Switching | Master::Broken => None,
    }
}

fn switch(
    shared: &Shared,
    addr: (String, u16),
    conn: redis::aio::MultiplexedConnection,
    client: redis::Client,
) {
    tracing::warn!(host = %addr.0, port = addr.1, "Redis master moved; following it");
    shared
        .master
        .send_replace(Master::Up(Arc::new(node(addr, conn, client))));
}

/// No master answers: ask the sentinels, and take the first node they name that says it is
/// master (not one being demoted).
async fn resolve(shared: &Shared, demoted: &mut Demoted) {
    for addr in named_masters(&shared.nodes).await {
        if demoted.is(&addr) {
            continue;
        }
        if let Some((conn, client)) = master_at(&shared.nodes, &addr, CAP).await {
            demoted.0 = None;
            switch(shared, addr, conn, client);
            return;
        }
    }
    shared.master.send_if_modified(|master| {
        let changed = !matches!(master, Master::Broken);
        *master = Master::Broken;
        changed
    });
}

/// A sentinel announced the replica at `addr` as the next master: stop sending to the old
/// one (its writes from now on would be lost) and poll `addr` until it says master. The old
/// one is then being demoted.
async fn promote(shared: &Shared, addr: (String, u16), demoted: &mut Demoted) {
    let left = current(shared).map(|node| node.addr.clone());
    if left.as_ref() == Some(&addr) {
        return;
    }
    shared.master.send_replace(Master::Switching);
    let deadline = Instant::now() + PROMOTION;
    while Instant::now() < deadline {
        if let Some((conn, client)) = master_at(&shared.nodes, &addr, CAP).await {
            switch(shared, addr, conn, client);
            if let Some(left) = left {
                demoted.0 = Some((left, Instant::now()));
            }
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    tracing::warn!(host = %addr.0, port = addr.1, "the announced Redis master was not promoted");
    demoted.0 = None;
    resolve(shared, demoted).await;
}

/// A sentinel announced that the master is now at `addr`: the promotion is done, so the node
/// must say master at once. If it does not (a sentinel late with news of an older failover),
/// calls are not held up.
async fn switched(shared: &Shared, addr: (String, u16), demoted: &mut Demoted) {
    if current(shared).is_some_and(|node| node.addr == addr) {
        return;
    }
    match master_at(&shared.nodes, &addr, CAP).await {
        Some((conn, client)) => switch(shared, addr, conn, client),
        None if current(shared).is_none() => resolve(shared, demoted).await,
        // The current master stays; the 1 s check asks the sentinels.
        None => {}
    }
}

/// The periodic check: the master must still say it is master (asked on `probe`, a connection
/// of the check's own: the calls' may be held up by their `WAIT`s), and be the one the sentinels name. A
/// different node is moved to only once it says it is master too, and not while it is being
/// demoted.
async fn check(
    shared: &Shared,
    demoted: &mut Demoted,
    probe: &mut Option<(u64, MultiplexedConnection)>,
) {
    let Some(node) = current(shared) else {
        return;
    };
    if probe
        .as_ref()
        .is_none_or(|(generation, _)| *generation != node.generation)
    {
        *probe = open(&node.client, CAP)
            .await
            .map(|conn| (node.generation, conn));
    }
    let said = match probe {
        Some((_, conn)) => role(conn).await,
        None => None,
    };
    if said.as_deref() != Some("master") {
        *probe = None;
        shared.master.send_if_modified(|master| match master {
            Master::Up(current) if current.generation == node.generation => {
                *master = Master::Broken;
                true
            }
            _ => false,
        });
        resolve(shared, demoted).await;
        return;
    }
    let named = named_masters(&shared.nodes).await;
    let Some(addr) = named.into_iter().next() else {
        return;
    };
    if addr == node.addr {
        demoted.0 = None;
    } else if !demoted.is(&addr)
        && let Some((conn, client)) = master_at(&shared.nodes, &addr, CAP).await
        && current(shared).is_some_and(|now| now.generation == node.generation)
    {
        switch(shared, addr, conn, client);
    }
}
