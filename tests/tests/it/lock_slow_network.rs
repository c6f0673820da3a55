//! Locks over a slow network (the harness's proxy adding latency in front of Redis).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redguard::{Error, Redguard};
use redguard_tests::RedisServer;
use redguard_tests::proxy::{Fault, Proxy};

/// With a call timeout longer than the lease, an acquisition can be answered after its lease
/// (counted from when it was sent) ran out: by then the key may be someone else's. Such a
/// lock must not be handed to the caller as held: its body must not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_answered_after_its_lease_is_not_held() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let lease = Duration::from_secs(1);
    let slow = Redguard::redis(proxy.url())
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let direct = redguard_tests::connect(&server).await;
    // Each way: the script runs 1.2 s after the call, the key expires 1 s later, the reply
    // arrives 0.2 s after that.
    proxy.set(Fault::Latency(Duration::from_millis(1200)));
    let entered: Arc<Mutex<Option<Instant>>> = Arc::default();
    let slow_call = {
        let entered = Arc::clone(&entered);
        tokio::spawn(async move {
            slow.lock("k")
                .lease(lease)
                .run(async move {
                    *entered.lock().unwrap() = Some(Instant::now());
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, Error>(())
                })
                .await
        })
    };
    // Another instance, close to Redis, takes the key as soon as the slow one's expires.
    let started = Instant::now();
    let mut conn = server.connection();
    while !redis::cmd("EXISTS")
        .arg("redguard:lock:{lock:k}")
        .query::<bool>(&mut conn)
        .unwrap()
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the slow acquisition never ran"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let other = loop {
        if let Some(guard) = direct.lock("k").lease(lease).try_acquire().await.unwrap() {
            break guard;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the key never freed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let other_since = Instant::now();
    let slow_result = slow_call.await.unwrap();
    other.release().await.unwrap();
    let entered = *entered.lock().unwrap();
    println!(
        "other holder from {:?}, slow holder's body entered at {:?}, returned {slow_result:?}",
        other_since - started,
        entered.map(|at| at - started)
    );
    assert!(
        entered.is_none(),
        "the slow holder's body ran {:?} after the other holder took the key",
        entered.map(|at| at.saturating_duration_since(other_since))
    );
    assert!(slow_result.is_err());
}
