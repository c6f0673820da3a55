// The sliding log keeps one entry per admitted call, up to the count per window: the count
// is bounded (redguard::rate::MAX_SLIDING_WINDOW_COUNT) so that a key's size and work are.
#[redguard::rate_limit(key = "export:{user_id}", rate = "1000000/h", algorithm = "sliding_window")]
async fn export(user_id: u64) -> Result<(), redguard::Error> {
    let _ = user_id;
    Ok(())
}

// Other algorithms take such counts.
#[redguard::rate_limit(key = "import:{user_id}", rate = "1000000/h", algorithm = "sliding_counter")]
async fn import(user_id: u64) -> Result<(), redguard::Error> {
    let _ = user_id;
    Ok(())
}

fn main() {}
