#[redguard::rate_limit(key = "login:{ip}", rate = "100 per second", burst = 10)]
async fn login(ip: &str) -> Result<(), redguard::Error> {
    let _ = ip;
    Ok(())
}

fn main() {}
