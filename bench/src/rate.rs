//! Rate limits: every algorithm on random keys (the allowed path); GCRA also through the
//! attribute and as a raw EVALSHA, and on one hot key that always admits or always rejects.

use redguard::{Redguard, key::KeyBuilder, rate::Algorithm, rate::Limiter, rate_limit};
use redis::aio::ConnectionManager;

use crate::{Bench, Ways};
use crate::{cost, raw};

/// The same check as the runtime-API GCRA case, through the attribute.
#[rate_limit(key = "r:{i}", rate = "1000000/s", burst = 1000, scope = "bench")]
async fn annotated_check(i: u64) -> redguard::Result<u64> {
    Ok(i)
}

/// The limit of the random-key cases: a million per second (the sliding log's count is at
/// most 10,000: 10,000 per second, far more than one random key sees), so every call is
/// admitted.
pub(crate) fn limiter(algorithm: Algorithm, i: u64) -> Limiter {
    let limiter = redguard::limiter(redguard::key("r:{i}").part("i", &i))
        .scope("bench")
        .rate(rate(algorithm).0)
        .algorithm(algorithm);
    if algorithm.is_window() {
        limiter
    } else {
        limiter.burst(1000)
    }
}

/// The random-key cases' rate, and its interval in ns as the script receives it.
fn rate(algorithm: Algorithm) -> (&'static str, &'static str) {
    if algorithm == Algorithm::SlidingWindow {
        ("10000/s", "100000")
    } else {
        ("1000000/s", "1000")
    }
}

/// The capacity the script receives: the burst, or a window algorithm's count.
fn burst(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::SlidingWindow => "10000",
        algorithm if algorithm.is_window() => "1000000",
        _ => "1000",
    }
}

/// `rate_check.lua` for one limit at `key` with the random-key cases' limit, as the runtime
/// sends it.
fn script_args(sha: &str, algorithm: Algorithm, key: &str) -> Vec<String> {
    raw::evalsha(
        sha,
        &[
            key,
            &format!("{key}:block"),
            &format!("{key}:quota"),
            &format!("{key}:deny"),
            PREFIXES,
            DENY_LIST,
        ],
        // Mode, then algorithm, interval (ns), period (µs), burst, cost, block.
        &[
            "0",
            algorithm.as_str(),
            rate(algorithm).1,
            "1000000",
            burst(algorithm),
            "1",
            "0",
        ],
    )
}

/// `rate_gcra.lua` (what the runtime sends for one GCRA limit without a penalty) for one
/// key, unbatched: the raw EVALSHA the GCRA rows compare with.
fn gcra_args(sha: &str, key: &str) -> Vec<String> {
    // Keys: the state, its quota override and the prefix overrides; mode, then interval
    // (ns), burst, cost.
    raw::evalsha(
        sha,
        &[
            key,
            &format!("{key}:quota"),
            &format!("{key}:deny"),
            PREFIXES,
            DENY_LIST,
        ],
        &["0", "1000", "1000", "1"],
    )
}

/// The handle's prefix-override hash, the last key the runtime sends off a Cluster (the
/// rate scripts' `quota.lua` reads it with one `HGETALL` per call).
const PREFIXES: &str = "redguard:rate:quota-prefixes";

/// The handle's pattern deny list, after the prefix overrides (`deny.lua`: one `HGETALL` per
/// call; an exact key's entry is its `:deny` companion, one `GET` per check).
const DENY_LIST: &str = "redguard:rate:deny-list";

fn key(i: impl std::fmt::Display) -> String {
    format!("redguard:rate:{{bench:r:i={i}}}")
}

/// `rate_gcra.lua`'s SHA, as the runtime loads it: after its preludes.
pub(crate) fn gcra_sha() -> String {
    raw::sha(concat!(
        include_str!("../../runtime/src/store/redis/scripts/expiry.lua"),
        include_str!("../../runtime/src/store/redis/scripts/quota.lua"),
        include_str!("../../runtime/src/store/redis/scripts/deny.lua"),
        include_str!("../../runtime/src/store/redis/scripts/rate_gcra.lua")
    ))
}

/// The GCRA runtime-API check on key `i` of a limiter built once (`limiter(Gcra, _).on(rg)`).
pub(crate) fn gcra_check(built: &Limiter, i: u64) -> impl std::future::Future<Output = ()> + use<> {
    check(built.key(KeyBuilder::new().text("r:").part("i", &i)))
}

