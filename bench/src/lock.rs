//! Locks: acquire + release on random keys (uncontended) three ways, then contenders on one
//! key, default and fair, with the hand-off latency.

use std::sync::Arc;
use std::time::Duration;

use redguard::{Redguard, dist_lock, key::KeyBuilder, lock::LockGuard, lock::LockKind};
use redis::aio::ConnectionManager;

use crate::{Bench, Ways, cost, lock_designs, raw};

/// The same acquire + release as the runtime-API case, through the attribute.
#[dist_lock(key = "l:{i}", scope = "bench")]
async fn annotated_section(i: u64) -> redguard::Result<u64> {
    Ok(i)
}

/// The same section through the runtime API: `run` is what the attribute expands into
/// (acquire, the body with its fencing token in context, release).
pub(crate) async fn section(rg: Redguard, i: u64) {
    let lock = rg
        .lock(KeyBuilder::new().text("l:").part("i", &i))
        .scope("bench");
    lock.run(async { Ok::<_, redguard::Error>(i) })
        .await
        .expect("section");
}

/// The two scripts' SHAs, as the runtime loads them: `lock_acquire.lua` after the shared
/// `next_fence`, and `lock_release.lua`.
pub(crate) fn shas() -> (String, String) {
    (
        raw::sha(concat!(
            include_str!("../../runtime/src/store/redis/scripts/fence.lua"),
            include_str!("../../runtime/src/store/redis/scripts/lock_acquire.lua")
        )),
        raw::sha(include_str!(
            "../../runtime/src/store/redis/scripts/lock_release.lua"
        )),
    )
}

/// The fencing counter's TTL the runtime sends (`FENCE_TTL`, a week, above the lease).
const FENCE_TTL_MS: &str = "604800000";

/// `lock_acquire.lua` then `lock_release.lua` on `key`, with exactly the arguments the runtime
/// sends for a plain exclusive lock (`store/redis/lock.rs`): acquire KEYS `[key, key:fence]`,
/// ARGV `[owner, lease ms, level 1, counter TTL ms, waiting "0"]` (the default lease; no
/// `wait`, so no waiter mark); release KEYS `[key]`, ARGV `[owner, level 1, keep 0]`.
pub(crate) fn raw_section(shas: &(String, String), key: &str, owner: &str) -> [redis::Cmd; 2] {
    let fence = format!("{key}:fence");
    let lease = redguard::lock::DEFAULT_LEASE.as_millis().to_string();
    [
        raw::command(
            &shas.0,
            &[key, &fence],
            &[owner, &lease, "1", FENCE_TTL_MS, "0"],
        ),
        raw::command(&shas.1, &[key], &[owner, "1", "0"]),
    ]
}

/// The runtime's key for `section(i)`'s lock.
pub(crate) fn key(i: u64) -> String {
    format!("redguard:lock:{{bench:l:i={i}}}")
}

/// One raw acquire + release cycle on a fresh key, its replies checked: an acquire that did
/// not acquire, or a release that did not release, is the bench's error, never a silent
/// no-op.
pub(crate) async fn raw_cycle(mut conn: ConnectionManager, shas: &(String, String), i: u64) {
    let [acquire, release] = raw_section(shas, &key(i), &format!("{i:032x}"));
    let reply: (i64, i64, i64) = acquire
        .query_async(&mut conn)
        .await
        .expect("EVALSHA lock_acquire");
    assert!(
        reply.0 == 1 && reply.1 > 0 && reply.2 == 1,
        "raw lock_acquire on a free key did not acquire: {reply:?}"
    );
    let released: i64 = release
        .query_async(&mut conn)
        .await
        .expect("EVALSHA lock_release");
    assert_eq!(released, 0, "raw lock_release did not release");
}

/// rslock's acquire + release on a fresh key: `SET NX PX`, then its unlock script.
pub(crate) async fn rslock_cycle(manager: Arc<rslock::LockManager>, i: u64) {
    let resource = format!("rslock:l:{i}");
    let lock = manager
        .lock(resource.as_str(), Duration::from_secs(30))
        .await
        .expect("an rslock lock on a fresh key");
    manager.unlock(&lock).await;
}

