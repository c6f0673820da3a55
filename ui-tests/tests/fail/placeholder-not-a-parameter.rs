#[redguard::dist_lock(key = "stock:{skuu}", wait = "300ms")]
async fn reserve_stock(sku: &str, qty: u32) -> Result<(), redguard::Error> {
    let _ = (sku, qty);
    Ok(())
}

fn main() {}
