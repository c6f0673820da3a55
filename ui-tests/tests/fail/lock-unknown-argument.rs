#[redguard::dist_lock(key = "stock:{sku}", timeout = "1s")]
async fn reserve_stock(sku: &str) -> Result<(), redguard::Error> {
    let _ = sku;
    Ok(())
}

fn main() {}
