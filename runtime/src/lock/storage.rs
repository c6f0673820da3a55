//! Fencing into storage (feature `sqlx`): a write guarded by a lock commits only if its fence
//! is at least the newest one its resource has seen.

use crate::error::{Error, Result};
use crate::idempotency::transaction::DbFailure;
use crate::idempotency::{OutcomeDatabase, sql_failure};

/// The longest resource name [`advance_fence`] takes, in bytes.
pub const MAX_FENCED_RESOURCE: usize = 512;

/// Records in `tx` that `resource` is written under `fence`, and refuses a stale holder:
/// [`Error::LockLost`] when a write with a newer fence already committed. Call it in the
/// transaction that carries the lock's write (before or after the write) and return its error
/// with `?`: the transaction is then dropped, which rolls back, so the stale holder's write
/// never commits, whatever Redis said when it started.
///
/// A lock is a lease: a holder paused past it (a GC pause, a stalled VM, a stopped process)
/// still runs its body after the next holder entered. Fencing tokens grow with every
/// acquisition ([`fence`](super::fence)), so storage that remembers the newest one can tell
/// the late write from the current one. Here that memory is one row per resource in
/// `redguard_fences` (run [`POSTGRES_MIGRATION`](crate::idempotency::POSTGRES_MIGRATION) or
/// [`SQLITE_MIGRATION`](crate::idempotency::SQLITE_MIGRATION)), updated with the write and
/// locked by it, so two holders' writes to one resource are ordered by the database. The
/// same fence may write again (one section, several transactions); an older one may not.
///
/// ```no_run
/// # async fn f(rg: redguard::Redguard, pool: sqlx::PgPool) -> redguard::Result<()> {
/// use redguard::idempotency::sql_failure;
///
/// rg.lock("stock:SK-1")
///     .run(async {
///         let fence = redguard::lock::fence().expect("inside a lock");
///         let mut tx = pool.begin().await.map_err(sql_failure)?;
///         redguard::lock::advance_fence(&mut tx, "stock:SK-1", fence).await?;
///         sqlx::query("UPDATE stock SET available = available - 1 WHERE sku = 'SK-1'")
///             .execute(&mut *tx)
///             .await
///             .map_err(sql_failure)?;
///         tx.commit().await.map_err(sql_failure)
///     })
///     .await
/// # }
/// ```
pub async fn advance_fence<DB: OutcomeDatabase>(
    tx: &mut sqlx::Transaction<'_, DB>,
    resource: &str,
    fence: u64,
) -> Result<()> {
    if resource.is_empty() || resource.len() > MAX_FENCED_RESOURCE {
        return Err(Error::Config(format!(
            "a fenced resource is 1 to {MAX_FENCED_RESOURCE} bytes, not {}",
            resource.len()
        )));
    }
    // Redis hands out fences below 2^53; anything larger did not come from a lock.
    let value = i64::try_from(fence)
        .map_err(|_| Error::Config(format!("{fence} is not a fencing token of a lock")))?;
    match DB::__advance_fence(&mut **tx, resource, value).await {
        Ok(0) => Err(Error::LockLost {
            key: resource.to_owned(),
        }),
        Ok(_) => Ok(()),
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
