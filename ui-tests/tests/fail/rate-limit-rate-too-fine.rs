// Above 1,000,000 per second the interval is counted in whole nanoseconds: a rate it would
// slow down by more than 0.1% is refused (333.3 ns would become 334 ns).
#[redguard::rate_limit(key = "a:{id}", rate = "3000000/s")]
async fn a(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

// A billion per millisecond is one unit every 0.001 ns.
#[redguard::rate_limit(key = "b:{id}", rate = "1000000000/ms")]
async fn b(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

// Whole nanoseconds are fine.
#[redguard::rate_limit(key = "c:{id}", rate = "500000000/s")]
async fn c(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
