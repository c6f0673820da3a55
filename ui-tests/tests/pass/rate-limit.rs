use redguard::rate::Rate;

struct Plan {
    rate: String,
    burst: u32,
}

#[derive(Debug)]
struct OrderError;

impl From<redguard::Error> for OrderError {
    fn from(_: redguard::Error) -> Self {
        OrderError
    }
}

// Stacked limits, every algorithm, literals and per-call expressions.
#[redguard::rate_limit(key = "order:submit", rate = "500/s", burst = 1000)]
#[redguard::rate_limit(key = "order:submit:user:{user_id}", rate = &plan.rate, burst = plan.burst, cost = qty)]
#[redguard::rate_limit(key = "order:w:{user_id}", rate = "10/min", algorithm = "fixed_window", scope = "orders")]
#[redguard::rate_limit(key = "order:s:{user_id}", rate = "10/min", algorithm = "sliding_window")]
#[redguard::rate_limit(key = "order:c:{user_id}", rate = "10/min", algorithm = "sliding_counter")]
#[redguard::rate_limit(key = "order:t:{user_id}", rate = Rate::per_minute(10), algorithm = "token_bucket")]
#[redguard::rate_limit(key = "order:l:{user_id}", rate = "10/min", algorithm = "leaky_bucket", block = "1m")]
async fn submit_order(user_id: u64, plan: &Plan, qty: u32) -> Result<u64, OrderError> {
    Ok(user_id + u64::from(qty) + plan.rate.len() as u64)
}

fn main() {
    let _ = submit_order;
}
