//! Group commit of GCRA checks on one connection (the guide, *Coalesced checks*): while two
//! coalesced calls are in flight, further checks queue and go out together when a call
//! returns. What that must not change for a caller: a check whose caller gave up before it was
//! sent is not charged, and a queue whose driving callers were all dropped is still sent.

use std::time::Duration;

use redguard::{Redguard, rate::Limiter, rate::Rate};
use redguard_tests::RedisServer;
use redguard_tests::proxy::{Fault, Proxy};

const BURST: u64 = 5;

fn limiter(rg: &Redguard, key: &str) -> Limiter {
    rg.limiter(redguard::key("coalesce:{k}").part("k", &key))
        .rate(Rate::per_second(1))
        .burst(BURST)
}

/// Calls charged to `key`, asked on a connection of its own (not through the queue). A peek
/// reports what a check would leave: `BURST - 1` on an untouched key.
async fn charged(server: &RedisServer, key: &str) -> u64 {
    let direct = redguard_tests::connect(server).await;
    BURST - 1 - limiter(&direct, key).peek().await.unwrap().remaining
}

/// Two callers' checks hang on Redis's replies; a third caller queues behind them and gives
/// up, a fourth queues and waits. Then the first two callers are dropped too, with their calls
/// still unanswered. The fourth check must still go out (the dropped slots hand the queue to a
/// task) and be answered; the third must never reach Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_check_whose_caller_gave_up_is_not_sent_and_a_dropped_driver_hands_on_the_queue() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let rg = Redguard::redis(proxy.url())
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    // Scripts loaded and the connection up before the replies are held.
    limiter(&rg, "warm").check().await.unwrap();

    proxy.set(Fault::HalfOpen);
    let in_flight: Vec<_> = ["a", "b"]
        .map(|key| {
            let limiter = limiter(&rg, key);
            tokio::spawn(async move { limiter.check().await })
        })
        .into();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let gave_up =
        tokio::time::timeout(Duration::from_millis(200), limiter(&rg, "gave-up").check()).await;
    assert!(
        gave_up.is_err(),
        "a third check was answered while two calls hung: it did not queue ({gave_up:?})"
    );
    let waiting = {
        let limiter = limiter(&rg, "waits");
        tokio::spawn(async move { limiter.check().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    for task in &in_flight {
        task.abort();
    }
    for task in in_flight {
        assert!(task.await.unwrap_err().is_cancelled());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.set(Fault::Pass);

    let decision = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the queued check was never answered after its driving callers were dropped")
        .unwrap()
        .unwrap();
    assert!(
        decision.allowed && decision.remaining == BURST - 1,
        "the queued check was not decided by Redis: {decision:?}"
    );
    assert_eq!(
        charged(&server, "gave-up").await,
        0,
        "a check whose caller gave up before it was sent was charged"
    );
    // The dropped callers' calls had reached Redis: charged, once each.
    for key in ["a", "b", "waits"] {
        assert_eq!(charged(&server, key).await, 1, "key {key}");
    }
}

/// Issue 25 (suspected, confirmed): a coalesced call carries up to 128 checks, and when it
/// failed every one of them was admitted uncounted under fail-open (the rate limits'
/// default) — one transient error, 128 free calls. Here every call deciding more than one
/// key fails (an error reply injected into `rate_gcra.lua`), calls of one key pass, and
/// replies are slowed so that checks queue. Each check must still be counted: a failed
/// batch's checks are each sent once more alone, within their own time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_coalesced_call_does_not_admit_its_checks_uncounted() {
    const CHECKS: u64 = 120;
    const BIG_BURST: u64 = 1_000;
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let rg = Redguard::redis(proxy.url())
        .timeout(Duration::from_secs(10))
        .script_transform(|source| {
            // rate_gcra.lua's first line: the injection must reach that script, whatever
            // its keys (a test that injects nothing fails below, on `errorstats`).
            if source.contains("-- GCRA checks of single limits without a penalty") {
                // Three values per check after the mode.
                format!(
                    "if (#ARGV - 1) / 3 > 1 then return redis.error_reply('INJECTED batch failure') end\n{source}"
                )
            } else {
                source.to_owned()
            }
        })
        .connect()
        .await
        .unwrap();
    let on = |rg: &Redguard| {
        redguard::limiter("batch")
            .on(rg)
            .rate(Rate::per_hour(1))
            .burst(BIG_BURST)
    };
    on(&rg).check().await.unwrap();
    proxy.set(Fault::Latency(Duration::from_millis(30)));
    let calls: Vec<_> = (0..CHECKS - 1)
        .map(|_| {
            let limiter = on(&rg);
            tokio::spawn(async move { limiter.check().await })
        })
        .collect();
    for call in calls {
        assert!(call.await.unwrap().unwrap().allowed);
    }
    proxy.set(Fault::Pass);
    let mut direct = server.connection();
    let errors: String = redis::cmd("INFO")
        .arg("errorstats")
        .query(&mut direct)
        .unwrap();
    assert!(
        errors.contains("errorstat_INJECTED"),
        "no coalesced call was made: the test did not run ({errors})"
    );
    let peeked = on(&redguard_tests::connect(&server).await)
        .peek()
        .await
        .unwrap();
    let charged = BIG_BURST - 1 - peeked.remaining;
    assert_eq!(
        charged,
        CHECKS,
        "{} of {CHECKS} checks were admitted uncounted",
        CHECKS - charged
    );
}
