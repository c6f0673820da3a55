#[redguard::dist_lock(key = "stock:{sku}", replicas = 0)]
async fn reserve_stock(sku: &str) -> Result<(), redguard::Error> {
    let _ = sku;
    Ok(())
}

#[redguard::dist_lock(key = "stock:{sku}", replicas = 1, replicas_timeout = "0ms")]
async fn release_stock(sku: &str) -> Result<(), redguard::Error> {
    let _ = sku;
    Ok(())
}

fn main() {}
