#[redguard::idempotent(scope = "orders")]
async fn submit(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
