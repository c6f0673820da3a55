#[redguard::dist_lock(key = "stock:{sku}", lease = "500ms")]
async fn too_short(sku: &str) -> Result<(), redguard::Error> {
    let _ = sku;
    Ok(())
}

#[redguard::dist_lock(key = "stock:{sku}", lease = "2h")]
async fn too_long(sku: &str) -> Result<(), redguard::Error> {
    let _ = sku;
    Ok(())
}

fn main() {}
