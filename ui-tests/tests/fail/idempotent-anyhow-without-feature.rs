// `anyhow::Result` from an `#[idempotent]` fn without redguard's feature `anyhow`: the fix is
// the feature (a derive on `anyhow::Error` is impossible).
#[redguard::idempotent(key = "order:{id}", expire = 600)]
async fn submit(id: u64) -> anyhow::Result<u64> {
    Ok(id)
}

fn main() {}
