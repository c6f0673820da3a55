#[redguard::rate_limit(rate = "5/s")]
async fn submit(user_id: u64) -> Result<(), redguard::Error> {
    let _ = user_id;
    Ok(())
}

fn main() {}
