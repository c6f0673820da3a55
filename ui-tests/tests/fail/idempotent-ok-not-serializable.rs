struct Receipt;

#[redguard::idempotent(key = "order:{id}", expire = 600)]
async fn submit(id: u64) -> Result<Receipt, redguard::Error> {
    let _ = id;
    Ok(Receipt)
}

fn main() {}
