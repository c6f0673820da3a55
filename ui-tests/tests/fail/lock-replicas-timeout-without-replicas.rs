#[redguard::dist_lock(key = "stock:{sku}", replicas_timeout = "50ms")]
async fn reserve_stock(sku: &str) -> Result<(), redguard::Error> {
    let _ = sku;
    Ok(())
}

fn main() {}
