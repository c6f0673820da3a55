//! `crate = "..."` names the runtime where a re-exporting crate put it.

mod platform {
    pub use redguard as guards;
}

#[redguard::rate_limit(key = "user:{user}", rate = "5/s", crate = "crate::platform::guards")]
#[redguard::idempotent(key = "{user}", expire = 60, crate = "crate::platform::guards")]
async fn submit(user: u64) -> redguard::Result<u64> {
    Ok(user)
}

#[redguard::dist_lock(key = "stock:{sku}", crate = "crate::platform::guards")]
async fn reserve(sku: &str) -> redguard::Result<()> {
    let _ = sku;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    redguard::Redguard::memory().install().unwrap();
    assert_eq!(submit(7).await.unwrap(), 7);
    reserve("SK-1").await.unwrap();
}
