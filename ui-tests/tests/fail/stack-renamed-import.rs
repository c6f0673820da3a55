// A guard imported under another name is not recognised by the guard above it, so it would
// expand later, around the already expanded fn, and run first: refused with a way out.
use redguard::rate_limit as limit;

#[redguard::idempotent(key = "{request}", expire = 600)]
#[limit(key = "user:{request}", rate = "5/s")]
async fn submit(request: &str) -> redguard::Result<u64> {
    let _ = request;
    Ok(1)
}

fn main() {}
