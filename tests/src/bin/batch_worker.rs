//! One consumer process of the batch crash test: claims messages 0 to 9 in one batch
//! (scope `worker`, expire 5 s) and runs them one after another, printing `started <i>` when
//! a body starts and `done <i>` when it completes; message 3's body never completes, so the
//! test kills the process mid-batch.
//!
//! Usage: `batch_worker <redis-url>`

use std::io::Write as _;
use std::time::Duration;

use redguard::{Error, Redguard};

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .ok_or("usage: batch_worker <redis-url>")?;
    let rg = Redguard::redis(url).connect().await?;
    let mut batch = rg
        .idempotency_batch()
        .scope("worker")
        .expire(Duration::from_secs(5));
    for i in 0..10u64 {
        batch = batch.message(redguard::key("m:{i}").part("i", &i));
    }
    batch
        .run(|i| async move {
            say(format!("started {i}"));
            if i == 3 {
                std::future::pending::<()>().await;
            }
            say(format!("done {i}"));
            Ok::<_, Error>(i as u64)
        })
        .await?;
    Ok(())
}
