//! The background job: close orders left unpaid, on every instance's tick, one instance at a
//! time.

use std::time::Duration;

use redguard::dist_lock;
use tokio::sync::watch;

use crate::db::now_ms;
use crate::error::ApiError;
use crate::orders::{App, Shared};

/// One run. `skip_if_held`: when another instance is running it, this tick does nothing.
/// Each run is recorded with its fencing token, so overlapping runs would show in `job_runs`.
#[dist_lock(key = "job:close-unpaid", lease = "30s", skip_if_held)]
async fn close_unpaid_once(app: &App) -> Result<usize, ApiError> {
    let fence = redguard::lock::fence().unwrap_or(0);
    let deadline = app.config.deadline();
    let started = now_ms();
    let timeout = i64::try_from(app.config.unpaid_timeout().as_millis()).unwrap_or(i64::MAX);
    let closed = app
        .db
        .close_unpaid(deadline, started.saturating_sub(timeout))
        .await?;
    let ended = now_ms();
    app.db
        .record_job_run(
            deadline,
            app.instance.clone(),
            started,
            ended,
            fence,
            closed,
        )
        .await?;
    // redguard's outcome rows past their expiry; an order outlives its row (`orders::place`).
    let mut writer = app.db.writer(deadline).await?;
    redguard::idempotency::purge_expired::<sqlx::Sqlite>(&mut writer, 1000).await?;
    Ok(closed)
}

/// Runs the job every tick until `stop` turns true; a run in progress finishes first (and
/// releases its lock).
pub(crate) async fn run(app: Shared, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(app.config.job_tick());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        match close_unpaid_once(&app).await {
            Ok(0) => {}
            Ok(closed) => tracing::info!(closed, "closed unpaid orders"),
            Err(ApiError::Guard(redguard::Error::LockHeld { .. })) => {}
            Err(err) => {
                tracing::warn!(error = ?err, "unpaid-order job failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
