//! Managed services disable or rename commands (the guide's "Supported servers"): the guards need
//! none of the administrative ones, and a disabled `PSUBSCRIBE` degrades to polling, counted.
//! Each server here has the commands removed with `rename-command <name> ""`.

use std::time::Duration;

use redguard::{
    Error, Redguard, handle::FailMode, key::GuardKind, key::KeyBuilder, rate::Algorithm,
};
use redguard_tests::RedisServer;

/// What managed services commonly disable, none of which redguard sends.
const ADMINISTRATIVE: &[&str] = &[
    "CONFIG",
    "KEYS",
    "DEBUG",
    "FLUSHALL",
    "FLUSHDB",
    "SHUTDOWN",
    "MONITOR",
    "SAVE",
    "BGSAVE",
    "REPLICAOF",
    "SLAVEOF",
    "INFO",
    "CLIENT",
];

fn without(commands: &[&str]) -> RedisServer {
    let args: Vec<&str> = commands
        .iter()
        .flat_map(|command| ["--rename-command", command, ""])
        .collect();
    RedisServer::start_with(&args)
}

async fn connect(server: &RedisServer) -> Redguard {
    // Rate limits fail closed, so that a refused command is an error, not an admission.
    Redguard::redis(server.url())
        .fail_mode(GuardKind::RateLimit, FailMode::Closed)
        .connect()
        .await
        .expect("connect without the administrative commands")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_guard_works_without_the_administrative_commands() {
    let server = without(ADMINISTRATIVE);
    let rg = connect(&server).await;

    let token = rg
        .tokens()
        .issue("off", Duration::from_secs(60))
        .await
        .unwrap();
    rg.tokens().consume("off", &token).await.unwrap();

    for _ in 0..2 {
        let key = KeyBuilder::new().part("id", &1u64).finish().unwrap();
        let value = rg
            .scope(
                redguard::idempotency(key)
                    .scope("off")
                    .run(async { Ok::<_, Error>(5) }),
            )
            .await
            .unwrap();
        assert_eq!(value, 5);
    }

    rg.lock("off:lock")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    rg.lock("off:fair")
        .fair()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    rg.lock("off:sem")
        .permits(2)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    rg.lock("off:rw")
        .read()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    rg.lock("off:rw")
        .write()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    for algorithm in [
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        let limiter = redguard::limiter(
            redguard::key("off:rate:{algorithm}").part("algorithm", algorithm.as_str()),
        )
        .rate("2/s")
        .algorithm(algorithm)
        .on(&rg);
        assert!(limiter.decide().await.unwrap().allowed, "{algorithm:?}");
        assert!(limiter.decide().await.unwrap().allowed, "{algorithm:?}");
        assert!(!limiter.decide().await.unwrap().allowed, "{algorithm:?}");
    }
    server.assert_every_key_has_ttl();
}

/// With `PSUBSCRIBE` disabled the release subscription is refused: counted as an ACL's
/// refusal is, and waiters get the lock by polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_psubscribe_is_counted_and_waiters_poll() {
    redguard_tests::metrics::install();
    let refused =
        || redguard_tests::metrics::counter("redguard_lock_subscription_refused_total", &[]);
    let before = refused();
    let server = without(&["PSUBSCRIBE"]);
    let rg = connect(&server).await;
    let held = rg.lock("off:notify").acquire().await.unwrap();
    let waiter = {
        let rg = rg.clone();
        tokio::spawn(async move {
            rg.lock("off:notify")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
                .map(drop)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release().await.unwrap();
    waiter
        .await
        .unwrap()
        .expect("a polling waiter gets the lock");
    assert!(
        refused() > before,
        "the disabled PSUBSCRIBE was not counted"
    );
}

/// The commands the guide says are not needed ("None of `CONFIG`, … is needed") are among
/// those the tests here remove.
#[test]
fn the_guide_names_only_commands_removed_here() {
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../runtime/docs/servers.md"
    ))
    .expect("read runtime/docs/servers.md")
    .replace('\n', " ");
    let (_, after) = guide
        .split_once("None of ")
        .expect("the guide lists the commands redguard does not need");
    let (list, _) = after.split_once(" is needed").expect("… is needed");
    let named: Vec<&str> = list.split('`').skip(1).step_by(2).collect();
    assert!(named.len() >= 5, "{named:?}");
    for command in named {
        assert!(
            ADMINISTRATIVE.contains(&command),
            "the guide says {command} is not needed, but no test removes it"
        );
    }
}
