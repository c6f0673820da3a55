//! What the macro-time checks of issue 45 must still accept: `detach` with owned and
//! `'static` parameters (and a higher-ranked borrow in a boxed closure), and return types
//! that are `Result` aliases it cannot see through (`std::io::Result`-style, the user's own).
#![deny(dead_code, unused)]

type ApiResult<T> = Result<T, redguard::Error>;

#[redguard::idempotent(key = "order:{id}", expire = 600, detach)]
async fn detached(
    id: String,
    tag: &'static str,
    check: Box<dyn Fn(&str) -> bool + Send + Sync>,
) -> ApiResult<u64> {
    Ok(u64::from(check(tag)) + id.len() as u64)
}

#[redguard::idempotent(key = "order:{id}", expire = 600)]
async fn borrowed(id: &str) -> redguard::Result<usize> {
    Ok(id.len())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    redguard::Redguard::memory().install().unwrap();
    let n = detached("a".to_owned(), "t", Box::new(|s: &str| !s.is_empty()))
        .await
        .unwrap();
    assert_eq!(n, 2);
    assert_eq!(borrowed("abc").await.unwrap(), 3);
}
