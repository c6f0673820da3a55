#[redguard::rate_limit(key = "export:{user_id}", rate = "5/s", shadow = "yes")]
async fn export(user_id: u64) -> Result<(), redguard::Error> {
    let _ = user_id;
    Ok(())
}

fn main() {}
