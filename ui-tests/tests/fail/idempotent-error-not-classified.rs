#[derive(Debug)]
struct OrderError;

impl From<redguard::Error> for OrderError {
    fn from(_: redguard::Error) -> Self {
        OrderError
    }
}

#[redguard::idempotent(key = "order:{id}", expire = 600)]
async fn submit(id: u64) -> Result<u64, OrderError> {
    Ok(id)
}

fn main() {}
