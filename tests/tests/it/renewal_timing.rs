//! Renewal timing: a lock whose acquisition is answered late, at a grid of points over and
//! past its lease, is renewed exactly when Redis still holds it.
//!
//! The lease (and so the guard's own deadline) counts from when the acquisition was sent.
//! Two ways of being late: the proxy holds the *reply* (the script ran at once, Redis holds
//! the key until about send + lease), or `CLIENT PAUSE` holds the *request* (the script runs
//! late, Redis holds the key longer than the guard may assume). For each point, classified by
//! when the reply actually came (a loaded machine delivers it later than asked):
//!
//! - answered within the lease (less [`MARGIN`]): the guard is renewed — live at every
//!   sample over two leases, and Redis holds the key with its fence at every sample;
//! - answered after the lease (plus [`MARGIN`]): lost from the start (`run` never enters the
//!   body and returns `LockLost`), and nothing renews the key;
//! - in between: either, but at the end a live guard ⇔ Redis holds its key.
//!
//! A body that blocks its thread is checked against the guide's promise: under `run` the renewal
//! starts when polled, so a body blocked past the lease loses the lock (another owner may
//! take it meanwhile); the same wait in `spawn_blocking` keeps it.
//!
//! `REDGUARD_RENEWAL_POINTS=<n>` runs `n` points evenly over 0 to 1.5 leases instead of the
//! short grid (TESTING.md, *Renewal timing*).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redguard::{Error, Redguard};
use redguard_tests::RedisServer;
use redguard_tests::proxy::{Fault, Proxy};

const LEASE: Duration = Duration::from_secs(2);
/// How close to the end of the lease a reply may go either way: the renewal it triggers must
/// still be sent, and reach Redis, before the lease ends on a machine busy with other tests.
const MARGIN: Duration = Duration::from_millis(400);
/// How often the observer samples the guard and Redis.
const SAMPLE: Duration = Duration::from_millis(100);
const KEY: &str = "redguard:lock:{lock:timing}";

