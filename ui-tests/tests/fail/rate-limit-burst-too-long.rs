// The burst's refill time is bounded (35 years), so that the stores count it exactly.
#[redguard::rate_limit(key = "a:{id}", rate = "1/30d", burst = 1000000)]
async fn a(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
