//! One process of the multi-process idempotency test: 25 tasks send the same 200 intents in
//! a random order through `#[idempotent]`, printing `ran <intent>` from inside the body (the
//! count outside the guard) and `replayed <intent>` when answered from the record.
//!
//! Usage: `idem_worker <redis-url> <seed>`

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redguard::{Classify, Error, Redguard, idempotency::track_replay, idempotent};

const INTENTS: u64 = 200;
const TASKS: usize = 25;

#[derive(Debug)]
struct WorkerError(Error);

impl From<Error> for WorkerError {
    fn from(err: Error) -> Self {
        WorkerError(err)
    }
}

impl Classify for WorkerError {}

#[idempotent(key = "intent:{intent}", expire = 60)]
async fn execute(intent: u64) -> Result<u64, WorkerError> {
    println!("ran {intent}");
    tokio::time::sleep(Duration::from_millis(2)).await;
    Ok(intent * 10)
}

/// xorshift: enough to shuffle, no dependency.
fn shuffled(seed: u64) -> Vec<u64> {
    let mut state = seed | 1;
    let mut intents: Vec<u64> = (0..INTENTS).collect();
    for i in (1..intents.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let j = (state % (i as u64 + 1)) as usize;
        intents.swap(i, j);
    }
    intents
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or("usage: idem_worker <redis-url> <seed>")?;
    let seed: u64 = args.next().ok_or("missing seed")?.parse()?;
    Redguard::redis(url).connect().await?.install()?;

    let queue = Arc::new(Mutex::new(shuffled(seed)));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let queue = queue.clone();
            tokio::spawn(async move {
                loop {
                    let Some(intent) = queue.lock().ok().and_then(|mut q| q.pop()) else {
                        return Ok::<_, String>(());
                    };
                    loop {
                        match track_replay(execute(intent)).await {
                            (Ok(value), replayed) => {
                                assert_eq!(value, intent * 10);
                                if replayed {
                                    println!("replayed {intent}");
                                }
                                break;
                            }
                            (Err(WorkerError(Error::InProgress)), _) => {
                                tokio::time::sleep(Duration::from_millis(3)).await;
                            }
                            (Err(other), _) => return Err(format!("intent {intent}: {other:?}")),
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}
