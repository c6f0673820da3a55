#[redguard::idempotent(token = "{token}")]
async fn submit(token: &str) -> Result<(), redguard::Error> {
    let _ = token;
    Ok(())
}

fn main() {}
