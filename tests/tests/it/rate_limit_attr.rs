//! `#[rate_limit]` through the runtime: guarded fns on the memory store and on Redis,
//! counting how often the body actually ran.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redguard::{Error, Redguard};
use redguard_tests::RedisServer;

#[derive(Debug)]
enum ShopError {
    Guard(Error),
}

impl From<Error> for ShopError {
    fn from(err: Error) -> Self {
        ShopError::Guard(err)
    }
}

/// Whole-API limit stacked over a per-user one: decided together.
#[redguard::rate_limit(key = "api", rate = "100/min")]
#[redguard::rate_limit(key = "user:{user}", rate = "2/min", algorithm = "sliding_window")]
async fn call(user: u64, runs: &AtomicU32) -> Result<u32, ShopError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

/// Rate from configuration, cost from the request.
#[redguard::rate_limit(key = "bulk:{user}", rate = config_rate(), burst = 10, cost = items.len(), scope = "bulk")]
async fn bulk(user: u64, items: Vec<u32>) -> Result<usize, Error> {
    Ok(items.len())
}

static RATE: std::sync::Mutex<&str> = std::sync::Mutex::new("10/min");

fn config_rate() -> String {
    RATE.lock().unwrap().to_string()
}

#[redguard::rate_limit(key = "login:{ip}", rate = "10/s", burst = 2, block = "1s")]
async fn login(ip: &str) -> Result<(), Error> {
    let _ = ip;
    Ok(())
}

#[redguard::rate_limit(key = "report:{user}", rate = "10/s", burst = 1, wait = "300ms")]
async fn report(user: u64) -> Result<(), Error> {
    let _ = user;
    Ok(())
}

#[redguard::rate_limit(key = "export:{user}", rate = "1/min", wait = "300ms")]
async fn export(user: u64) -> Result<(), Error> {
    let _ = user;
    Ok(())
}

async fn wait_is_bounded(rg: Redguard) {
    rg.scope(async {
        report(1).await.unwrap();
        // Rejected with retry_after ≈ 100 ms ≤ wait: waits, then admitted.
        let started = std::time::Instant::now();
        report(1).await.unwrap();
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(80),
            "did not wait: {waited:?}"
        );
        // Never past `wait` (300 ms), with room for a loaded machine's scheduling.
        assert!(waited < Duration::from_millis(1000), "waited {waited:?}");
        // retry_after ≈ 60 s > wait: rejected at once.
        export(1).await.unwrap();
        let started = std::time::Instant::now();
        let err = export(1).await.unwrap_err();
        assert!(matches!(err, Error::RateLimited(d) if d.retry_after > Duration::from_secs(50)));
        assert!(
            started.elapsed() < Duration::from_millis(200),
            "waited for nothing"
        );
    })
    .await;
}

async fn stacked_attributes_are_all_or_nothing(rg: Redguard) {
    let runs = AtomicU32::new(0);
    rg.scope(async {
        assert_eq!(call(1, &runs).await.unwrap(), 1);
        assert_eq!(call(1, &runs).await.unwrap(), 2);
        for _ in 0..5 {
            let err = call(1, &runs).await.unwrap_err();
            let ShopError::Guard(Error::RateLimited(d)) = err else {
                panic!("{err:?}")
            };
            assert!(
                !d.allowed && d.retry_after > Duration::from_secs(50),
                "{d:?}"
            );
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "the body ran only when admitted"
        );
        // The global limit was charged for the two admitted calls only (a peek reports the
        // decision a call would get: 100 - 2 charged - 1 for the peeked call).
        let global = redguard::limiter("api")
            .scope(concat!(module_path!(), "::call"))
            .rate("100/min")
            .peek()
            .await
            .unwrap();
        assert_eq!(global.remaining, 97);
        assert_eq!(call(2, &runs).await.unwrap(), 3);
    })
    .await;
}

