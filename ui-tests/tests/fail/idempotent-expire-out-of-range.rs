#[redguard::idempotent(key = "order:{id}", expire = 0)]
async fn zero(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

#[redguard::idempotent(key = "order:{id}", expire = "8d")]
async fn too_long(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
