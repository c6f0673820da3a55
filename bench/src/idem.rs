//! Idempotency: replay (of a finished record) and first execution (begin + finish).

use std::time::Duration;

use redguard::{Redguard, idempotent, key::KeyBuilder};
use redis::aio::ConnectionManager;

use crate::{Bench, Ways};
use crate::{cost, raw};

/// The same replay as the runtime-API case, through the attribute.
#[idempotent(key = "bench:{id}", expire = 600, scope = "bench")]
async fn annotated_replay(id: u64) -> redguard::Result<u64> {
    Ok(id)
}

fn key(i: u64) -> redguard::key::KeyBody {
    KeyBuilder::new()
        .text("bench:")
        .part("id", &i)
        .finish()
        .expect("numeric key parts are valid")
}

async fn first(i: u64) {
    let run = redguard::idempotency(key(i))
        .scope("bench-first")
        .expire(Duration::from_secs(60))
        .run(async move { Ok::<_, redguard::Error>(i) });
    run.await.expect("first execution");
}

/// `idem_begin.lua`'s SHA, as the runtime loads it.
pub(crate) fn replay_sha() -> String {
    raw::sha(include_str!(
        "../../runtime/src/store/redis/scripts/idem_begin.lua"
    ))
}

/// `idem_finish.lua`'s SHA, as the runtime loads it.
fn finish_sha() -> String {
    raw::sha(include_str!(
        "../../runtime/src/store/redis/scripts/idem_finish.lua"
    ))
}

/// Other designs of a first execution, beside ours in the cost table: a row name, its begin
/// and finish scripts (each answers 0/{0} started and 1 recorded, as ours do on a fresh key).
static DESIGNS: [(&str, &str, &str); 2] = [
    (
        "design: two scripts that answer at once",
        include_str!("idem_designs/floor_begin.lua"),
        include_str!("idem_designs/floor_finish.lua"),
    ),
    (
        "design: one string record",
        include_str!("idem_designs/string_begin.lua"),
        include_str!("idem_designs/string_finish.lua"),
    ),
];

/// The raw first execution: `idem_begin.lua` on `first(i)`'s record, then `idem_finish.lua`
/// with the result the runtime stores, each reply checked.
async fn raw_first(mut conn: ConnectionManager, shas: &(String, String), i: u64) {
    let (record, owner) = (
        format!("redguard:idem:{{bench-first:bench:{i}}}"),
        format!("{i:032x}"),
    );
    let result = i.to_string();
    let begun: Vec<redis::Value> = raw::command(&shas.0, &[&record], &[&owner, "", "60000"])
        .query_async(&mut conn)
        .await
        .expect("EVALSHA idem_begin");
    assert_eq!(
        begun,
        [redis::Value::Int(0)],
        "raw idem_begin did not start"
    );
    let finished: i64 = raw::command(&shas.1, &[&record], &[&owner, "S", &result, "60000"])
        .query_async(&mut conn)
        .await
        .expect("EVALSHA idem_finish");
    assert_eq!(finished, 1, "raw idem_finish did not record");
}

/// The record every replay reads (`replay(0)` seeds it).
const RECORD: &str = "redguard:idem:{bench:bench:0}";

/// The raw replay: `idem_begin.lua` on the finished record, with an owner token as long as
/// the runtime's, fresh per call like the runtime's.
pub(crate) async fn raw_replay(conn: ConnectionManager, sha: String, i: u64) {
    let owner = format!("{i:032x}");
    let cmd = raw::command(&sha, &[RECORD], &[&owner, "", "600000"]);
    raw::send(conn, vec![cmd]).await;
}

pub(crate) async fn replay(_: u64) {
    let run = redguard::idempotency(key(0))
        .scope("bench")
        .expire(Duration::from_secs(600))
        .run(async { Ok::<_, redguard::Error>(0u64) });
    run.await.expect("replay");
}

pub(crate) async fn cases(bench: &mut Bench, rg: &Redguard, memory: &Redguard) {
    // Seed the record every replay case reads.
    replay(0).await;
    rg.scope(async { annotated_replay(0).await.map(drop) })
        .await
        .expect("seed the replay record");

    // Redis's own numbers for the replay script: idem_begin on a SUCCESS record.
    let sha = replay_sha();
    let args = raw::evalsha(&sha, &[RECORD], &["o", "", "600000"]);
    let (base, ceiling) = bench.baselines(
        &["idempotency replay", "idempotency first (begin+finish)"],
        &args,
    );
    let conn = bench.conn.clone();
    let ways = Ways {
        case: "idempotency replay",
        base: &base,
        ceiling,
        peer: &[],
    };
    ways.run(
        bench,
        |_| async {
            annotated_replay(0).await.expect("replay");
        },
        replay,
        // An owner token as long as the runtime's, fresh per call like the runtime's.
        move |i| raw_replay(conn.clone(), sha.clone(), i),
    )
    .await;
    bench
        .run(
            "idempotency first (begin+finish)",
            "redis",
            None,
            ceiling,
            &[],
            first,
        )
        .await;
    let shas = std::sync::Arc::new((replay_sha(), finish_sha()));
    let conn = bench.conn.clone();
    let mut rows = vec![
        ("our API", cost::op(first)),
        (
            "raw scripts",
            cost::op(move |i| {
                let (conn, shas) = (conn.clone(), shas.clone());
                async move { raw_first(conn, &shas, i).await }
            }),
        ),
        ("replay (API)", cost::op(replay)),
    ];
    if bench.selected(cost::IDEM_COST_CASE, "redis") {
        for (row, begin, finish) in &DESIGNS {
            let mut load = bench.conn.clone();
            for script in [begin, finish] {
                let _: String = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(*script)
                    .query_async(&mut load)
                    .await
                    .expect("SCRIPT LOAD");
            }
            let shas = std::sync::Arc::new((raw::sha(begin), raw::sha(finish)));
            let conn = bench.conn.clone();
            rows.push((
                row,
                cost::op(move |i| {
                    let (conn, shas) = (conn.clone(), shas.clone());
                    async move { raw_first(conn, &shas, i).await }
                }),
            ));
        }
    }
    cost::per_op(bench, cost::IDEM_COST_CASE, "raw scripts", rows).await;
    bench
        .run_memory("idempotency replay (runtime API)", memory, replay)
        .await;
    bench
        .run_memory("idempotency first (begin+finish)", memory, first)
        .await;
}
