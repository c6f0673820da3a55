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

/// An acquisition answered late but within its lease is held and renewed while Redis holds
/// it (issue 25, finding 6). The lease counts from when the acquisition was sent, so the
/// renewals must too: the first one was scheduled a third of a lease after the *reply*, here
/// past the guard's own deadline, and the guard reported the lock lost while Redis still held
/// it. The proxy holds the reply (the script runs at once, as on a slow return path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_answered_late_within_its_lease_is_renewed() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let lease = Duration::from_millis(1500);
    let slow = Redguard::redis(proxy.url())
        .timeout(Duration::from_secs(3))
        .connect()
        .await
        .unwrap();
    let mut conn = server.connection();
    // On a loaded machine the reply may come later than asked: try again until one came
    // within the lease with room for its renewal to reach Redis.
    for attempt in 1.. {
        let name = format!("late:{attempt}");
        proxy.set(Fault::HalfOpen);
        let sent = Instant::now();
        let acquiring = {
            let (slow, name) = (slow.clone(), name.clone());
            tokio::spawn(async move { slow.lock(name).lease(lease).acquire().await })
        };
        tokio::time::sleep_until((sent + lease * 3 / 4).into()).await;
        proxy.set(Fault::Pass);
        let guard = acquiring.await.unwrap().unwrap();
        let answered = sent.elapsed();
        if answered > lease * 7 / 8 {
            assert!(
                attempt < 5,
                "no reply came within 7/8 of the lease in 5 attempts"
            );
            drop(guard);
            continue;
        }
        let key = format!("redguard:lock:{{lock:{name}}}");
        let until = Instant::now() + lease * 2;
        while Instant::now() < until {
            let (fence, pttl): (Option<u64>, i64) = redis::pipe()
                .cmd("HGET")
                .arg(&key)
                .arg("fence")
                .cmd("PTTL")
                .arg(&key)
                .query(&mut conn)
                .unwrap();
            let at = sent.elapsed();
            assert!(
                !guard.is_lost(),
                "answered after {answered:?} of a {lease:?} lease, the guard was lost at {at:?} \
                 (Redis: fence {fence:?}, PTTL {pttl} ms; ours {})",
                guard.fence()
            );
            assert_eq!(
                fence,
                Some(guard.fence()),
                "answered after {answered:?}, Redis no longer held the lock at {at:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        guard.release().await.unwrap();
        println!("answered after {answered:?}: renewed for two leases");
        break;
    }
}
