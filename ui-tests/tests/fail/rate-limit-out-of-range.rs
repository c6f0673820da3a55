// Values outside what the runtime accepts are compile errors, each under its literal.
#[redguard::rate_limit(key = "a:{id}", rate = "2000000000/s", cost = 0, block = "31d", wait = "2m", local = 1)]
async fn a(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

#[redguard::rate_limit(key = "b:{id}", rate = "1/31d", burst = 2000000000)]
async fn b(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
