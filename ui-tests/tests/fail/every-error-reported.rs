// Two bad placeholders and a bad duration: three errors from one build.
#[redguard::dist_lock(key = "{a}:{b}", wait = "soon", leese = "1s", wait = "1s")]
async fn f(x: u64) -> Result<(), redguard::Error> {
    let _ = x;
    Ok(())
}

fn main() {}
