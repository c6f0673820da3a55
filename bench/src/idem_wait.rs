//! Waiting duplicates (issue 29): 64 duplicates of one key arriving together while the first
//! execution's body takes a fixed 20 ms, with `wait` (one runs, the others wait for its
//! notification and replay) and without (the others get `InProgress` at once). Reported as
//! notes, not throughput rows: what is measured is what waiting costs Redis — calls per
//! duplicate, by `INFO commandstats` before and after each group — and when the group is done.
//! Each round takes a fresh key; the first round with `wait` includes the handle's one
//! subscription.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use redguard::key::KeyBuilder;
use redguard::{Error, Redguard};
use redis::aio::ConnectionManager;

use crate::Bench;
use crate::pace::{command_calls, script_calls};

const DUPLICATES: u32 = 64;
const ROUNDS: u64 = 5;
/// The first execution's body: long enough that every duplicate arrives while it runs.
const BODY: Duration = Duration::from_millis(20);
const WAIT: Duration = Duration::from_secs(2);

/// What one group of duplicates did.
#[derive(Default)]
struct Group {
    runs: u32,
    replays: u32,
    in_progress: u32,
    /// Commands clients sent for the group (see [`redis_calls`]).
    calls: u64,
    script_calls: u64,
    elapsed: Duration,
}

/// Commands clients sent: scripts and the connections' own (the waiters' subscription, a
/// reconnect's handshake). `INFO commandstats` also counts what a script runs (`redis.call`),
/// which is no call from a client; on this path nothing else is sent outside a script.
async fn redis_calls(conn: &mut ConnectionManager) -> u64 {
    command_calls(conn, |command| {
        matches!(
            command,
            "evalsha"
                | "eval"
                | "psubscribe"
                | "subscribe"
                | "punsubscribe"
                | "unsubscribe"
                | "ping"
                | "hello"
                | "select"
                | "auth"
        ) || command.starts_with("script|")
            || command.starts_with("client|")
    })
    .await
}

async fn group(rg: &Redguard, conn: &mut ConnectionManager, key: u64, wait: bool) -> Group {
    let runs = Arc::new(AtomicU32::new(0));
    let (calls, scripts) = (redis_calls(conn).await, script_calls(conn).await);
    let start = Instant::now();
    let tasks: Vec<_> = (0..DUPLICATES)
        .map(|_| {
            let mut guard = rg
                .idempotency(
                    KeyBuilder::new()
                        .text("bench-wait:")
                        .part("id", &key)
                        .finish()
                        .expect("numeric key parts are valid"),
                )
                .scope("bench-wait")
                .expire(Duration::from_secs(60));
            if wait {
                guard = guard.wait(WAIT);
            }
            let runs = runs.clone();
            tokio::spawn(async move {
                guard
                    .run(async move {
                        runs.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(BODY).await;
                        Ok::<_, Error>(key)
                    })
                    .await
            })
        })
        .collect();
    let mut done = Group::default();
    for task in tasks {
        match task.await.expect("duplicate panicked") {
            Ok(value) => {
                assert_eq!(value, key, "a duplicate got another key's result");
                done.replays += 1;
            }
            Err(Error::InProgress) => done.in_progress += 1,
            Err(err) => panic!("duplicate failed: {err}"),
        }
    }
    done.elapsed = start.elapsed();
    done.script_calls = script_calls(conn).await - scripts;
    done.calls = redis_calls(conn).await - calls;
    done.runs = runs.load(Ordering::Relaxed);
    done.replays -= done.runs;
    done
}

pub(crate) async fn cases(bench: &mut Bench, rg: &Redguard) {
    for wait in [true, false] {
        let case = if wait {
            "idempotency 64 duplicates, wait 2 s"
        } else {
            "idempotency 64 duplicates, no wait"
        };
        if !bench.selected(case, "redis") {
            continue;
        }
        let mut conn = bench.conn.clone();
        let mut groups = Vec::new();
        for round in 0..ROUNDS {
            // Fresh keys per round and per mode: a finished key would only replay.
            let key = round + if wait { 0 } else { ROUNDS };
            groups.push(group(rg, &mut conn, key, wait).await);
        }
        let sum = |f: fn(&Group) -> u64| groups.iter().map(f).sum::<u64>();
        let duplicates = f64::from(DUPLICATES) * groups.len() as f64;
        let mut elapsed: Vec<f64> = groups
            .iter()
            .map(|g| g.elapsed.as_secs_f64() * 1e3)
            .collect();
        elapsed.sort_by(f64::total_cmp);
        let note = format!(
            "{case} (body {} ms, {ROUNDS} rounds): runs {}, replays {}, in progress {}; \
             Redis calls per duplicate {:.2} (script calls {:.2}); group done in \
             {:.1} ms median, {:.1} ms max",
            BODY.as_millis(),
            sum(|g| u64::from(g.runs)),
            sum(|g| u64::from(g.replays)),
            sum(|g| u64::from(g.in_progress)),
            sum(|g| g.calls) as f64 / duplicates,
            sum(|g| g.script_calls) as f64 / duplicates,
            elapsed[elapsed.len() / 2],
            elapsed[elapsed.len() - 1],
        );
        println!("{note}");
        bench.notes.push(note);
    }
}
