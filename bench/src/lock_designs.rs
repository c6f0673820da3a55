//! Other designs of the lock's free path, measured beside ours and rslock in the server-cost
//! table (`cost::lock_cycle`): what a cycle could cost Redis if the lock were stored another
//! way. Each is the free path only (a fresh key per cycle, as in the table's other rows), with
//! its replies checked, so a row cannot turn into a no-op. Issue 46 step 2 reads its lever
//! from these rows: which part of our cycle a redesign would remove, measured, not guessed.

use std::sync::Arc;

use redis::aio::ConnectionManager;

use crate::cost::{self, Op};
use crate::{lock, raw};

/// A design: its row name, its acquire and release scripts, whether its acquire takes the
/// fencing counter as a second key, and its release's last argument (`lock_release.lua`
/// reads it as the minimum hold, so it must be 0 there; the one-key design keeps the freed
/// key this long).
struct Design {
    row: &'static str,
    acquire: &'static str,
    release: &'static str,
    counter: bool,
    keep: &'static str,
}

static DESIGNS: [Design; 4] = [
    Design {
        row: "design: two scripts that answer at once",
        acquire: include_str!("lock_designs/floor_acquire.lua"),
        release: include_str!("lock_designs/floor_release.lua"),
        counter: false,
        keep: "0",
    },
    Design {
        row: "design: ours without the fencing counter",
        acquire: include_str!("lock_designs/unfenced_acquire.lua"),
        release: include_str!("../../runtime/src/store/redis/scripts/lock_release.lua"),
        counter: false,
        keep: "0",
    },
    Design {
        row: "design: one string value, counter kept",
        acquire: include_str!("lock_designs/string_acquire.lua"),
        release: include_str!("lock_designs/string_release.lua"),
        counter: true,
        keep: "0",
    },
    Design {
        row: "design: one key kept after release",
        acquire: include_str!("lock_designs/onekey_acquire.lua"),
        release: include_str!("lock_designs/onekey_release.lua"),
        counter: false,
        keep: KEEP_MS,
    },
];

/// The fencing counter's TTL, as the runtime sends it: also how long the one-key design keeps
/// a released key.
const KEEP_MS: &str = "604800000";

/// Loads every design's scripts; the rows name them by SHA.
async fn load(conn: &mut ConnectionManager) {
    for design in &DESIGNS {
        for script in [design.acquire, design.release] {
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(script)
                .query_async(conn)
                .await
                .expect("SCRIPT LOAD of a lock design");
        }
    }
}

async fn cycle(mut conn: ConnectionManager, design: &Design, shas: &(String, String), i: u64) {
    let key = lock::key(i);
    let counter = format!("{key}:fence");
    let owner = format!("{i:032x}");
    let lease = redguard::lock::DEFAULT_LEASE.as_millis().to_string();
    let keys: &[&str] = if design.counter {
        &[&key, &counter]
    } else {
        &[&key]
    };
    let reply: (i64, i64, i64) = raw::command(&shas.0, keys, &[&owner, &lease, "1", KEEP_MS])
        .query_async(&mut conn)
        .await
        .expect("EVALSHA of a design's acquire");
    assert_eq!(reply.0, 1, "{}: did not acquire a fresh key", design.row);
    let released: i64 = raw::command(&shas.1, &[&key], &[&owner, "1", design.keep])
        .query_async(&mut conn)
        .await
        .expect("EVALSHA of a design's release");
    assert_eq!(released, 0, "{}: did not release", design.row);
}

/// `SET NX PX` then `DEL`: the floor of any lock kept in a key with a lease, owner unchecked.
async fn native(mut conn: ConnectionManager, i: u64) {
    let key = lock::key(i);
    let set: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg("1")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut conn)
        .await
        .expect("SET NX PX");
    assert!(set.is_some(), "SET NX PX on a fresh key did not set");
    let deleted: i64 = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("DEL");
    assert_eq!(deleted, 1);
}

/// The designs' rows for `cost::lock_cycle`, their scripts loaded.
pub(crate) async fn rows(conn: &ConnectionManager) -> Vec<(&'static str, Op)> {
    load(&mut conn.clone()).await;
    let mut rows = Vec::new();
    for design in &DESIGNS {
        let shas = Arc::new((raw::sha(design.acquire), raw::sha(design.release)));
        let conn = conn.clone();
        rows.push((
            design.row,
            cost::op(move |i| {
                let (conn, shas) = (conn.clone(), shas.clone());
                async move { cycle(conn, design, &shas, i).await }
            }),
        ));
    }
    let conn = conn.clone();
    rows.push((
        "design: SET NX PX + DEL, no script",
        cost::op(move |i| native(conn.clone(), i)),
    ));
    rows
}