pub(crate) async fn cases(bench: &mut Bench, rg: &Redguard, memory: &Redguard) {
    let conn = bench.conn.clone();
    let shas = Arc::new(shas());
    let rg2 = rg.clone();
    let case = "lock acquire+release random keys";
    // redlock: an acquire script and a release script per cycle, like ours.
    let peer = bench.run_peer(
        "peer redlock acquire+release random keys",
        "redlock-cycle",
        &Ways::names(case),
    );
    let rslock = Arc::new(rslock::LockManager::new(vec![bench.url()]));
    let manager = rslock.clone();
    let peer_cycle = move |i| rslock_cycle(manager.clone(), i);
    bench
        .run_rust_peer(RSLOCK_RANDOM, &Ways::names(case), peer_cycle)
        .await;
    let ways = Ways {
        case,
        base: &[],
        ceiling: None,
        peer: &peer,
    };
    ways.run(
        bench,
        |i| async move {
            annotated_section(i).await.expect("section");
        },
        move |i| section(rg2.clone(), i),
        {
            let shas = shas.clone();
            move |i| {
                let (conn, shas) = (conn.clone(), shas.clone());
                async move { raw_cycle(conn, &shas, i).await }
            }
        },
    )
    .await;
    let (rg3, conn, raw_shas, manager) = (rg.clone(), bench.conn.clone(), shas, rslock.clone());
    let mut rows = vec![
        ("our API", cost::op(move |i| section(rg3.clone(), i))),
        (
            "raw scripts",
            cost::op(move |i| {
                let (conn, shas) = (conn.clone(), raw_shas.clone());
                async move { raw_cycle(conn, &shas, i).await }
            }),
        ),
        (
            "rslock",
            cost::op(move |i| rslock_cycle(manager.clone(), i)),
        ),
    ];
    if bench.selected(cost::COST_CASE, "redis") {
        rows.extend(lock_designs::rows(&bench.conn).await);
    }
    cost::lock_cycle(bench, rows).await;
    let m = memory.clone();
    bench
        .run_memory(case, memory, move |i| section(m.clone(), i))
        .await;
    bench.compare(&Ways::names(case)[1], "redis", RSLOCK_RANDOM);
    // redlock retries on a timer (its defaults: every 200 ± 100 ms), where ours are woken.
    let ours = [false, true].map(|fair| contended_case(fair).to_owned());
    let peer = bench.run_peer_contended(
        "peer redlock one key (sections/s, wait)",
        "redlock-contended",
        &ours,
    );
    // rslock's acquire: its `lock` (3 tries, 0-200 ms apart) again until it holds the key.
    let acquire = move || {
        let manager = rslock.clone();
        async move {
            manager
                .acquire("rslock:contended", Duration::from_secs(30))
                .await
                .expect("an rslock lock")
        }
    };
    let release = |guard: rslock::LockGuard| guard.release();
    bench
        .run_contended_peer(RSLOCK_CONTENDED, &ours, acquire, release)
        .await;
    for (store, handle, peer) in [("redis", rg, &peer[..]), ("memory", memory, &[])] {
        for fair in [false, true] {
            contended(bench, store, handle, fair, peer).await;
        }
    }
    for fair in [false, true] {
        bench.compare(contended_case(fair), "redis", RSLOCK_CONTENDED);
    }
}

/// rslock, the Rust Redlock crate, in this process on the bench's Redis (one instance: a
/// quorum of one), beside redlock.
const RSLOCK_RANDOM: &str = "peer rslock acquire+release random keys";
const RSLOCK_CONTENDED: &str = "peer rslock one key (sections/s, wait)";

fn contended_case(fair: bool) -> &'static str {
    if fair {
        "lock one key, fair (sections/s, wait)"
    } else {
        "lock one key, default (sections/s, wait)"
    }
}

/// Contenders on one key, each taking the lock and leaving at once.
async fn contended(
    bench: &mut Bench,
    store: &'static str,
    rg: &Redguard,
    fair: bool,
    peer: &[Option<f64>],
) {
    let case = contended_case(fair);
    let rg = rg.clone();
    let acquire = move || {
        let kind = if fair {
            LockKind::Fair
        } else {
            LockKind::Exclusive
        };
        let lock = rg
            .lock("contended")
            .kind(kind)
            .scope("bench")
            .wait(Duration::from_secs(30));
        async move { lock.acquire().await.expect("acquire") }
    };
    let release = |guard: LockGuard| async move { guard.release().await.expect("release") };
    bench
        .run_contended(case, store, peer, acquire, release)
        .await;
}
