#[redguard::idempotent(key = "{id}", expire = "10m", replicas = 1, replicas_timeout = "1m")]
async fn refund(id: u64) -> Result<u64, redguard::Error> {
    Ok(id)
}

fn main() {}
