#[redguard::idempotent(key = "order:{id}", expire = 600)]
async fn submit(id: u64) {
    let _ = id;
}

fn main() {}
