// Waiting is always bounded: at most 60s.
#[redguard::dist_lock(key = "stock:{sku}", wait = "10m")]
async fn reserve_stock(sku: &str) -> Result<(), redguard::Error> {
    let _ = sku;
    Ok(())
}

fn main() {}
