#[redguard::dist_lock(key = "stock:{sku}")]
fn reserve_stock(sku: &str) -> Result<(), redguard::Error> {
    let _ = sku;
    Ok(())
}

fn main() {}
