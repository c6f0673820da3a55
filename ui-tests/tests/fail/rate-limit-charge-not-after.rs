use redguard::rate_limit;

#[rate_limit(key = "k", rate = "10/s", charge = before)]
async fn f() -> redguard::Result<u64> {
    Ok(1)
}

fn main() {}
