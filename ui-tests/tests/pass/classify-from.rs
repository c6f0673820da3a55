// `#[classify(from)]` derives the `From<redguard::Error>` every guarded fn's error type needs,
// on an enum variant (tuple or named) and on a newtype struct.
use redguard::{Classify, ErrorClass, dist_lock, idempotent, rate_limit};

#[derive(Debug, Classify)]
enum OrderError {
    OutOfStock,
    #[classify(from)]
    Guard(redguard::Error),
}

#[derive(Debug, Classify)]
enum Named {
    #[classify(from)]
    Guard { source: redguard::Error },
}

#[derive(Debug, Classify)]
#[classify(from)]
struct Wrapped(redguard::Error);

#[rate_limit(key = "u:{id}", rate = "5/s")]
#[idempotent(key = "{id}", expire = 60)]
#[dist_lock(key = "l:{id}")]
async fn submit(id: u64) -> Result<u64, OrderError> {
    if id == 0 {
        return Err(OrderError::OutOfStock);
    }
    Ok(id)
}

#[dist_lock(key = "n:{id}")]
async fn named(id: u64) -> Result<u64, Named> {
    Ok(id)
}

#[dist_lock(key = "w:{id}")]
async fn wrapped(id: u64) -> Result<u64, Wrapped> {
    Ok(id)
}

fn main() {
    let lost = || redguard::Error::LockLost { key: "k".into() };
    assert!(matches!(OrderError::from(lost()), OrderError::Guard(_)));
    assert_eq!(OrderError::from(lost()).class(), ErrorClass::Indeterminate);
    assert_eq!(Named::from(lost()).class(), ErrorClass::Indeterminate);
    assert_eq!(Wrapped::from(lost()).class(), ErrorClass::Indeterminate);
    let _ = (submit(1), named(1), wrapped(1));
}
