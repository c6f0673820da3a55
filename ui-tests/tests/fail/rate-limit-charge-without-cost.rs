use redguard::rate_limit;

// `charge = after` reads the cost from the `Ok` value, which must implement `Cost`.
#[rate_limit(key = "k", rate = "10/s", charge = after)]
async fn f() -> redguard::Result<String> {
    Ok(String::new())
}

fn main() {}
