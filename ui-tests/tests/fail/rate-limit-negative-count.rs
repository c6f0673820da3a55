// A negative count is an expression to the parser, but never a valid one: refused now
// rather than on every call.
#[redguard::rate_limit(key = "a:{id}", rate = "5/s", burst = -1, cost = (-2))]
async fn a(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
