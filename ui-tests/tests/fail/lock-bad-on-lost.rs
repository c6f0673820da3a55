#[redguard::dist_lock(key = "stock:{sku}", on_lost = "ignore")]
async fn reserve_stock(sku: &str) -> Result<(), redguard::Error> {
    let _ = sku;
    Ok(())
}

fn main() {}
