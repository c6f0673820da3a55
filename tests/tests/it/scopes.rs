//! The default scope names the fn's impl (and trait): methods of the same name on different
//! types never share an idempotency record, a lock or a rate budget.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redguard::{Error, Redguard};

struct Orders;
struct Refunds;
struct Generic<T>(T);

static RUNS: AtomicU32 = AtomicU32::new(0);

impl Orders {
    #[redguard::idempotent(key = "{id}", expire = 600)]
    async fn create(&self, id: u64) -> Result<u64, Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(1000 + id)
    }

    #[redguard::dist_lock(key = "{id}", skip_if_held)]
    async fn hold(&self, id: u64, during: Duration) -> Result<(), Error> {
        tokio::time::sleep(during).await;
        Ok(())
    }

    #[redguard::rate_limit(key = "{id}", rate = "1/min")]
    async fn limited(&self, id: u64) -> Result<(), Error> {
        Ok(())
    }

    /// A raw identifier as the fn's name.
    #[redguard::idempotent(key = "{id}", expire = 600)]
    async fn r#match(id: u64) -> Result<u64, Error> {
        Ok(id)
    }
}

impl Refunds {
    #[redguard::idempotent(key = "{id}", expire = 600)]
    async fn create(&self, id: u64) -> Result<u64, Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(2000 + id)
    }

    #[redguard::dist_lock(key = "{id}", skip_if_held)]
    async fn hold(&self, id: u64, during: Duration) -> Result<(), Error> {
        tokio::time::sleep(during).await;
        Ok(())
    }

    #[redguard::rate_limit(key = "{id}", rate = "1/min")]
    async fn limited(&self, id: u64) -> Result<(), Error> {
        Ok(())
    }
}

trait Create {
    async fn create(&self, id: u64) -> Result<u64, Error>;
}

impl Create for Generic<u8> {
    #[redguard::idempotent(key = "{id}", expire = 600)]
    async fn create(&self, id: u64) -> Result<u64, Error> {
        Ok(3000 + id + u64::from(self.0))
    }
}

impl Create for Generic<u16> {
    #[redguard::idempotent(key = "{id}", expire = 600)]
    async fn create(&self, id: u64) -> Result<u64, Error> {
        Ok(4000 + id + u64::from(self.0))
    }
}

#[tokio::test]
async fn methods_of_different_impls_never_share_state() {
    Redguard::memory()
        .scope(async {
            assert_eq!(Orders.create(42).await.unwrap(), 1042);
            assert_eq!(Refunds.create(42).await.unwrap(), 2042);
            assert_eq!(Orders.create(42).await.unwrap(), 1042);
            assert_eq!(RUNS.load(Ordering::SeqCst), 2);

            assert_eq!(Generic(0u8).create(1).await.unwrap(), 3001);
            assert_eq!(Generic(0u16).create(1).await.unwrap(), 4001);

            // Holding `Orders::hold(7)` does not make `Refunds::hold(7)` wait or skip.
            let (orders, refunds) =
                tokio::join!(Orders.hold(7, Duration::from_millis(200)), async {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Refunds.hold(7, Duration::ZERO).await
                });
            orders.unwrap();
            refunds.unwrap();

            // Two budgets, not one.
            Orders.limited(9).await.unwrap();
            Refunds.limited(9).await.unwrap();
            assert!(matches!(
                Orders.limited(9).await,
                Err(Error::RateLimited(_))
            ));

            assert_eq!(Orders::r#match(5).await.unwrap(), 5);
            assert_eq!(Orders::r#match(5).await.unwrap(), 5);
        })
        .await;
}
