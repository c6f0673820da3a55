//! Locks across OS processes: mutual exclusion, fencing order, crash recovery, scheduled
//! jobs. Each test spawns `lock_worker` processes against its own Redis.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redguard_tests::RedisServer;

fn worker(server: &RedisServer, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lock_worker"));
    command.arg(server.url()).args(args).stdout(Stdio::piped());
    command
}

fn output(child: Child) -> String {
    let out = child.wait_with_output().expect("worker output");
    assert!(out.status.success(), "worker failed: {:?}", out.status);
    String::from_utf8(out.stdout).expect("utf-8")
}

/// 4 processes × 16 tasks × 500 sections on one key, each a non-atomic read-modify-write
/// of a shared counter: the count must be exact, no two holders ever inside together, and
/// fencing tokens must increase in the order the sections ran.
#[test]
fn mutual_exclusion_across_processes() {
    exclusive_sections("mutex", 500);
}

/// The same through a fair lock, whose releases hand the lock straight to the next waiter
/// in whichever process it waits.
#[test]
fn fair_mutual_exclusion_across_processes() {
    exclusive_sections("fair", 100);
}

fn exclusive_sections(mode: &str, iterations: usize) {
    let (processes, tasks) = (4usize, 16usize);
    let server = RedisServer::start();
    let started = Instant::now();
    let children: Vec<Child> = (0..processes)
        .map(|_| {
            worker(
                &server,
                &[mode, "m", &tasks.to_string(), &iterations.to_string()],
            )
            .spawn()
            .expect("spawn worker")
        })
        .collect();
    let mut sections = Vec::new();
    let mut overlaps = 0u64;
    for child in children {
        for line in output(child).lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            match fields.as_slice() {
                ["F", value, fence] => {
                    sections.push((value.parse::<u64>().unwrap(), fence.parse::<u64>().unwrap()))
                }
                ["OVERLAPS", n] => overlaps += n.parse::<u64>().unwrap(),
                ["DONE", _] => {}
                other => panic!("unexpected worker line {other:?}"),
            }
        }
    }
    let elapsed = started.elapsed();
    let total = processes * tasks * iterations;
    let mut conn = server.connection();
    let counter: u64 = redis::cmd("GET").arg("counter:m").query(&mut conn).unwrap();
    println!(
        "{total} critical sections in {elapsed:?}: {:.0}/s",
        total as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(overlaps, 0, "holders overlapped");
    assert_eq!(counter, total as u64, "lost updates");
    assert_eq!(sections.len(), total);
    // Each section read a distinct counter value; in that (execution) order, fences increase.
    sections.sort_unstable();
    for (i, window) in sections.windows(2).enumerate() {
        assert_eq!(window[0].0, i as u64, "counter value read twice or skipped");
        assert!(
            window[1].1 > window[0].1,
            "fence {} after {} (sections {i}, {})",
            window[1].1,
            window[0].1,
            i + 1
        );
    }
    server.assert_every_key_has_ttl();
}

/// A holder killed with SIGKILL cannot release: its key must be free once its lease ends.
#[test]
fn killed_holder_frees_key_within_lease() {
    let server = RedisServer::start();
    let lease = Duration::from_secs(2);
    let mut child = worker(&server, &["hold", "k", &lease.as_millis().to_string()])
        .spawn()
        .expect("spawn worker");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read");
    assert!(line.starts_with("ACQUIRED "), "{line:?}");
    // Held past several leases thanks to the watchdog in that process.
    std::thread::sleep(lease * 2);
    let key = "redguard:lock:{worker:hold:k}";
    let mut conn = server.connection();
    let exists: bool = redis::cmd("EXISTS").arg(key).query(&mut conn).unwrap();
    assert!(exists, "the watchdog did not keep the lock");
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let killed = Instant::now();
    while redis::cmd("EXISTS")
        .arg(key)
        .query::<bool>(&mut conn)
        .unwrap()
    {
        assert!(
            killed.elapsed() < lease + Duration::from_secs(1),
            "key still held {:?} after the holder died",
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "freed {:?} after SIGKILL (lease {lease:?})",
        killed.elapsed()
    );
    server.assert_every_key_has_ttl();
}

/// Scheduled-job mode: several instances fire the same job at once; one runs, the others
/// skip, and `hold_at_least` keeps a late instance from re-running it right after.
#[test]
fn skip_if_held_and_hold_at_least_across_processes() {
    let server = RedisServer::start();
    let run = |n: usize| -> Vec<String> {
        let children: Vec<Child> = (0..n)
            .map(|_| worker(&server, &["job", "nightly"]).spawn().expect("spawn"))
            .collect();
        children
            .into_iter()
            .map(|c| output(c).trim().to_owned())
            .collect()
    };
    let first = run(4);
    assert_eq!(first.iter().filter(|o| *o == "RAN").count(), 1, "{first:?}");
    assert_eq!(
        first.iter().filter(|o| *o == "SKIPPED").count(),
        3,
        "{first:?}"
    );
    // The job took 50 ms, but the key is kept until 2 s after it started.
    let late = run(2);
    assert!(late.iter().all(|o| o == "SKIPPED"), "{late:?}");
    std::thread::sleep(Duration::from_millis(2100));
    let next_day = run(1);
    assert_eq!(next_day, ["RAN"]);
    server.assert_every_key_has_ttl();
}
