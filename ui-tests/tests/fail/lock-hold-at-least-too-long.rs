#[redguard::dist_lock(key = "job:nightly", skip_if_held, hold_at_least = "2d")]
async fn nightly() -> Result<(), redguard::Error> {
    Ok(())
}

fn main() {}
