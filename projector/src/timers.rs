//! The due-time scheduler: work that must happen at (or after) a time, durably. Webhook
//! retries, email retries, broadcast schedules and workflow waits are timers.
//!
//! A timer is a row of `timers`: a kind (which handler runs it), a key unique within the kind
//! (so scheduling the same thing twice keeps one timer), when it is due, a JSON payload and the
//! attempts made. [`TimerWorker`] runs one kind on the worker runtime: each step claims the due
//! timers of its kind `FOR UPDATE SKIP LOCKED` in one transaction, hands each to the handler,
//! and deletes it when done or moves it to its next attempt (with a jittered exponential
//! backoff) in the same transaction. Any number of processes may run the same kind: a claimed
//! timer is invisible to the others until the claim's transaction ends, and a process that
//! dies mid-claim releases its timers with its connection, so another process runs them.

use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder;
use chrono::{DateTime, Utc};
use deadpool_postgres::{GenericClient, Pool, Transaction};
use futures_util::future::BoxFuture;
use serde_json::Value;

use crate::runtime::{Outcome, Worker};

/// The channel notified when a timer is scheduled to be due at once.
pub(crate) const TIMERS_CHANNEL: &str = "timers_due";

/// A claimed timer.
#[derive(Debug, Clone, PartialEq)]
pub struct Timer {
    pub id: i64,
    pub kind: String,
    pub key: String,
    pub due_at: DateTime<Utc>,
    pub payload: Value,
    /// Attempts made before this one.
    pub attempts: i32,
}

/// Schedules (or moves) timer `key` of `kind` to `due_at` with `payload`, in the caller's
/// transaction, so a timer commits with the state change that needs it.
pub async fn schedule(
    client: &impl GenericClient,
    kind: &str,
    key: &str,
    due_at: DateTime<Utc>,
    payload: &Value,
) -> Result<(), tokio_postgres::Error> {
    let statement = client
        .prepare_cached(
            "INSERT INTO timers (kind, key, due_at, payload) VALUES ($1, $2, $3, $4)
             ON CONFLICT (kind, key) DO UPDATE SET due_at = EXCLUDED.due_at, payload = EXCLUDED.payload",
        )
        .await?;
    client.execute(&statement, &[&kind, &key, &due_at, payload]).await?;
    Ok(())
}

/// Schedules timers `keys[i]` of `kind`, due at `due_at[i]` with `payloads[i]`, keeping the
/// due time of one already scheduled earlier, in the caller's transaction.
pub(crate) async fn schedule_earliest(
    client: &impl GenericClient,
    kind: &str,
    keys: &[&String],
    due_at: &[DateTime<Utc>],
    payloads: &[Value],
) -> Result<(), tokio_postgres::Error> {
    let statement = client
        .prepare_cached(
            "INSERT INTO timers (kind, key, due_at, payload)
             SELECT $1, key, due_at, payload FROM unnest($2::text[], $3::timestamptz[], $4::jsonb[]) AS t(key, due_at, payload)
             ON CONFLICT (kind, key) DO UPDATE SET due_at = LEAST(timers.due_at, EXCLUDED.due_at),
                 payload = EXCLUDED.payload",
        )
        .await?;
    client.execute(&statement, &[&kind, &keys, &due_at, &payloads]).await?;
    Ok(())
}

/// Claims up to `limit` due timers of `kind`, oldest first, skipping those other processes
/// hold. The claim lasts as long as `transaction`.
pub async fn claim_due(transaction: &Transaction<'_>, kind: &str, limit: i64) -> anyhow::Result<Vec<Timer>> {
    let statement = transaction
        .prepare_cached(
            "SELECT id, kind, key, due_at, payload, attempts FROM timers
             WHERE kind = $1 AND due_at <= clock_timestamp() ORDER BY due_at, id LIMIT $2 FOR UPDATE SKIP LOCKED",
        )
        .await?;
    let rows = transaction.query(&statement, &[&kind, &limit]).await?;
    Ok(rows
        .into_iter()
        .map(|row| Timer {
            id: row.get(0),
            kind: row.get(1),
            key: row.get(2),
            due_at: row.get(3),
            payload: row.get(4),
            attempts: row.get(5),
        })
        .collect())
}

/// The delay before attempt `attempts + 1` of a timer that failed: exponential from 1 s to an
/// hour, with jitter.
pub(crate) fn retry_delay(attempts: i32) -> Duration {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(3600))
        .with_jitter()
        .without_max_times()
        .build()
        .nth(usize::try_from(attempts).unwrap_or(0))
        .unwrap_or(Duration::from_secs(3600))
}

