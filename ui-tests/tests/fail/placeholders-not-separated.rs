#[redguard::idempotent(key = "{user}{order}", expire = 600)]
async fn submit(user: u64, order: u64) -> Result<(), redguard::Error> {
    let _ = (user, order);
    Ok(())
}

fn main() {}
