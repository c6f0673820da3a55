// Adjacent limits are decided in one call, which refuses two limits on one key: the same
// template under the same scope would be refused on every call.
#[redguard::rate_limit(key = "order:{user_id}", rate = "5/s")]
#[redguard::rate_limit(key = "order:{user_id}", rate = "100/min")]
async fn submit(user_id: u64) -> Result<(), redguard::Error> {
    let _ = user_id;
    Ok(())
}

// Another scope makes them different keys.
#[redguard::rate_limit(key = "order:{user_id}", rate = "5/s")]
#[redguard::rate_limit(key = "order:{user_id}", rate = "100/min", scope = "per-minute")]
async fn cancel(user_id: u64) -> Result<(), redguard::Error> {
    let _ = user_id;
    Ok(())
}

fn main() {}
