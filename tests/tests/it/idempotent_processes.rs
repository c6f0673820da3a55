//! Exactly-once across OS processes: 4 workers × 25 tasks send the same 200 intents in
//! random orders against one Redis; every intent's body runs exactly once in total.

use std::collections::HashMap;
use std::process::{Command, Stdio};

use redguard_tests::RedisServer;

#[test]
fn every_intent_runs_exactly_once_across_processes() {
    let server = RedisServer::start();
    let workers: Vec<_> = (0..4)
        .map(|seed| {
            Command::new(env!("CARGO_BIN_EXE_idem_worker"))
                .args([server.url(), (seed * 7919 + 17).to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn idem_worker")
        })
        .collect();
    let mut ran: HashMap<u64, usize> = HashMap::new();
    let mut replayed = 0;
    let mut ran_per_worker = Vec::new();
    for worker in workers {
        let output = worker.wait_with_output().expect("wait for idem_worker");
        assert!(
            output.status.success(),
            "worker failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let mut mine = 0;
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            match line.split_once(' ') {
                Some(("ran", intent)) => {
                    *ran.entry(intent.parse().unwrap()).or_default() += 1;
                    mine += 1;
                }
                Some(("replayed", _)) => replayed += 1,
                _ => panic!("unexpected worker output {line:?}"),
            }
        }
        ran_per_worker.push(mine);
    }
    let twice: Vec<_> = ran.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "intents executed more than once: {twice:?}"
    );
    assert_eq!(ran.len(), 200, "every intent executes once");
    // 800 sends in all: 200 executions, the rest answered from the record.
    assert_eq!(replayed, 600);
    println!("executions per worker: {ran_per_worker:?}, replays: {replayed}");
    server.assert_every_key_has_ttl();
}
