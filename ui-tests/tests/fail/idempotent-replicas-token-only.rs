#[redguard::idempotent(token = "{token}", scene = "signup", replicas = 1)]
async fn signup(token: String) -> Result<u64, redguard::Error> {
    let _ = token;
    Ok(1)
}

fn main() {}