async fn config_rate_and_cost_expressions(rg: Redguard) {
    rg.scope(async {
        assert_eq!(bulk(1, vec![1; 6]).await.unwrap(), 6);
        let err = bulk(1, vec![1; 5]).await.unwrap_err();
        assert!(
            matches!(err, Error::RateLimited(d) if d.remaining == 4),
            "{err:?}"
        );
        assert_eq!(bulk(1, vec![1; 4]).await.unwrap(), 4);
        // A cost above the burst is an error, not a forever-denied key.
        let err = bulk(2, vec![1; 11]).await.unwrap_err();
        assert!(matches!(err, Error::InvalidLimit(_)), "{err:?}");
        // A bad configured value is an error per call, never a panic.
        *RATE.lock().unwrap() = "ten per minute";
        let err = bulk(3, vec![1]).await.unwrap_err();
        assert!(matches!(err, Error::InvalidLimit(_)), "{err:?}");
        *RATE.lock().unwrap() = "10/min";
        assert!(bulk(3, vec![1]).await.is_ok());
    })
    .await;
}

async fn block_penalty(rg: Redguard) {
    rg.scope(async {
        login("10.0.0.1").await.unwrap();
        login("10.0.0.1").await.unwrap();
        assert!(matches!(
            login("10.0.0.1").await,
            Err(Error::RateLimited(_))
        ));
        tokio::time::sleep(Duration::from_millis(150)).await;
        // Refilled by the rate, but still blocked.
        let err = login("10.0.0.1").await.unwrap_err();
        let Error::RateLimited(d) = err else {
            panic!("{err:?}")
        };
        // Blocked for the rest of the second (less scheduling noise), not the 0.1 s the rate
        // alone would ask.
        assert!(d.retry_after > Duration::from_millis(300), "{d:?}");
        login("10.0.0.2").await.unwrap();
        tokio::time::sleep(d.retry_after + Duration::from_millis(50)).await;
        login("10.0.0.1").await.unwrap();
    })
    .await;
}

async fn invalid_key_part_is_reported(rg: Redguard) {
    rg.scope(async {
        let err = login("10.0.0.1:80").await.unwrap_err();
        assert!(matches!(err, Error::InvalidKey { .. }), "{err:?}");
    })
    .await;
}

redguard_tests::conformance!(
    stacked_attributes_are_all_or_nothing,
    config_rate_and_cost_expressions,
    block_penalty,
    invalid_key_part_is_reported,
    wait_is_bounded,
);

#[tokio::test]
async fn no_installed_handle_is_an_error() {
    let err = login("10.0.0.1").await.unwrap_err();
    assert!(matches!(err, Error::NotInstalled), "{err:?}");
}

#[tokio::test]
async fn keys_are_scoped_by_fn_and_expire() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let runs = AtomicU32::new(0);
    rg.scope(call(7, &runs)).await.unwrap();
    let mut keys = server.keys();
    keys.sort();
    assert_eq!(
        keys,
        vec![
            "redguard:rate:{it::rate_limit_attr::call:api}",
            "redguard:rate:{it::rate_limit_attr::call:user:7}",
        ]
    );
    server.assert_every_key_has_ttl();
}

#[redguard::rate_limit(key = "search:{user}", rate = "2/min", local = true)]
async fn search(user: u64, runs: &AtomicU32) -> Result<(), Error> {
    let _ = user;
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// The local tier answers repeated rejections without Redis: proven by pausing Redis (a
/// call that reached it would time out and fail open, i.e. be admitted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_tier_rejects_known_exhausted_keys_without_redis() {
    let server = RedisServer::start();
    let rg = Redguard::redis(server.url())
        .timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let runs = AtomicU32::new(0);
    rg.scope(async {
        search(1, &runs).await.unwrap();
        search(1, &runs).await.unwrap();
        let err = search(1, &runs).await.unwrap_err();
        assert!(matches!(err, Error::RateLimited(_)), "{err:?}");
        server.pause();
        for _ in 0..20 {
            let started = std::time::Instant::now();
            let err = search(1, &runs).await.unwrap_err();
            let Error::RateLimited(d) = err else {
                panic!("{err:?}")
            };
            assert!(d.retry_after > Duration::from_secs(20), "{d:?}");
            assert!(
                started.elapsed() < Duration::from_millis(50),
                "went to Redis"
            );
        }
        // A key the tier knows nothing about still goes to the (paused) store: fails open.
        search(2, &runs).await.unwrap();
        server.resume();
    })
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}
