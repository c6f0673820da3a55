#[redguard::idempotent(key = "order:{id}", expire = 600)]
async fn submit(id: u64) -> u64 {
    id
}

fn main() {}
