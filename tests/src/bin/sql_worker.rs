//! One process of the kill test of the transactional outcome (tests/tests/it/idempotency_sql.rs):
//! sends random intents through `Idempotency::transaction` forever, each writing one effect
//! row in its transaction, until the test SIGKILLs it — between a begin and its commit, between
//! a commit and its SUCCESS, anywhere.
//!
//! Usage: `sql_worker <redis-url> <postgres|sqlite> <database-url> <first-intent> <end-intent>`:
//! the intents in order, a few milliseconds inside each body, so a kill lands mid-range.

use std::time::Duration;

use redguard::{Error, Redguard};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [redis, kind, db, first, end] = args.as_slice() else {
        return Err(
            "usage: sql_worker <redis-url> <postgres|sqlite> <database-url> <first-intent> <end-intent>"
                .into(),
        );
    };
    let rg = Redguard::redis(redis.as_str())
        .timeout(Duration::from_millis(200))
        .connect()
        .await?;
    let intents = first.parse::<u64>()?..end.parse::<u64>()?;
    let pid = std::process::id();
    match kind.as_str() {
        "postgres" => {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(2)
                .connect(db)
                .await?;
            for (n, intent) in intents.enumerate() {
                let tx = pool.begin().await?;
                let _ = place(&rg, intent)
                    .transaction(tx)
                    .run(async |mut tx| {
                        let result = async {
                            sqlx::query(
                                "INSERT INTO effects (intent, call_id, start) VALUES ($1, $2, 0)",
                            )
                            .bind(intent as i64)
                            .bind(format!("w{pid}.{n}"))
                            .execute(&mut *tx)
                            .await
                            .map_err(redguard::idempotency::sql_failure)?;
                            Ok::<_, Error>(intent * 7)
                        }
                        .await;
                        (tx, result)
                    })
                    .await;
            }
        }
        _ => {
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(db)
                .busy_timeout(Duration::from_millis(300));
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(2)
                .connect_with(options)
                .await?;
            for (n, intent) in intents.enumerate() {
                let tx = pool.begin().await?;
                let _ = place(&rg, intent)
                    .transaction(tx)
                    .run(async |mut tx| {
                        let result = async {
                            sqlx::query(
                                "INSERT INTO effects (intent, call_id, start) VALUES (?1, ?2, 0)",
                            )
                            .bind(intent as i64)
                            .bind(format!("w{pid}.{n}"))
                            .execute(&mut *tx)
                            .await
                            .map_err(redguard::idempotency::sql_failure)?;
                            Ok::<_, Error>(intent * 7)
                        }
                        .await;
                        (tx, result)
                    })
                    .await;
            }
        }
    }
    Ok(())
}

/// The same guard as the in-process history's calls.
fn place(rg: &Redguard, intent: u64) -> redguard::idempotency::Idempotency {
    rg.idempotency(redguard::key("intent:{n}").part("n", &intent))
        .scope("sql-history")
        .expire(Duration::from_secs(3600))
}
