use redguard::rate_limit;

// Adjacent limits are decided and charged together: one charged after the call cannot join.
#[rate_limit(key = "user", rate = "10/s", charge = after)]
#[rate_limit(key = "global", rate = "100/s")]
async fn f() -> redguard::Result<u64> {
    Ok(1)
}

fn main() {}