/// What a handler made of a timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// Done: the timer is deleted.
    Done,
    /// Try again later: after `retry_delay(attempts)`.
    Retry(String),
    /// Try again at a time of the handler's choosing.
    RetryAt(DateTime<Utc>),
}

/// What runs the timers of one kind. Its database effects go in `transaction`, which also
/// deletes or reschedules the timer.
pub trait TimerHandler: Send + Sync + 'static {
    fn kind(&self) -> &'static str;

    fn handle<'a>(
        &'a self,
        transaction: &'a Transaction<'a>,
        timer: &'a Timer,
    ) -> BoxFuture<'a, anyhow::Result<Handled>>;
}

/// Runs one kind of timer on the worker runtime.
pub struct TimerWorker {
    pool: Pool,
    handler: Arc<dyn TimerHandler>,
    batch: i64,
    poll: Duration,
}

impl TimerWorker {
    pub fn new(pool: Pool, handler: Arc<dyn TimerHandler>) -> Self {
        Self { pool, handler, batch: 50, poll: Duration::from_millis(500) }
    }

    async fn run_due(&self) -> anyhow::Result<Outcome> {
        let mut client = self.pool.get().await?;
        let transaction = client.transaction().await?;
        transaction.batch_execute("SET LOCAL idle_in_transaction_session_timeout = 0").await?;
        let timers = claim_due(&transaction, self.handler.kind(), self.batch).await?;
        if timers.is_empty() {
            return Ok(Outcome::Idle);
        }
        for timer in &timers {
            transaction.batch_execute("SAVEPOINT timer").await?;
            let handled = match self.handler.handle(&transaction, timer).await {
                Ok(handled) => {
                    transaction.batch_execute("RELEASE SAVEPOINT timer").await?;
                    handled
                }
                Err(error) => {
                    // The handler's partial effects go; the timer stays, for a later attempt.
                    transaction.batch_execute("ROLLBACK TO SAVEPOINT timer").await?;
                    Handled::Retry(format!("{error:#}"))
                }
            };
            match handled {
                Handled::Done => {
                    transaction.execute("DELETE FROM timers WHERE id = $1", &[&timer.id]).await?;
                }
                Handled::Retry(reason) => {
                    let delay_seconds = retry_delay(timer.attempts).as_secs_f64();
                    tracing::warn!(kind = %timer.kind, key = %timer.key, attempts = timer.attempts + 1, %reason,
                        "a timer will be tried again");
                    transaction
                        .execute(
                            "UPDATE timers SET due_at = clock_timestamp() + make_interval(secs => $2), attempts = attempts + 1
                             WHERE id = $1",
                            &[&timer.id, &delay_seconds],
                        )
                        .await?;
                }
                Handled::RetryAt(due_at) => {
                    transaction
                        .execute(
                            "UPDATE timers SET due_at = $2, attempts = attempts + 1 WHERE id = $1",
                            &[&timer.id, &due_at],
                        )
                        .await?;
                }
            }
        }
        transaction.commit().await?;
        Ok(Outcome::Progressed)
    }
}

impl Worker for TimerWorker {
    fn name(&self) -> String {
        format!("timers:{}", self.handler.kind())
    }

    fn channels(&self) -> &'static [&'static str] {
        &[TIMERS_CHANNEL]
    }

    fn poll_interval(&self) -> Duration {
        self.poll
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(self.run_due())
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async {
            // Not a log follower: its backlog is the due timers, counted in metrics instead.
            let client = self.pool.get().await?;
            let due: i64 = client
                .query_one(
                    "SELECT count(*) FROM timers WHERE kind = $1 AND due_at <= clock_timestamp()",
                    &[&self.handler.kind()],
                )
                .await?
                .get(0);
            metrics::gauge!("timers_due", "kind" => self.handler.kind()).set(due as f64);
            Ok(None)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_exponentially_with_jitter_within_bounds() {
        let first = retry_delay(0);
        assert!(first >= Duration::from_secs(1) && first <= Duration::from_secs(2), "{first:?}");
        let fifth = retry_delay(4);
        assert!(fifth >= Duration::from_secs(16) && fifth <= Duration::from_secs(32), "{fifth:?}");
        assert!(retry_delay(40) <= Duration::from_secs(3600 * 2));
    }
}
