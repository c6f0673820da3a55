//! `#[idempotent]` on the shapes users write: field access, methods (inherent, generic, of a
//! trait impl, with a raw identifier name), token mode, payloads, an explicit scope, a
//! renamed import, and attributes kept on the fn.
#![deny(dead_code, unused)]

use redguard::idempotent as once;
use serde::Serialize;

#[derive(Serialize)]
struct SubmitOrder {
    request_id: String,
    sku: String,
}

struct Service {
    tenant: u64,
}

impl Service {
    /// Docs survive the expansion.
    #[redguard::idempotent(key = "{self.tenant}:{order}", expire = "10m")]
    async fn confirm(&self, order: u64) -> redguard::Result<u64> {
        Ok(order + self.tenant)
    }
}

struct Repo<T>(T);

impl<T: Send + Sync> Repo<T> {
    #[redguard::idempotent(key = "{id}", expire = 60, replicas = 1)]
    async fn r#match(&self, id: u64) -> redguard::Result<u64> {
        Ok(id)
    }
}

trait Confirm {
    async fn confirm(&self, order: u64) -> redguard::Result<u64>;
}

impl Confirm for Repo<u8> {
    #[redguard::idempotent(key = "{order}", expire = 60, scope = "repo.confirm", replicas = 1, replicas_timeout = "100ms")]
    async fn confirm(&self, order: u64) -> redguard::Result<u64> {
        Ok(order + u64::from(self.0))
    }
}

#[redguard::idempotent(key = "{user_id}:{req.request_id}", expire = 600, payload = req, timeout = "5s")]
async fn submit(user_id: u64, req: SubmitOrder) -> Result<String, redguard::Error> {
    Ok(format!("{user_id}/{}", req.sku))
}

#[once(token = "{token}", scene = "checkout")]
async fn checkout(token: String) -> redguard::Result<()> {
    let _ = token;
    Ok(())
}

/// `#[derive(Classify)]` on the shapes error types take: generic, with named fields, a
/// newtype of the guard's error, an empty enum.
#[derive(Debug, redguard::Classify)]
#[classify(indeterminate)]
enum Downstream<E> {
    #[classify(business)]
    Rejected { reason: String },
    Io(E),
    Guard { inner: redguard::Error },
    #[classify(delegate)]
    Nested(GuardOnly),
}

#[derive(Debug, redguard::Classify)]
struct GuardOnly(redguard::Error);

#[derive(Debug, redguard::Classify)]
enum Never {}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    redguard::Redguard::memory().install().unwrap();
    let req = SubmitOrder {
        request_id: "r-1".into(),
        sku: "SK-1".into(),
    };
    assert_eq!(submit(7, req).await.unwrap(), "7/SK-1");
    assert_eq!(Service { tenant: 1 }.confirm(2).await.unwrap(), 3);
    assert_eq!(Repo(()).r#match(4).await.unwrap(), 4);
    assert_eq!(Repo(1u8).confirm(4).await.unwrap(), 5);
    let token = redguard::tokens()
        .issue("checkout", std::time::Duration::from_secs(60))
        .await
        .unwrap();
    checkout(token).await.unwrap();
    use redguard::{Classify, ErrorClass};
    let rejected = Downstream::<std::io::Error>::Rejected { reason: "no".into() };
    assert_eq!(rejected.class(), ErrorClass::Business);
    if let Downstream::Rejected { reason } = &rejected {
        assert_eq!(reason, "no");
    }
    let io = Downstream::Io(std::io::Error::other("reset"));
    assert_eq!(io.class(), ErrorClass::Indeterminate);
    let guard = Downstream::<std::io::Error>::Guard { inner: redguard::Error::InProgress };
    assert_eq!(guard.class(), ErrorClass::Business);
    let nested = Downstream::<std::io::Error>::Nested(GuardOnly(redguard::Error::Cancelled));
    assert_eq!(nested.class(), ErrorClass::Indeterminate);
    let _ = |never: Never| never.class();
}
