//! Fencing into storage (feature `sqlx`): a write guarded by a lock commits only if its fence
//! is at least the newest one its resource has seen.

use std::ops::{Deref, DerefMut};

use crate::error::{Error, Result};
use crate::idempotency::transaction::DbFailure;
use crate::idempotency::{OutcomeDatabase, sql_failure};

/// The longest resource name [`begin_fenced`] takes, in bytes.
pub const MAX_FENCED_RESOURCE: usize = 512;

/// Begins a transaction on `conn` whose first statement records that `resource` is written
/// under `fence`, and refuses a stale holder: [`Error::LockLost`] when a write with a newer
/// fence already committed (the transaction is then rolled back, and nothing of the stale
/// holder's ever commits, whatever Redis said when it started). Write through the returned
/// [`FencedTransaction`] as through a [`sqlx::Transaction`] and commit it.
///
/// A lock is a lease: a holder paused past it (a GC pause, a stalled VM, a stopped process)
/// still runs its body after the next holder entered. Fencing tokens grow with every
/// acquisition ([`fence`](super::fence)), so storage that remembers the newest one can tell
/// the late write from the current one. Here that memory is one row per resource in
/// `redguard_fences` (run [`POSTGRES_MIGRATION`](crate::idempotency::POSTGRES_MIGRATION) or
/// [`SQLITE_MIGRATION`](crate::idempotency::SQLITE_MIGRATION)), locked by the transaction
/// until it ends, so two holders' writes to one resource are ordered by the database. The
/// same fence may write again (one section, several transactions); an older one may not.
///
/// The fence row is locked first, before any write of the transaction can run: two holders
/// then take their locks in one order (the fence row, then what they write), so neither waits
/// for the other while holding what the other needs. A transaction that wrote before it
/// fenced could deadlock with the next holder's on Postgres, which aborts one of them, maybe
/// the legitimate one.
///
/// `conn` is anything a transaction begins on: a pool, a connection, or a transaction already
/// open (`&mut tx`), in which the fenced one is a savepoint: the fence row is then the
/// savepoint's first statement, not the transaction's, so no write to the fenced resource may
/// come before it in `tx`.
///
/// ```no_run
/// # async fn f(rg: redguard::Redguard, pool: sqlx::PgPool) -> redguard::Result<()> {
/// use redguard::idempotency::sql_failure;
///
/// rg.lock("stock:SK-1")
///     .run(async {
///         let fence = redguard::lock::fence().expect("inside a lock");
///         let mut tx = redguard::lock::begin_fenced(&pool, "stock:SK-1", fence).await?;
///         sqlx::query("UPDATE stock SET available = available - 1 WHERE sku = 'SK-1'")
///             .execute(&mut *tx)
///             .await
///             .map_err(sql_failure)?;
///         tx.commit().await
///     })
///     .await
/// # }
/// ```
pub async fn begin_fenced<'c, A, DB>(
    conn: A,
    resource: &str,
    fence: u64,
) -> Result<FencedTransaction<'c, DB>>
where
    A: sqlx::Acquire<'c, Database = DB>,
    DB: OutcomeDatabase,
{
    if resource.is_empty() || resource.len() > MAX_FENCED_RESOURCE {
        return Err(Error::Config(format!(
            "a fenced resource is 1 to {MAX_FENCED_RESOURCE} bytes, not {}",
            resource.len()
        )));
    }
    // Redis hands out fences below 2^53; anything larger did not come from a lock.
    let value = i64::try_from(fence)
        .map_err(|_| Error::Config(format!("{fence} is not a fencing token of a lock")))?;
    let mut tx = conn.begin().await.map_err(sql_failure)?;
    match DB::__advance_fence(&mut tx, resource, value).await {
        Ok(0) => Err(Error::LockLost {
            key: resource.to_owned(),
        }),
        Ok(_) => Ok(FencedTransaction { tx }),
        Err(err) => Err(match DB::__failure(&err) {
            DbFailure::MissingTable => Error::Config(format!(
                "the table redguard_fences is missing: run the migration shipped with redguard \
                 (migrations/postgres/0002_redguard_fences.sql or \
                 migrations/sqlite/0002_redguard_fences.sql) ({err})"
            )),
            DbFailure::Busy | DbFailure::Other => sql_failure(err),
        }),
    }
}

/// A transaction whose fence is recorded (see [`begin_fenced`]); it derefs to its connection,
/// as a [`sqlx::Transaction`] does, so queries run on `&mut *tx`. Dropped without
/// [`commit`](Self::commit), it rolls back.
#[must_use = "a fenced transaction rolls back unless committed"]
pub struct FencedTransaction<'c, DB: OutcomeDatabase> {
    tx: sqlx::Transaction<'c, DB>,
}

impl<DB: OutcomeDatabase> FencedTransaction<'_, DB> {
    /// Commits the fence and the writes made through this transaction.
    pub async fn commit(self) -> Result<()> {
        self.tx.commit().await.map_err(sql_failure)
    }

    /// Rolls back the fence and the writes made through this transaction.
    pub async fn rollback(self) -> Result<()> {
        self.tx.rollback().await.map_err(sql_failure)
    }
}

impl<DB: OutcomeDatabase> Deref for FencedTransaction<'_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        &self.tx
    }
}

impl<DB: OutcomeDatabase> DerefMut for FencedTransaction<'_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.tx
    }
}

impl<DB: OutcomeDatabase> std::fmt::Debug for FencedTransaction<'_, DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedTransaction").finish_non_exhaustive()
    }
}
