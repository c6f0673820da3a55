// A rate computed per call must be a `redguard::rate::Rate` or text.
#[redguard::rate_limit(key = "submit:{user_id}", rate = limit_of(user_id))]
async fn submit(user_id: u64) -> Result<(), redguard::Error> {
    let _ = user_id;
    Ok(())
}

fn limit_of(_user: u64) -> u32 {
    5
}

fn main() {}
