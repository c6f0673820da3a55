//! A process that dies mid-idempotent-body, for `tests/tests/faults.rs`.
//!
//! ```text
//! fault_worker <redis-url> <intent> <expire-ms>
//!     enters the idempotent body of `faults:<intent>` (record expiring after <expire-ms>),
//!     prints `RUNNING` from inside it and sleeps until killed.
//! ```

use std::time::Duration;

use redguard::{Error, Idempotency, KeyBuilder, Redguard};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: fault_worker <redis-url> <intent> <expire-ms>";
    let url = args.next().ok_or(usage)?;
    let intent = args.next().ok_or(usage)?;
    let expire: u64 = args.next().ok_or(usage)?.parse()?;
    let rg = Redguard::redis(url).connect().await?;
    let key = KeyBuilder::new().part("intent", intent.as_str()).finish()?;
    let idem = Idempotency::new("faults", key).expire(Duration::from_millis(expire));
    rg.scope(idem.run(async {
        println!("RUNNING");
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok::<u64, Error>(0)
    }))
    .await?;
    Ok(())
}
