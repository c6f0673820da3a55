#[redguard::dist_lock(key = "stock:{sku}", wait = "300 millis")]
async fn reserve_stock(sku: &str) -> Result<(), redguard::Error> {
    let _ = sku;
    Ok(())
}

fn main() {}
