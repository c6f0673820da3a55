#[redguard::rate_limit(key = "submit:{user_id}", rate = "5/s", algorithm = "sliding_log")]
async fn submit(user_id: u64) -> Result<(), redguard::Error> {
    let _ = user_id;
    Ok(())
}

fn main() {}
