#[redguard::idempotent(key = "order:{id}", expire = "10m", wait = "2m")]
async fn too_long(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

#[redguard::idempotent(token = "{token}", scene = "checkout", wait = "2s")]
async fn token_only(token: &str) -> Result<(), redguard::Error> {
    let _ = token;
    Ok(())
}

fn main() {}
