// A lock above the idempotency guard takes the lock for every replay too: the expansion warns
// (here denied, so the warning shows as an error).
#![deny(deprecated)]

#[redguard::dist_lock(key = "stock:{sku}")]
#[redguard::idempotent(key = "{request}", expire = 600)]
async fn lock_first(request: &str, sku: &str) -> redguard::Result<u64> {
    let _ = (request, sku);
    Ok(1)
}

fn main() {}
