// One runtime path per fn: two different `crate = ".."` on one stack, and one that is not a
// path.
#[redguard::rate_limit(key = "user:{user}", rate = "5/s", crate = "::redguard")]
#[redguard::idempotent(key = "{user}", expire = 60, crate = "::other::redguard")]
async fn submit(user: u64) -> redguard::Result<u64> {
    Ok(user)
}

#[redguard::dist_lock(key = "stock:{sku}", crate = "not a path")]
async fn reserve(sku: &str) -> redguard::Result<()> {
    let _ = sku;
    Ok(())
}

fn main() {}
