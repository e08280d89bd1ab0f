//! The live-load signal: an API process counts the requests it serves and, every half second
//! in which it served some, writes their rate to `live_load` (one row per process). The
//! command service (and the single-node process) writes it; the query service, which never
//! writes, counts its requests without writing them.
//! Background work that competes with requests for the machine reads the sum of the rows of
//! the last second ([`live_rate`]) and yields in proportion (the imports worker). A server
//! that serves nothing writes nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool};

/// Requests this process served since its writer last took them.
static SERVED: AtomicU64 = AtomicU64::new(0);

const EVERY: Duration = Duration::from_millis(500);

/// Counts one request served.
pub(crate) fn served() {
    SERVED.fetch_add(1, Ordering::Relaxed);
}

/// Starts the process's writer (on the primary's pool).
pub fn publish(pool: Pool) {
    let instance = platform::ids::new_id("proc");
    tokio::spawn(async move {
        let mut ticks: u64 = 0;
        loop {
            tokio::time::sleep(EVERY).await;
            let requests = SERVED.swap(0, Ordering::Relaxed);
            if requests == 0 {
                continue;
            }
            ticks += 1;
            let per_second = requests.saturating_mul(1000) / u64::try_from(EVERY.as_millis()).unwrap_or(1000).max(1);
            if let Err(error) = write(&pool, &instance, per_second, ticks % 600 == 1).await {
                tracing::debug!(%error, "the live-load signal was not written");
            }
        }
    });
}

async fn write(pool: &Pool, instance: &str, per_second: u64, prune: bool) -> anyhow::Result<()> {
    let client = pool.get().await?;
    let per_second = i32::try_from(per_second).unwrap_or(i32::MAX);
    client
        .execute(
            "INSERT INTO live_load (instance, at, per_second) VALUES ($1, now(), $2)
             ON CONFLICT (instance) DO UPDATE SET at = now(), per_second = EXCLUDED.per_second",
            &[&instance, &per_second],
        )
        .await?;
    if prune {
        // Rows of processes that have stopped.
        client.execute("DELETE FROM live_load WHERE at < now() - interval '1 hour'", &[]).await?;
    }
    Ok(())
}

/// Requests per second the API servers served lately (0: no live load).
pub async fn live_rate(client: &impl GenericClient) -> Result<i64, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT coalesce(sum(per_second), 0)::bigint FROM live_load WHERE at > now() - interval '1 second'",
            &[],
        )
        .await?;
    Ok(row.get(0))
}
