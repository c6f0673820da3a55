// A misspelt argument gets the name that was probably meant.
#[redguard::rate_limit(key = "user:{user}", rate = "5/s", brust = 10)]
async fn submit(user: u64) -> redguard::Result<u64> {
    Ok(user)
}

#[redguard::dist_lock(key = "stock:{sku}", wiat = "100ms")]
async fn reserve(sku: &str) -> redguard::Result<()> {
    let _ = sku;
    Ok(())
}

fn main() {}
