#[redguard::idempotent(key = "order:{id}", expire = 600)]
fn submit(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