/// The raw GCRA check on key `i`: `rate_gcra.lua` as [`gcra_args`] sends it.
pub(crate) async fn raw_gcra(conn: ConnectionManager, sha: String, i: u64) {
    let key = key(i);
    let quota = format!("{key}:quota");
    let deny = format!("{key}:deny");
    let cmd = raw::command(
        &sha,
        &[&key, &quota, &deny, PREFIXES, DENY_LIST],
        &["0", "1000", "1000", "1"],
    );
    raw::send(conn, vec![cmd]).await;
}

pub(crate) async fn check(limiter: Limiter) {
    limiter.decide().await.expect("rate check");
}

pub(crate) async fn cases(bench: &mut Bench, rg: &Redguard, memory: &Redguard) {
    // The scripts as the runtime loads them, after their preludes (same SHA).
    let sha = raw::sha(concat!(
        include_str!("../../runtime/src/store/redis/scripts/expiry.lua"),
        include_str!("../../runtime/src/store/redis/scripts/quota.lua"),
        include_str!("../../runtime/src/store/redis/scripts/deny.lua"),
        include_str!("../../runtime/src/store/redis/scripts/rescale.lua"),
        include_str!("../../runtime/src/store/redis/scripts/rate_check.lua")
    ));
    let gcra_sha = gcra_sha();
    for algorithm in Algorithm::ALL {
        let name = algorithm.as_str();
        let case = format!("rate {name} random keys");
        let args = if algorithm == Algorithm::Gcra {
            gcra_args(&gcra_sha, &key("__rand_int__"))
        } else {
            script_args(&sha, algorithm, &key("__rand_int__"))
        };
        let (base, ceiling) = bench.baselines(&[&case], &args);
        let rg2 = rg.clone();
        let api = move |i| check(limiter(algorithm, i).on(&rg2));
        if algorithm == Algorithm::Gcra {
            // GCRA's runtime-API row as the attribute runs it: a `Limiter` built once, its rate
            // parsed once, and per call only the key, built as the attribute builds it
            // (`Limiter::key`, the documented way to reuse a limit).
            let built = limiter(algorithm, 0).on(rg);
            let (built2, conn, sha) = (built.clone(), bench.conn.clone(), gcra_sha.clone());
            let rows = vec![
                ("our API", cost::op(move |i| gcra_check(&built2, i))),
                (
                    "raw script",
                    cost::op(move |i| raw_gcra(conn.clone(), sha.clone(), i)),
                ),
            ];
            cost::per_op(bench, cost::GCRA_COST_CASE, "raw script", rows).await;
            let gcra_api = move |i| gcra_check(&built, i);
            let (conn, sha) = (bench.conn.clone(), gcra_sha.clone());
            // rate-limiter-flexible's consume: one script per call too, on random keys.
            let peer = bench.run_peer(
                "peer rate-limiter-flexible consume random keys",
                "rlf-consume",
                &Ways::names(&case),
            );
            let ways = Ways {
                case: &case,
                base: &base,
                ceiling,
                peer: &peer,
            };
            ways.run(
                bench,
                |i| async move {
                    annotated_check(i).await.expect("rate check");
                },
                gcra_api,
                move |i| raw_gcra(conn.clone(), sha.clone(), i),
            )
            .await;
            hot_key(bench, rg, ceiling).await;
        } else {
            bench
                .run(&case, "redis", Some(&base), ceiling, &[], api)
                .await;
        }
        bench
            .run_memory(&case, memory, move |i| check(limiter(algorithm, i)))
            .await;
    }
}

/// GCRA on one key: a limit that always admits, and one that always rejects.
async fn hot_key(bench: &mut Bench, rg: &Redguard, ceiling: Option<f64>) {
    for (case, rate, burst) in [("allowed", "1000000/s", 1000), ("denied", "1/h", 1)] {
        let rg2 = rg.clone();
        let hot = move |_| {
            let limiter = redguard::limiter(redguard::key("hot:{case}").part("case", case))
                .scope("bench")
                .rate(rate)
                .burst(burst)
                .on(&rg2);
            check(limiter)
        };
        let name = format!("rate gcra one hot key, {case}");
        bench.run(&name, "redis", None, ceiling, &[], hot).await;
    }
}
