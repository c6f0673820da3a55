#[redguard::rate_limit(key = "submit:{user_id}", rate = "5/s", burst = 0)]
async fn submit(user_id: u64) -> Result<(), redguard::Error> {
    let _ = user_id;
    Ok(())
}

fn main() {}
