// `detach` runs the body in a task of its own: a borrowed parameter cannot go with it.
#[redguard::idempotent(key = "order:{id}", expire = 600, detach)]
async fn submit(id: &str) -> redguard::Result<u64> {
    Ok(id.len() as u64)
}

fn main() {}
