// The runtime refuses an `expire` under a second; so does the compiler, instead of every call
// failing with `Error::Config`.
#[redguard::idempotent(key = "order:{id}", expire = "500ms")]
async fn brief(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
