//! The live-load signal: an API process counts the requests it serves and, every half second
//! in which it served some, writes their rate to `live_load` (one row per process). The
//! command service (and the single-node process) writes it; the query service, which never
//! writes, counts its requests without writing them.
//! Background work that competes with requests for the machine reads the sum of the rows of
//! the last second ([`live_rate`]) and yields in proportion ([`yield_to_live`]: the imports
//! worker after each wave, a read model's rebuild after each batch). A server that serves
//! nothing writes nothing.

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

/// Waits after a step of background work that took `elapsed`, in proportion to the live load
/// ([`pause`]), and adds the wait to the counter `metric`; answers how long it waited.
pub async fn yield_to_live(
    pool: &Pool,
    elapsed: Duration,
    factor: f64,
    metric: &'static str,
) -> anyhow::Result<Duration> {
    if factor <= 0.0 {
        return Ok(Duration::ZERO);
    }
    let live = live_rate(&pool.get().await?).await?;
    let pause = pause(elapsed, live, factor);
    if !pause.is_zero() {
        metrics::counter!(metric).increment(u64::try_from(pause.as_millis()).unwrap_or(u64::MAX));
        tokio::time::sleep(pause).await;
    }
    Ok(pause)
}

/// The size of background work's next step: `live` after a step it paused after (it yields
/// to live requests: a smaller step's commit is a shorter wait for the live writes queued
/// behind it), `quiet` otherwise.
pub fn next_step<T>(paused: Duration, quiet: T, live: T) -> T {
    if paused.is_zero() { quiet } else { live }
}

/// The size of background work's first step, by whether it would yield now (see
/// [`next_step`]); with `factor` 0 it never yields.
pub async fn first_step<T>(pool: &Pool, factor: f64, quiet: T, live: T) -> anyhow::Result<T> {
    if factor <= 0.0 {
        return Ok(quiet);
    }
    Ok(if live_rate(&pool.get().await?).await? > 0 { live } else { quiet })
}

/// How long to wait after a step that took `elapsed`, with the API servers serving `live`
/// requests a second: `factor` times the step at [`FULL_LIVE`] requests a second or more, in
/// proportion below (a poll now and then barely slows the work), at most [`MAX_PAUSE`].
pub fn pause(elapsed: Duration, live: i64, factor: f64) -> Duration {
    if live <= 0 || factor <= 0.0 {
        return Duration::ZERO;
    }
    let share = (live as f64 / FULL_LIVE).min(1.0);
    elapsed.mul_f64(factor.min(100.0) * share).min(MAX_PAUSE)
}

/// The live request rate at which background work yields fully.
const FULL_LIVE: f64 = 100.0;

/// The longest wait between two steps, however long a step took.
const MAX_PAUSE: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_step_after_a_pause_is_the_smaller_one() {
        assert_eq!(super::next_step(Duration::ZERO, 1_000, 100), 1_000, "quiet: the full step");
        assert_eq!(super::next_step(Duration::from_millis(5), 1_000, 100), 100, "it yielded: the live step");
    }

    #[test]
    fn a_step_is_followed_by_a_pause_only_while_requests_are_served() {
        let step = Duration::from_millis(100);
        assert_eq!(super::pause(step, 0, 3.0), Duration::ZERO, "no live load: full pace");
        assert_eq!(super::pause(step, 400, 3.0), Duration::from_millis(300), "busy: a quarter of its pace");
        assert_eq!(super::pause(step, 50, 3.0), Duration::from_millis(150), "in proportion below");
        assert_eq!(super::pause(step, 2, 3.0), Duration::from_millis(6), "a poll barely slows it");
        assert_eq!(super::pause(step, 400, 0.0), Duration::ZERO, "never yields");
        assert_eq!(super::pause(Duration::from_secs(5), 400, 3.0), super::MAX_PAUSE);
    }
}
