#[redguard::idempotent(key = "order:{id}", expire = 600, scope = "my orders")]
async fn submit(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
