//! The projector loop: project every live and building version until caught up, then sleep
//! until the log announces new events (LISTEN/NOTIFY), polling as a fallback.

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::Pool;
use shared::log::{EventLog, LOG_CHANNEL};

use crate::Projection;
use crate::runner::{Faults, Outcome, project_batch};

/// Stops a spawned task when the daemon returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long to sleep when caught up and no notification arrives.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// How often expired rate-limit windows and old batch history are purged.
const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(60);

/// Runs until `shutdown` completes. Deletion operations waiting longer than
/// `erasure_blocked_after` for a projection are reported `blocked`. Runs the preparation
/// worker (with `provider`) beside the projections.
pub async fn run(
    pool: Pool,
    database_url: String,
    worker: String,
    erasure_blocked_after: Duration,
    provider: shared::ai::AiProvider,
    shutdown: impl Future<Output = ()>,
) {
    let faults = Faults::from_env();
    let log = EventLog::start(pool.clone(), 16);
    let preparation = tokio::spawn(crate::preparation::run(pool.clone(), database_url.clone(), log.clone(), provider));
    let _stop_preparation = AbortOnDrop(preparation);
    let mut notifications = shared::db::listen(database_url, LOG_CHANNEL);
    tokio::pin!(shutdown);
    let mut last_maintenance = std::time::Instant::now();
    loop {
        if last_maintenance.elapsed() >= MAINTENANCE_INTERVAL {
            last_maintenance = std::time::Instant::now();
            if let Err(error) = shared::ratelimit::purge_expired(&pool).await {
                tracing::warn!(error = format!("{error:#}"), "could not purge rate-limit windows");
            }
            if let Err(error) = purge_batch_history(&pool).await {
                tracing::warn!(error = format!("{error:#}"), "could not purge the projection batch history");
            }
            report_dead_letters(&pool).await;
        }
        let versions = match active_versions(&pool).await {
            Ok(versions) => versions,
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "cannot list projections");
                Vec::new()
            }
        };
        let mut failed = false;
        for (projection, version) in versions {
            loop {
                match project_batch(&pool, projection, version, &worker, &faults).await {
                    Ok(Outcome::Projected { .. }) => continue,
                    Ok(Outcome::CaughtUp { .. } | Outcome::Busy) => break,
                    Err(error) => {
                        tracing::error!(
                            projection = projection.name(),
                            version,
                            error = format!("{error:#}"),
                            "projection failed; retrying"
                        );
                        failed = true;
                        break;
                    }
                }
            }
        }
        if let Err(error) = crate::eraser::run_pass(&pool, &log, erasure_blocked_after).await {
            tracing::warn!(error = format!("{error:#}"), "could not advance record deletions");
        }
        let pause = if failed { Duration::from_secs(1) } else { POLL_INTERVAL };
        tokio::select! {
            () = &mut shutdown => return,
            _ = notifications.recv() => {}
            () = tokio::time::sleep(pause) => {}
        }
        while notifications.try_recv().is_ok() {}
    }
}

/// Repeats, every maintenance pass, that read models hold back quarantined spaces: an open
/// dead letter needs an operator.
async fn report_dead_letters(pool: &Pool) {
    let open = match pool.get().await {
        Ok(client) => crate::quarantine::list_open(&client).await,
        Err(error) => Err(error.into()),
    };
    match open {
        Ok(open) if open.is_empty() => {}
        Ok(open) => {
            for letter in &open {
                tracing::error!(
                    projection = %letter.name,
                    version = letter.version,
                    position = letter.position,
                    space = %letter.space_key,
                    error = %letter.error,
                    "open dead letter: this space's later events are held; fix the cause, then run \
                     `projector dead-letters retry {}`",
                    letter.name
                );
            }
        }
        Err(error) => tracing::warn!(error = format!("{error:#}"), "could not list dead letters"),
    }
}

/// The batch history exists to show overlapping work; a day of it is plenty.
pub async fn purge_batch_history(pool: &Pool) -> anyhow::Result<u64> {
    let client = pool.get().await?;
    Ok(client.execute("DELETE FROM projection_batches WHERE committed_at < now() - interval '1 day'", &[]).await?)
}

async fn active_versions(pool: &Pool) -> anyhow::Result<Vec<(Projection, i32)>> {
    let client = pool.get().await?;
    let rows = client
        .query("SELECT name, version FROM projections WHERE status IN ('live', 'building') ORDER BY name, version", &[])
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| Projection::parse(row.get::<_, &str>(0)).map(|projection| (projection, row.get(1))))
        .collect())
}
