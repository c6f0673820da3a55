//! Pacing (issue 28): 1,000 callers waiting on one key at once. Reported as a note, not a
//! throughput row: the limit sets the pace, and what is measured is what waiting costs —
//! script calls Redis ran per admission (`INFO commandstats`, before and after) and how many
//! waiters were refused (none should be). Timers are one per waiter by construction (its
//! deadline while queued, the head's sleep once it leads).

use std::time::{Duration, Instant};

use redguard::Redguard;
use redis::aio::ConnectionManager;

use crate::Bench;

const WAITERS: u32 = 1000;
/// 1,000 waiters of 1000/s with burst 1: the last slot about 1 s after the first.
const RATE: &str = "1000/s";

/// Script calls Redis has run (`EVALSHA`, and `EVAL` should a script be sent whole).
pub(crate) async fn script_calls(conn: &mut ConnectionManager) -> u64 {
    command_calls(conn, |command| matches!(command, "evalsha" | "eval")).await
}

/// Calls Redis has run of the commands `counted` accepts (by lower-case name, as
/// `INFO commandstats` spells them: `evalsha`, `psubscribe`, `info`...).
pub(crate) async fn command_calls(
    conn: &mut ConnectionManager,
    counted: impl Fn(&str) -> bool,
) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_")?.split_once(":calls="))
        .filter(|(command, _)| counted(command))
        .filter_map(|(_, rest)| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
}

pub(crate) async fn cases(bench: &mut Bench, rg: &Redguard) {
    let case = "rate pacing, 1000 waiters on one key";
    if !bench.selected(case, "redis") {
        return;
    }
    let limiter = rg
        .limiter("pace:one-key")
        .scope("bench::pace")
        .rate(RATE)
        .burst(1)
        .wait(Duration::from_secs(10));
    let mut conn = bench.conn.clone();
    let before = script_calls(&mut conn).await;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(WAITERS as usize);
    for _ in 0..WAITERS {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move { limiter.check().await.is_ok() }));
    }
    let mut admitted = 0u32;
    for task in tasks {
        admitted += u32::from(task.await.expect("waiter panicked"));
    }
    let elapsed = start.elapsed();
    let calls = script_calls(&mut conn).await - before;
    let note = format!(
        "{case} ({RATE}, burst 1, wait 10 s): {admitted} of {WAITERS} admitted in {:.2} s \
         (schedule {:.2} s), {calls} script calls = {:.2} per admission; timers: one per waiter",
        elapsed.as_secs_f64(),
        f64::from(WAITERS - 1) / 1000.0,
        calls as f64 / f64::from(admitted.max(1)),
    );
    println!("{note}");
    bench.notes.push(note);
}
