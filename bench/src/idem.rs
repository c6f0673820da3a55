//! Idempotency: replay (of a finished record) and first execution (begin + finish).

use std::time::Duration;

use redguard::{Redguard, idempotent, key::KeyBuilder};

use crate::raw;
use crate::{Bench, Ways};

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

async fn replay(_: u64) {
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
    let sha = raw::sha(include_str!(
        "../../runtime/src/store/redis/scripts/idem_begin.lua"
    ));
    let record = "redguard:idem:{bench:bench:0}";
    let args = raw::evalsha(&sha, &[record], &["o", "", "600000"]);
    let (base, ceiling) = bench.baselines(&args);
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
        move |i| {
            let owner = format!("{i:032x}");
            let cmd = raw::command(&sha, &[record], &[&owner, "", "600000"]);
            raw::send(conn.clone(), vec![cmd])
        },
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
    bench
        .run_memory("idempotency replay (runtime API)", memory, replay)
        .await;
    bench
        .run_memory("idempotency first (begin+finish)", memory, first)
        .await;
}
