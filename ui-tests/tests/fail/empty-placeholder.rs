#[redguard::idempotent(key = "order:{}", expire = 600)]
async fn submit(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
