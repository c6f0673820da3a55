// A period needs a known unit and a length; numbers must fit.
#[redguard::rate_limit(key = "a:{id}", rate = "5/sec")]
async fn a(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

#[redguard::rate_limit(key = "b:{id}", rate = "5/0s")]
async fn b(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

#[redguard::rate_limit(key = "c:{id}", rate = "99999999999999999999/s")]
async fn c(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

// Parentheses do not hide a literal.
#[redguard::rate_limit(key = "d:{id}", rate = ("5/99999999999s"))]
async fn d(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
