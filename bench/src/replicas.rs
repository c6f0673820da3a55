//! Replica-safe writes: lock cycles and idempotent first executions on a master with one
//! replica, without and with `.replicas(1, 50ms)` (`WAIT 1 50` behind each guarded write),
//! in the same run.

use std::time::Duration;

use redguard::{Redguard, key::KeyBuilder};
use redguard_tests::RedisServer;

use crate::Bench;

/// `WAIT`'s bound; on loopback a replica answers in tens of µs.
const WAIT: Duration = Duration::from_millis(50);

const CASES: [(&str, bool); 4] = [
    (
        "lock acquire+release random keys, 1 replica (runtime API)",
        false,
    ),
    (
        "lock acquire+release random keys, confirmed by 1 replica (runtime API)",
        true,
    ),
    ("idempotency first (begin+finish), 1 replica", false),
    (
        "idempotency first (begin+finish), confirmed by 1 replica",
        true,
    ),
];

async fn section(rg: Redguard, i: u64, replicas: bool) {
    let mut lock = rg
        .lock(KeyBuilder::new().text("l:").part("i", &i))
        .scope("bench");
    if replicas {
        lock = lock.replicas(1, WAIT);
    }
    lock.run(async { Ok::<_, redguard::Error>(i) })
        .await
        .expect("section");
}

async fn first(rg: Redguard, i: u64, replicas: bool) {
    let key = KeyBuilder::new()
        .text("bench:")
        .part("id", &i)
        .finish()
        .expect("numeric key parts are valid");
    let mut idem = redguard::idempotency(key)
        .scope("bench-replicas")
        .expire(Duration::from_secs(60));
    if replicas {
        idem = idem.replicas(1, WAIT);
    }
    rg.scope(idem.run(async move { Ok::<_, redguard::Error>(i) }))
        .await
        .expect("first execution");
}

pub(crate) async fn cases(bench: &mut Bench) {
    if !CASES.iter().any(|(case, _)| bench.selected(case, "redis")) {
        return;
    }
    let core = crate::LOAD_CORE.map(|_| "0");
    let master = RedisServer::start_pinned(core);
    let replica = RedisServer::start_pinned(core);
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port())
        .query(&mut replica.connection())
        .expect("REPLICAOF");
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(20_000)
        .query(&mut master.connection())
        .expect("WAIT for the replica to sync");
    assert_eq!(acked, 1, "the bench replica did not sync");
    let rg = Redguard::redis(master.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect to the bench master");
    // The first case measured on fresh servers ran at half speed at 1 in flight, whichever
    // it was: warm them (and both of the handle's connections) up first.
    for replicas in [false, true] {
        let rg = rg.clone();
        crate::measure::closed_loop(16, Duration::ZERO, bench.warmup * 2, move |i| {
            first(rg.clone(), i, replicas)
        })
        .await;
    }
    for (case, replicas) in CASES {
        let rg = rg.clone();
        let lock = case.starts_with("lock");
        bench
            .run(case, "redis", None, None, &[], move |i| {
                let rg = rg.clone();
                async move {
                    if lock {
                        section(rg, i, replicas).await;
                    } else {
                        first(rg, i, replicas).await;
                    }
                }
            })
            .await;
    }
}
