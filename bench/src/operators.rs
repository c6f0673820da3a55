//! What the operators' tools cost a rate check (issue 47): GCRA on random keys with the
//! `top` tally off and on (the default), with deny patterns set that match nothing, and a
//! call refused by a deny entry beside one refused by its limit and one admitted. Same run,
//! same Redis; the ratios are printed under the table.

use std::time::Duration;

use redguard::Redguard;
use redguard::admin::{Admin, QuotaTtl};

use crate::Bench;
use crate::rate::{gcra_check, limiter};

const OFF: &str = "operators: gcra random keys, top tally off";
const ON: &str = "operators: gcra random keys, top tally on (default)";
const PATTERNS: &str = "operators: gcra random keys, tally on, 16 deny patterns";
const DENIED: &str = "operators: gcra one key denied by a deny entry";
const LIMITED: &str = "operators: gcra one key refused by its limit";
const ADMITTED: &str = "operators: gcra one key admitted";
const TALLY_MEMORY: &str = "operators: top tally memory after 1M distinct keys";

pub(crate) async fn cases(bench: &mut Bench, rg: &Redguard) {
    if ![OFF, ON, PATTERNS, DENIED, LIMITED, ADMITTED, TALLY_MEMORY]
        .iter()
        .any(|case| bench.selected(case, "redis"))
    {
        return;
    }
    let untallied = Redguard::redis(bench.url())
        .top_tally(false)
        .connect()
        .await
        .expect("a second handle on the bench's Redis");
    for (case, handle) in [(OFF, &untallied), (ON, rg)] {
        let built = limiter(redguard::rate::Algorithm::Gcra, 0).on(handle);
        bench
            .run(case, "redis", None, None, &[], move |i| {
                gcra_check(&built, i)
            })
            .await;
    }
    // The scope must hold a rate-limit key for a deny entry to be taken: one that stays (the
    // random keys' states drain within microseconds).
    redguard::limiter("anchor")
        .scope("bench")
        .rate("1/h")
        .on(rg)
        .decide()
        .await
        .expect("a check of the scope");
    // Prefixes no bench key starts with: walked by every call, matching none.
    let admin = Admin::new(rg.clone());
    let day = QuotaTtl::For(Duration::from_secs(86_400));
    for n in 0..16 {
        admin
            .deny_add("bench", &format!("nobody-{n}:*"), None, day)
            .await
            .expect("a deny pattern");
    }
    let built = limiter(redguard::rate::Algorithm::Gcra, 0).on(rg);
    bench
        .run(PATTERNS, "redis", None, None, &[], move |i| {
            gcra_check(&built, i)
        })
        .await;
    for n in 0..16 {
        admin
            .deny_remove("bench", &format!("nobody-{n}:*"))
            .await
            .expect("removing a deny pattern");
    }
    // One key denied by an exact entry, one refused by its limit (1/h), one admitted: what a
    // refusal costs either way, against a call that goes through.
    admin
        .deny_add("bench", "r:denied", Some("bench"), day)
        .await
        .expect("a deny entry");
    for (case, key, rate) in [
        (DENIED, "r:denied", "1000000/s"),
        (LIMITED, "r:limited", "1/h"),
        (ADMITTED, "r:admitted", "1000000/s"),
    ] {
        let rg = rg.clone();
        bench
            .run(case, "redis", None, None, &[], move |_| {
                let limiter = redguard::limiter(key).scope("bench").rate(rate).on(&rg);
                async move {
                    // Refused either way: an `Err` (denied) or a decision that does not allow.
                    let _ = limiter.decide().await;
                }
            })
            .await;
    }
    if bench.selected(TALLY_MEMORY, "redis") {
        tally_memory(bench, rg).await;
    }
    bench.compare(ON, "redis", OFF);
    bench.compare(PATTERNS, "redis", OFF);
    bench.compare(DENIED, "redis", LIMITED);
    bench.compare(DENIED, "redis", ADMITTED);
}

/// The `top` tally's keys in the store after one scope decided 1,000,000 distinct keys (64
/// in flight): members and `MEMORY USAGE` of each minute's sorted set, printed.
async fn tally_memory(bench: &Bench, rg: &Redguard) {
    const KEYS: u32 = 1_000_000;
    const TASKS: u32 = 64;
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let rg = rg.clone();
        tasks.spawn(async move {
            for i in (t..KEYS).step_by(TASKS as usize) {
                let _ = redguard::limiter(format!("id:{i:07}"))
                    .scope("bench-top")
                    .rate("10/s")
                    .on(&rg)
                    .decide()
                    .await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    // The tally's last second, flushed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let client = redis::Client::open(bench.url()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("redguard:rate:{bench-top}:top:*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    let (mut members, mut bytes) = (0u64, 0u64);
    for key in &keys {
        let n: u64 = redis::cmd("ZCARD")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("ZCARD");
        let b: u64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("MEMORY USAGE");
        members += n;
        bytes += b;
    }
    println!(
        "{TALLY_MEMORY}: {} sets (minutes x outcomes), {members} members, {bytes} bytes; \
         at most {} per set",
        keys.len(),
        redguard::rate::TOP_MAX_MEMBERS
    );
}
