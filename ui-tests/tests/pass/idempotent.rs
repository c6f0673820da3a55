//! `#[idempotent]` on the shapes users write: field access, methods, token mode, payloads,
//! a renamed import, and attributes kept on the fn.
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

#[redguard::idempotent(key = "{user_id}:{req.request_id}", expire = 600, payload = req, timeout = "5s")]
async fn submit(user_id: u64, req: SubmitOrder) -> Result<String, redguard::Error> {
    Ok(format!("{user_id}/{}", req.sku))
}

#[once(token = "{token}", scene = "checkout")]
async fn checkout(token: String) -> redguard::Result<()> {
    let _ = token;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    redguard::Redguard::memory().install().unwrap();
    let req = SubmitOrder {
        request_id: "r-1".into(),
        sku: "SK-1".into(),
    };
    assert_eq!(submit(7, req).await.unwrap(), "7/SK-1");
    assert_eq!(Service { tenant: 1 }.confirm(2).await.unwrap(), 3);
    let token = redguard::tokens()
        .issue("checkout", std::time::Duration::from_secs(60))
        .await
        .unwrap();
    checkout(token).await.unwrap();
}
