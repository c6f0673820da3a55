#[redguard::idempotent(key = "order:{id}", expire = 600, expires = 60, key = "x:{id}")]
async fn submit(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
