//! `Idempotency::transaction` without feature `sqlx` (nor `sqlx-postgres`, `sqlx-sqlite`): a stand-in whose bound has no impl, so
//! the call is refused with one message naming the feature instead of "no method named
//! `transaction`".

use std::future::Future;

use super::Idempotency;

/// A database transaction redguard could commit an outcome in: no type implements it (with
/// feature `sqlx`, `sqlx-postgres` or `sqlx-sqlite` the real `transaction` replaces this module), so the call below is refused
/// with this message.
#[diagnostic::on_unimplemented(
    message = "`Idempotency::transaction` needs redguard's feature `sqlx`",
    label = "the outcome is committed in this transaction with the feature `sqlx`",
    note = "enable it in Cargo.toml: `redguard = {{ version = \"..\", features = [\"sqlx\"] }}`"
)]
pub trait SqlxTransaction: sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}

impl Idempotency {
    /// Needs feature `sqlx` (see the guide's "The outcome in your transaction").
    #[doc(hidden)]
    pub fn transaction<Tx: SqlxTransaction>(self, tx: Tx) -> WithoutSqlx<Tx> {
        WithoutSqlx { _guard: self, tx }
    }
}

/// What [`Idempotency::transaction`] returns without feature `sqlx`: never built, as no type
/// meets its bound. `run` has the real one's shape, so the call's types still infer, and no
/// bound of its own, so only the missing feature is reported.
#[doc(hidden)]
#[derive(Debug)]
pub struct WithoutSqlx<Tx> {
    _guard: Idempotency,
    tx: Tx,
}

impl<Tx> WithoutSqlx<Tx> {
    /// See [`Idempotency::transaction`]: needs feature `sqlx`.
    #[allow(clippy::unused_async)]
    pub async fn run<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce(Tx) -> Fut,
        Fut: Future<Output = (Tx, Result<T, E>)>,
    {
        body(self.tx).await.1
    }
}
