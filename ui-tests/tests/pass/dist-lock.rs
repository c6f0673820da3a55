// Every argument of `#[dist_lock]`, on a free fn and a method, with field placeholders.
#![deny(dead_code)]

pub struct Order {
    pub sku: String,
}

#[redguard::dist_lock(key = "export:{sku}", wait = "1s", permits = 3, replicas = 2)]
pub async fn reserve_stock_limited(sku: &str) -> Result<(), redguard::Error> {
    let _ = sku;
    Ok(())
}

#[redguard::dist_lock(key = "stock:{sku}", wait = "300ms", lease = "10s", scope = "shop")]
pub async fn reserve_stock(sku: &str, qty: u32) -> Result<u32, redguard::Error> {
    Ok(qty)
}

#[redguard::dist_lock(key = "job:nightly", skip_if_held, hold_at_least = "30s", on_lost = "continue")]
pub async fn nightly() -> redguard::Result<()> {
    Ok(())
}

#[redguard::dist_lock(key = "catalog:{id}", read, wait = "1s")]
pub async fn read_catalog(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

#[redguard::dist_lock(key = "catalog:{id}", write, wait = "1s")]
pub async fn write_catalog(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

#[redguard::dist_lock(key = "payout:{id}", fair, wait = "5s", replicas = 1, replicas_timeout = "20ms")]
pub async fn payout(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

pub struct Service;

impl Service {
    #[redguard::dist_lock(key = "order:{order.sku}", wait = 1, on_lost = "cancel")]
    pub async fn handle(&self, order: &Order) -> Result<(), redguard::Error> {
        let _ = redguard::lock::fence();
        Ok(())
    }
}

fn main() {
    let _ = reserve_stock("a", 1);
    let _ = reserve_stock_limited("a");
    let _ = nightly();
    let _ = read_catalog(1);
    let _ = write_catalog(1);
    let _ = payout(1);
    let _ = Service.handle(&Order { sku: "x".into() });
}
