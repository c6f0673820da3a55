#[redguard::rate_limit(key = "submit:{user_id}", rate = "5/s", burst = 10, cost = 11)]
async fn submit(user_id: u64) -> Result<(), redguard::Error> {
    let _ = user_id;
    Ok(())
}

// Without a burst the capacity is the rate's count.
#[redguard::rate_limit(key = "export:{user_id}", rate = "5/s", cost = 6)]
async fn export(user_id: u64) -> Result<(), redguard::Error> {
    let _ = user_id;
    Ok(())
}

fn main() {}
