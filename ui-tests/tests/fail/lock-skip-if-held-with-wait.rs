#[redguard::dist_lock(key = "job:nightly", skip_if_held, wait = "1s")]
async fn nightly() -> Result<(), redguard::Error> {
    Ok(())
}

fn main() {}
