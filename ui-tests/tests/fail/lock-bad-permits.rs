#[redguard::dist_lock(key = "export:{user}", permits = 0)]
async fn export(user: u64) -> Result<(), redguard::Error> {
    let _ = user;
    Ok(())
}

#[redguard::dist_lock(key = "export:{user}", permits = 2, hold_at_least = "10s")]
async fn export_kept(user: u64) -> Result<(), redguard::Error> {
    let _ = user;
    Ok(())
}

fn main() {}
