//! The handle itself: which task sees which handle (`scope`, `spawn`), and time on the
//! in-memory store under Tokio's paused clock.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redguard::{Error, Redguard};

async fn issue() -> redguard::Result<String> {
    redguard::tokens()
        .issue("handle", Duration::from_secs(60))
        .await
}

/// `rg.scope(redguard::spawn(fut))` spawns before the scope exists: the task has no handle,
/// and the error says so and what to write instead.
#[tokio::test]
async fn a_task_spawned_before_its_scope_is_told_what_to_write() {
    let rg = Redguard::memory();
    let err = rg
        .scope(redguard::spawn(issue()))
        .await
        .expect("the task panicked")
        .unwrap_err();
    assert!(matches!(err, Error::NotInScope { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("outside any scope") && message.contains("rg.spawn("),
        "{message}"
    );
    // A task spawned from inside a scope carries it, and `rg.spawn` carries `rg`.
    let inside = rg
        .scope(async { redguard::spawn(issue()).await })
        .await
        .expect("the task panicked");
    assert!(inside.is_ok(), "{inside:?}");
    assert!(rg.spawn(issue()).await.expect("the task panicked").is_ok());
    // A plain `tokio::spawn` inside a scope keeps the message that names `redguard::spawn`.
    let plain = rg
        .scope(async { tokio::spawn(issue()).await })
        .await
        .expect("the task panicked")
        .unwrap_err();
    assert!(matches!(plain, Error::NotInScope { .. }), "{plain:?}");
    assert!(plain.to_string().contains("redguard::spawn"), "{plain}");
}

/// `rg.spawn` carries this handle, not the one scoped where it is called.
#[tokio::test]
async fn rg_spawn_carries_its_own_handle() {
    let outer = Redguard::memory_builder()
        .prefix("outer")
        .connect()
        .await
        .unwrap();
    let inner = Redguard::memory_builder()
        .prefix("inner")
        .connect()
        .await
        .unwrap();
    let seen = outer
        .scope(inner.spawn(async { Redguard::current().map(|rg| rg.prefix().to_owned()) }))
        .await
        .expect("the task panicked")
        .unwrap();
    assert_eq!(seen, "inner");
}

static CREATED: AtomicU32 = AtomicU32::new(0);

#[redguard::idempotent(key = "{id}", expire = 60)]
async fn create(id: u32) -> Result<u32, Error> {
    CREATED.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[redguard::dist_lock(scope = "jobs", key = "{job}", hold_at_least = "30s")]
async fn run_job(job: u32) -> Result<(), Error> {
    Ok(())
}

#[redguard::dist_lock(scope = "jobs", key = "{job}", skip_if_held)]
async fn run_job_unless_held(job: u32) -> Result<(), Error> {
    Ok(())
}

#[redguard::dist_lock(scope = "jobs", key = "{job}", wait = "50s")]
async fn run_job_waiting(job: u32) -> Result<(), Error> {
    Ok(())
}

#[redguard::dist_lock(scope = "jobs", key = "{job}", lease = "3s", skip_if_held)]
async fn hold_job(job: u32, during: Duration) -> Result<(), Error> {
    tokio::time::sleep(during).await;
    Ok(())
}

#[redguard::rate_limit(key = "{user}", rate = "2/min", burst = 2)]
async fn limited(user: u32) -> Result<(), Error> {
    Ok(())
}

/// The in-memory store's default clock follows Tokio's: with time paused, an idempotency
/// record's expiry, a lock's lease and a rate window move only as `tokio::time::advance`
/// (or the runtime's auto-advance while every task sleeps) moves them, so a test of guarded
/// code runs a minute of store time in no time, exactly.
#[tokio::test(start_paused = true)]
async fn paused_time_drives_expiry_leases_and_windows_on_memory() {
    let rg = Redguard::memory();
    rg.scope(async {
        // An idempotency record lives `expire`, of paused time.
        assert_eq!(create(7).await.unwrap(), 7);
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(create(7).await.unwrap(), 7);
        assert_eq!(CREATED.load(Ordering::SeqCst), 1, "replayed within expire");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(create(7).await.unwrap(), 7);
        assert_eq!(CREATED.load(Ordering::SeqCst), 2, "ran again after expire");

        // A lock kept taken for `hold_at_least` frees itself after it, on paused time.
        run_job(1).await.unwrap();
        tokio::time::advance(Duration::from_secs(29)).await;
        let held = run_job_unless_held(1).await.unwrap_err();
        assert!(matches!(held, Error::LockHeld { .. }), "{held:?}");
        tokio::time::advance(Duration::from_secs(2)).await;
        run_job_unless_held(1).await.unwrap();

        // A waiter gets it when the lease ends: `wait` runs on the same time.
        run_job(2).await.unwrap();
        let started = tokio::time::Instant::now();
        run_job_waiting(2).await.unwrap();
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(30) && waited < Duration::from_secs(50),
            "waited {waited:?} of paused time for a 30 s hold"
        );

        // A holder's renewals follow the same time: a 3 s lease held for ten minutes of
        // paused time is never lost, and kept by no one once the holder returns.
        let holder = redguard::spawn(hold_job(3, Duration::from_secs(600)));
        tokio::time::sleep(Duration::from_secs(1)).await;
        for _ in 0..20 {
            let held = run_job_unless_held(3).await.unwrap_err();
            assert!(matches!(held, Error::LockHeld { .. }), "{held:?}");
            tokio::time::sleep(Duration::from_secs(25)).await;
        }
        holder.await.expect("the holder panicked").unwrap();
        run_job_unless_held(3).await.unwrap();

        // A rate window: two per minute, the third refused until a slot is back.
        limited(1).await.unwrap();
        limited(1).await.unwrap();
        let refused = limited(1).await.unwrap_err();
        assert!(matches!(refused, Error::RateLimited(_)), "{refused:?}");
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(matches!(limited(1).await, Err(Error::RateLimited(_))));
        tokio::time::advance(Duration::from_secs(2)).await;
        limited(1).await.unwrap();
    })
    .await;
}

/// Issue 45: a connection refused names the address tried (never the password in its URL).
#[tokio::test]
async fn a_refused_connection_names_its_address() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let err = Redguard::redis(format!("redis://user:hunter2secret@127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend(_)), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    assert!(!message.contains("hunter2secret"), "{message}");
    assert!(!format!("{err:?}").contains("hunter2secret"), "{err:?}");
}