/// The delays, as fractions of the lease.
fn grid() -> Vec<f64> {
    match std::env::var("REDGUARD_RENEWAL_POINTS") {
        Ok(points) => {
            let points: u32 = points
                .parse()
                .expect("REDGUARD_RENEWAL_POINTS is a number of points");
            (0..points)
                .map(|i| 1.5 * f64::from(i) / f64::from(points))
                .collect()
        }
        // Around a third of the lease (where the first renewal falls due), past two thirds
        // (where renewals counted from the reply came after the lease: finding 6), and
        // after the lease.
        Err(_) => vec![0.0, 0.3, 0.55, 0.7, 0.8, 1.25, 1.45],
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Late {
    /// The proxy holds the reply: the script runs at once.
    Reply,
    /// `CLIENT PAUSE` holds the request: the script runs late.
    Request,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Within,
    Boundary,
    After,
}

impl Class {
    fn of(answered: Duration) -> Class {
        if answered + MARGIN <= LEASE {
            Class::Within
        } else if answered >= LEASE + MARGIN {
            Class::After
        } else {
            Class::Boundary
        }
    }
}

/// A Redis of its own (a paused one holds up every client), behind a proxy, and a handle
/// through the proxy with a call timeout longer than any delay of the grid.
struct Point {
    server: RedisServer,
    proxy: Proxy,
    rg: Redguard,
}

impl Point {
    async fn start() -> Point {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let rg = Redguard::redis(proxy.url())
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap();
        Point { server, proxy, rg }
    }

    /// Makes what is sent next late by `delay` (`late`), and returns when it was sent.
    fn hold(&self, late: Late, delay: Duration) -> Instant {
        if !delay.is_zero() {
            match late {
                Late::Reply => self.proxy.set(Fault::HalfOpen),
                Late::Request => {
                    let _: () = redis::cmd("CLIENT")
                        .arg("PAUSE")
                        .arg(delay.as_millis().to_string())
                        .arg("ALL")
                        .query(&mut self.server.connection())
                        .unwrap();
                }
            }
        }
        Instant::now()
    }

    /// Ends the hold on the reply at `sent + delay` (a paused Redis resumes by itself).
    async fn release_hold(&self, late: Late, sent: Instant, delay: Duration) {
        if late == Late::Reply && !delay.is_zero() {
            tokio::time::sleep_until((sent + delay).into()).await;
            self.proxy.set(Fault::Pass);
        }
    }
}

/// Whether Redis holds the lock with `fence` (its acquisition's).
fn holds(conn: &mut redis::Connection, fence: u64) -> bool {
    let stored: Option<u64> = redis::cmd("HGET")
        .arg(KEY)
        .arg("fence")
        .query(conn)
        .unwrap();
    stored == Some(fence)
}

/// One point for a guard from `acquire()`: what was seen, or the violation.
async fn acquired(late: Late, fraction: f64) -> Result<String, String> {
    let point = Point::start().await;
    let delay = LEASE.mul_f64(fraction);
    let sent = point.hold(late, delay);
    let acquiring = {
        let rg = point.rg.clone();
        tokio::spawn(async move { rg.lock("timing").lease(LEASE).acquire().await })
    };
    point.release_hold(late, sent, delay).await;
    let guard = acquiring
        .await
        .unwrap()
        .map_err(|err| format!("the acquisition failed: {err:?}"))?;
    let answered = sent.elapsed();
    let class = Class::of(answered);
    let at = format!("{late:?} late {delay:?}, answered after {answered:?} ({class:?})");
    if class == Class::After && !guard.is_lost() {
        return Err(format!("{at}: answered after its lease, yet held"));
    }
    let mut conn = point.server.connection();
    let until = sent + delay + LEASE * 2;
    while Instant::now() < until {
        let live = !guard.is_lost();
        let held = holds(&mut conn, guard.fence());
        if class == Class::Within && !(live && held) {
            return Err(format!(
                "{at}: at {:?} the guard was {}, Redis {} it",
                sent.elapsed(),
                if live { "live" } else { "lost" },
                if held { "held" } else { "no longer held" },
            ));
        }
        tokio::time::sleep(SAMPLE).await;
    }
    let (live, held) = (!guard.is_lost(), holds(&mut conn, guard.fence()));
    if live != held {
        return Err(format!(
            "{at}: at the end the guard was {}, but Redis {} it",
            if live { "live" } else { "lost" },
            if held { "held" } else { "no longer held" },
        ));
    }
    Ok(format!("{at}: {}", if live { "renewed" } else { "lost" }))
}

/// One point for a section under `run`, whose body awaits for two leases.
async fn section(late: Late, fraction: f64) -> Result<String, String> {
    let point = Point::start().await;
    let delay = LEASE.mul_f64(fraction);
    let entered: Arc<Mutex<Option<(Instant, u64)>>> = Arc::default();
    // Set by the body as it returns: from then on `run` releases the key, so a sample that
    // finds it gone says nothing about the renewal.
    let left = Arc::new(AtomicBool::new(false));
    let sent = point.hold(late, delay);
    let running = {
        let (rg, entered, left) = (point.rg.clone(), Arc::clone(&entered), Arc::clone(&left));
        let until = sent + delay + LEASE * 2;
        tokio::spawn(async move {
            rg.lock("timing")
                .lease(LEASE)
                .run(async move {
                    let fence = redguard::lock::fence().expect("a fence inside run");
                    *entered.lock().unwrap() = Some((Instant::now(), fence));
                    tokio::time::sleep_until(until.into()).await;
                    left.store(true, Ordering::SeqCst);
                    Ok::<_, Error>(())
                })
                .await
        })
    };
    point.release_hold(late, sent, delay).await;
    let mut conn = point.server.connection();
    let mut unheld = None;
    while !running.is_finished() {
        let inside = *entered.lock().unwrap();
        // Read after Redis answered: a body still inside then had not yet let `run` release
        // the key, so a key gone meanwhile was lost, not released.
        if let Some((_, fence)) = inside
            && unheld.is_none()
            && !holds(&mut conn, fence)
            && !left.load(Ordering::SeqCst)
        {
            unheld = Some(sent.elapsed());
        }
        tokio::time::sleep(SAMPLE / 2).await;
    }
    let result = running.await.unwrap();
    let inside = *entered.lock().unwrap();
    let answered = inside.map_or_else(|| sent.elapsed(), |(at, _)| at - sent);
    let class = Class::of(answered);
    let at = format!("{late:?} late {delay:?}, answered after {answered:?} ({class:?})");
    match (class, inside, &result) {
        (Class::After, Some(_), _) => Err(format!("{at}: the body ran")),
        (Class::After, None, Err(Error::LockLost { .. })) => Ok(format!("{at}: not entered")),
        (Class::Within, _, Err(err)) => Err(format!("{at}: {err:?}")),
        (_, _, Ok(())) if unheld.is_some() => Err(format!(
            "{at}: the section returned Ok, but Redis no longer held it at {unheld:?}"
        )),
        (_, Some(_), Ok(())) => Ok(format!("{at}: renewed")),
        (Class::Boundary, _, Err(Error::LockLost { .. })) => Ok(format!("{at}: lost")),
        (_, _, other) => Err(format!("{at}: unexpected {other:?}")),
    }
}

/// Runs `point` for every delay of the grid (a batch at a time, each point on its own Redis)
/// and fails with every violation.
async fn over_the_grid<F, Fut>(late: Late, point: F)
where
    F: Fn(Late, f64) -> Fut,
    Fut: Future<Output = Result<String, String>>,
{
    let mut violations = Vec::new();
    for batch in grid().chunks(8) {
        for seen in join_all(batch.iter().map(|&fraction| point(late, fraction))).await {
            match seen {
                Ok(seen) => println!("{seen}"),
                Err(violation) => violations.push(violation),
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_answered_late_is_renewed_exactly_while_redis_holds_it() {
    over_the_grid(Late::Reply, acquired).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_whose_request_ran_late_is_renewed_exactly_while_redis_holds_it() {
    over_the_grid(Late::Request, acquired).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_section_answered_late_is_renewed_exactly_while_redis_holds_it() {
    over_the_grid(Late::Reply, section).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_section_whose_request_ran_late_is_renewed_exactly_while_redis_holds_it() {
    over_the_grid(Late::Request, section).await;
}

/// the guide: a section's renewal starts when polled, so a body that blocks its thread past the
/// lease finds the lock lost — Redis dropped the key meanwhile, free for another owner — while
/// the same wait in `spawn_blocking` keeps the lock renewed throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_blocking_its_thread_loses_the_lock_and_spawn_blocking_keeps_it() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let block = LEASE * 3 / 2;

    let fence: Arc<Mutex<Option<u64>>> = Arc::default();
    let started = Instant::now();
    let kept = {
        let (rg, fence) = (rg.clone(), Arc::clone(&fence));
        tokio::spawn(async move {
            rg.lock("blocking:kept")
                .lease(LEASE)
                .run(async move {
                    *fence.lock().unwrap() = redguard::lock::fence();
                    tokio::task::spawn_blocking(move || std::thread::sleep(block))
                        .await
                        .unwrap();
                    Ok::<_, Error>(())
                })
                .await
        })
    };
    let mut conn = server.connection();
    let key = "redguard:lock:{lock:blocking:kept}";
    while !kept.is_finished() {
        if let Some(fence) = *fence.lock().unwrap() {
            let stored: Option<u64> = redis::cmd("HGET")
                .arg(key)
                .arg("fence")
                .query(&mut conn)
                .unwrap();
            // Judged once Redis answered: the body blocks until `started + block` at the
            // earliest, and only then may `run` release the key.
            let inside = started.elapsed() < block;
            assert!(
                !inside || stored == Some(fence),
                "under spawn_blocking, Redis no longer held the lock at {:?}",
                started.elapsed()
            );
        }
        tokio::time::sleep(SAMPLE).await;
    }
    kept.await.unwrap().unwrap();

    let started = Instant::now();
    let blocked = {
        let rg = rg.clone();
        tokio::spawn(async move {
            rg.lock("blocking:lost")
                .lease(LEASE)
                .run(async move {
                    std::thread::sleep(block);
                    Ok::<_, Error>(())
                })
                .await
        })
    };
    // Waited for and checked without the runtime: a worker blocked in the body can stall its
    // timers and its I/O for every task (the other worker may not be the one driving them).
    std::thread::sleep(LEASE + MARGIN);
    assert!(
        !blocked.is_finished(),
        "the blocked section ended before its body"
    );
    let exists: bool = redis::cmd("EXISTS")
        .arg("redguard:lock:{lock:blocking:lost}")
        .query(&mut conn)
        .unwrap();
    assert!(
        !exists,
        "the lock of a body blocked past its lease was still held at {:?}",
        started.elapsed()
    );
    let result = blocked.await.unwrap();
    assert!(
        matches!(result, Err(Error::LockLost { .. })),
        "a body blocked past its lease returned {result:?}"
    );
}

/// The idempotency record's `expire`: renewed every third of it, like a lock's lease.
const EXPIRE: Duration = LEASE;
const RECORD: &str = "redguard:idem:{timing:timing}";

fn record_key() -> redguard::key::KeyBody {
    redguard::key::KeyBuilder::new()
        .text("timing")
        .finish()
        .unwrap()
}

fn status(conn: &mut redis::Connection) -> Option<String> {
    redis::cmd("HGET")
        .arg(RECORD)
        .arg("status")
        .query(conn)
        .unwrap()
}

/// One point for an idempotency record whose begin is late, with a body that awaits for two
/// expires while a twin retries every sample: a record begun within its expire stays
/// PROCESSING throughout, and the intent never runs twice.
async fn record(late: Late, fraction: f64) -> Result<String, String> {
    let point = Point::start().await;
    let twin = redguard_tests::connect(&point.server).await;
    let delay = EXPIRE.mul_f64(fraction);
    let runs = Arc::new(AtomicU32::new(0));
    let entered: Arc<Mutex<Option<Instant>>> = Arc::default();
    let sent = point.hold(late, delay);
    let until = sent + delay + EXPIRE * 2;
    let running = {
        let (rg, runs, entered) = (point.rg.clone(), runs.clone(), Arc::clone(&entered));
        tokio::spawn(
            rg.clone().scope(
                redguard::idempotency(record_key())
                    .scope("timing")
                    .expire(EXPIRE)
                    .run(async move {
                        *entered.lock().unwrap() = Some(Instant::now());
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep_until(until.into()).await;
                        Ok::<_, Error>(1)
                    }),
            ),
        )
    };
    point.release_hold(late, sent, delay).await;
    let mut conn = point.server.connection();
    let mut lapsed = None;
    while !running.is_finished() {
        // Sampled while the body surely runs: at its end the record turns SUCCESS (and a
        // retry replays) before the task is seen finished.
        let body_runs = Instant::now() + SAMPLE * 3 < until;
        if body_runs && entered.lock().unwrap().is_some() {
            if lapsed.is_none() && status(&mut conn).as_deref() != Some("P") {
                lapsed = Some(sent.elapsed());
            }
            let runs = runs.clone();
            let retried = twin
                .scope(
                    redguard::idempotency(record_key())
                        .scope("timing")
                        .expire(EXPIRE)
                        .run(async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, Error>(2)
                        }),
                )
                .await;
            if !matches!(retried, Err(Error::InProgress)) && lapsed.is_none() {
                lapsed = Some(sent.elapsed());
            }
        }
        tokio::time::sleep(SAMPLE).await;
    }
    let result = running.await.unwrap();
    let answered = entered
        .lock()
        .unwrap()
        .map_or_else(|| sent.elapsed(), |at| at - sent);
    let class = Class::of(answered);
    let at = format!("{late:?} late {delay:?}, begin answered after {answered:?} ({class:?})");
    let runs = runs.load(Ordering::SeqCst);
    if runs > 1 {
        return Err(format!(
            "{at}: the intent ran {runs} times (the record lapsed at {lapsed:?})"
        ));
    }
    match (class, lapsed, result) {
        (Class::Within, Some(lapsed), _) => Err(format!(
            "{at}: the record was no longer PROCESSING at {lapsed:?} while the body ran"
        )),
        (Class::Within, None, Err(err)) => Err(format!("{at}: {err:?}")),
        (_, _, result) => Ok(format!("{at}: ran {runs} time(s), {result:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_begun_late_is_kept_exactly_while_its_body_runs() {
    over_the_grid(Late::Reply, record).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_whose_begin_ran_late_is_kept_exactly_while_its_body_runs() {
    over_the_grid(Late::Request, record).await;
}

/// the guide: "a slow body is never run twice" — also one that blocks its thread: the record
/// must stay PROCESSING past its first `expire` while the body is blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_stays_processing_while_its_body_blocks_its_thread() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let block = EXPIRE * 3 / 2;
    let running = tokio::spawn(
        rg.clone().scope(
            redguard::idempotency(record_key())
                .scope("timing")
                .expire(EXPIRE)
                .run(async move {
                    std::thread::sleep(block);
                    Ok::<_, Error>(1)
                }),
        ),
    );
    // Checked without the runtime, which the blocked worker may stall.
    std::thread::sleep(EXPIRE + MARGIN);
    let mut conn = server.connection();
    assert_eq!(
        status(&mut conn).as_deref(),
        Some("P"),
        "the record of a body blocking its thread lapsed before the body ended"
    );
    assert_eq!(running.await.unwrap().unwrap(), 1);
    assert_eq!(status(&mut conn).as_deref(), Some("S"));
}

fn numbered_key(n: usize) -> redguard::key::KeyBody {
    redguard::key::KeyBuilder::new()
        .text("timing:")
        .part("n", &n)
        .finish()
        .unwrap()
}

/// Executions in progress share one renewal task per handle: a task each, started from the
/// blocking pool, was most of a first execution's client CPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_in_progress_share_one_renewal_task() {
    const N: usize = 50;
    let rg = Redguard::memory();
    let metrics = tokio::runtime::Handle::current().metrics();
    let entered = Arc::new(tokio::sync::Barrier::new(N + 1));
    let leave = Arc::new(tokio::sync::Semaphore::new(0));
    let before = metrics.num_alive_tasks();
    let executions: Vec<_> = (0..N)
        .map(|n| {
            let (entered, leave) = (entered.clone(), leave.clone());
            tokio::spawn(
                rg.clone()
                    .scope(redguard::idempotency(numbered_key(n)).scope("timing").run(
                        async move {
                            entered.wait().await;
                            drop(leave.acquire().await);
                            Ok::<_, Error>(n)
                        },
                    )),
            )
        })
        .collect();
    entered.wait().await;
    let alive = metrics.num_alive_tasks() - before;
    assert_eq!(
        rg.live_watchdogs(),
        N,
        "every record in progress is kept alive"
    );
    assert!(
        alive <= N + 2,
        "{alive} tasks alive for {N} executions in their bodies (theirs and the renewals')"
    );
    leave.add_permits(N);
    for (n, execution) in executions.into_iter().enumerate() {
        assert_eq!(execution.await.unwrap().unwrap(), n);
    }
    assert_eq!(rg.live_watchdogs(), 0);
}

/// A record whose first renewal comes before the shared task's next wake (a shorter
/// expire than the execution already running) wakes it: renewed on its own schedule, it
/// stays PROCESSING while its body runs past its expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_expire_is_renewed_on_its_own_schedule() {
    let server = RedisServer::start();
    let rg = redguard_tests::connect(&server).await;
    let short = Duration::from_secs(1);
    let long = tokio::spawn(
        rg.clone().scope(
            redguard::idempotency(numbered_key(0))
                .scope("timing")
                .expire(Duration::from_secs(60))
                .run(async move {
                    tokio::time::sleep(short * 4).await;
                    Ok::<_, Error>(0)
                }),
        ),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let running = tokio::spawn(
        rg.clone().scope(
            redguard::idempotency(numbered_key(1))
                .scope("timing")
                .expire(short)
                .run(async move {
                    tokio::time::sleep(short * 3).await;
                    Ok::<_, Error>(1)
                }),
        ),
    );
    let mut conn = server.connection();
    for _ in 0..5 {
        tokio::time::sleep(short / 2).await;
        let status: Option<String> = redis::cmd("HGET")
            .arg("redguard:idem:{timing:timing:1}")
            .arg("status")
            .query(&mut conn)
            .unwrap();
        assert_eq!(
            status.as_deref(),
            Some("P"),
            "the short record lapsed mid-body"
        );
    }
    assert_eq!(running.await.unwrap().unwrap(), 1);
    assert_eq!(long.await.unwrap().unwrap(), 0);
}

/// A handle used from two runtimes: each runtime's records are renewed by a task on that
/// runtime, so one runtime shut down (its task with it) leaves the other's renewed.
#[test]
fn a_runtime_shut_down_leaves_the_records_of_another_renewed() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let (a, b) = (runtime(), runtime());
    let rg = b.block_on(async { Redguard::memory() });
    let expire = Duration::from_secs(1);
    let call = |n: usize, runs: Arc<AtomicU32>, body: Duration| {
        rg.clone().scope(
            redguard::idempotency(numbered_key(n))
                .scope("timing")
                .expire(expire)
                .run(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(body).await;
                    Ok::<_, Error>(n)
                }),
        )
    };
    // In progress on `a` first: the task renewing records there is running when `b`'s begins.
    let on_a = Arc::new(AtomicU32::new(0));
    a.spawn(call(10, on_a.clone(), Duration::from_secs(60)));
    while on_a.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    let runs = Arc::new(AtomicU32::new(0));
    let running = b.spawn(call(11, runs.clone(), expire * 3));
    while runs.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(a);
    std::thread::sleep(expire * 2);
    let duplicate = b.block_on(call(11, runs.clone(), Duration::ZERO));
    assert!(
        matches!(duplicate, Err(Error::InProgress)),
        "a duplicate after the other runtime shut down got {duplicate:?}: the record lapsed"
    );
    assert_eq!(b.block_on(running).unwrap().unwrap(), 11);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the intent ran twice");
}

/// An execution dropped while its keep-alive starts (its record begun, its body not yet
/// run) leaves nothing behind by the time the drop returns: no renewal counted and the begin
/// undone, so a retry made at once runs. On one thread nothing spawned has run by then, as on
/// a loaded machine whose workers are slow to get round to the cleanups.
#[tokio::test(flavor = "current_thread")]
async fn a_record_dropped_while_its_keep_alive_starts_is_undone_as_it_is_dropped() {
    let rg = Redguard::memory();
    let runs = Arc::new(AtomicU32::new(0));
    let counter = runs.clone();
    let first = rg.scope(
        redguard::idempotency(record_key())
            .scope("timing")
            .run(async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(1)
            }),
    );
    let dropped = redguard_tests::cancel::poll_at_most(first, 1).await;
    assert!(dropped.is_none(), "the first poll completed: {dropped:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "dropped in its body");
    assert_eq!(rg.live_watchdogs(), 0, "a renewal outlived its execution");
    let counter = runs.clone();
    let retry = rg
        .scope(
            redguard::idempotency(record_key())
                .scope("timing")
                .run(async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(2)
                }),
        )
        .await;
    assert!(matches!(retry, Ok(2)), "the retry got {retry:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
