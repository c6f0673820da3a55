// README's first `#[idempotent]` error type without the `From<redguard::Error>` a guard needs
// to return its refusals: one error at the return type, saying what to add.
use redguard::{Classify, dist_lock, idempotent, rate_limit};

#[derive(Debug, Classify)]
enum OrderError {
    OutOfStock,
    #[classify(indeterminate)]
    GatewayTimeout,
    Guard(redguard::Error),
}

#[rate_limit(key = "order:submit:user:{user_id}", rate = "5/s", burst = 10)]
#[idempotent(key = "{user_id}", expire = 600)]
#[dist_lock(key = "user:{user_id}")]
async fn submit(user_id: u64) -> Result<u64, OrderError> {
    Ok(user_id)
}

fn main() {}
