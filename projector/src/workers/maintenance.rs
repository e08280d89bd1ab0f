//! Periodic upkeep, once a minute under the lease `maintenance` (one process at a time):
//! expired rate-limit windows, old projection batch history, completed idempotency records
//! past their 24 hours, unresolved idempotency claims that provably wrote nothing, event
//! receipts past their retention, inbound report digests past the time a sender retries
//! (30 days), soft bounces past the soft-bounce window, and a loud report of open dead
//! letters. Once a day (the first pass of each UTC day): marketing sends older than any
//! frequency cap can count.

use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool};
use futures_util::future::BoxFuture;

use crate::runtime::{Lease, LeaseName, Outcome, Worker};

const INTERVAL: Duration = Duration::from_secs(60);
/// Receipts retired per statement.
const RETIRE_STEP: i64 = 10_000;
/// Marketing sends pruned per statement.
const PRUNE_STEP: i64 = 10_000;
const DAY_SECONDS: i64 = 86_400;

/// Maintenance's lease and checkpoint name; its checkpoint holds the time of its last run,
/// not a log position.
pub(crate) const LEASE: &str = "maintenance";

pub struct Maintenance {
    pool: Pool,
    receipt_retention: Duration,
    soft_bounce_window: Duration,
    lease: LeaseName,
}

impl Maintenance {
    pub fn new(pool: Pool, receipt_retention: Duration, soft_bounce_window: Duration) -> Self {
        Self { pool, receipt_retention, soft_bounce_window, lease: LeaseName::new(LEASE) }
    }

    async fn pass(&self) -> anyhow::Result<Outcome> {
        let mut client = self.pool.get().await?;
        let Some(lease) = Lease::acquire(&mut client, &self.lease).await? else { return Ok(Outcome::Idle) };
        let client = self.pool.get().await?;
        api::ratelimit::purge_expired(&client).await?;
        client.execute("DELETE FROM projection_batches WHERE committed_at < now() - interval '1 day'", &[]).await?;
        let (purged, released) = purge_and_reconcile(&client).await?;
        client.execute("DELETE FROM inbound_reports WHERE received_at < now() - interval '30 days'", &[]).await?;
        // The ingest's failed messages (the callers' data) go after 30 days.
        client.execute("DELETE FROM ingest_failures WHERE received_at < now() - interval '30 days'", &[]).await?;
        client
            .execute(
                "DELETE FROM soft_bounces WHERE bounced_at < now() - make_interval(secs => $1)",
                &[&self.soft_bounce_window.as_secs_f64()],
            )
            .await?;
        let mut retired = 0;
        loop {
            let step = retire_receipts(&client, self.receipt_retention, RETIRE_STEP).await?;
            retired += step;
            if step < RETIRE_STEP as u64 {
                break;
            }
        }
        if purged + released + retired > 0 {
            tracing::info!(purged, released, retired, "maintenance pass");
        }
        report_dead_letters(&client).await?;
        let now = chrono::Utc::now().timestamp();
        // The checkpoint holds the time of the last pass: a new day prunes once.
        if lease.checkpoint.div_euclid(DAY_SECONDS) != now.div_euclid(DAY_SECONDS) {
            let pruned = prune_marketing_sends(&client, now * 1000).await?;
            if pruned > 0 {
                tracing::info!(pruned, "old marketing sends pruned");
            }
        }
        lease.commit(now).await?;
        Ok(Outcome::Idle)
    }
}

impl Worker for Maintenance {
    fn name(&self) -> String {
        "maintenance".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[]
    }

    fn poll_interval(&self) -> Duration {
        INTERVAL
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(self.pass())
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async { Ok(None) })
    }
}

/// Deletes completed idempotency records older than 24 hours (the key then executes again)
/// and releases unresolved claims whose operation appended nothing: an outcome is recorded
/// atomically with its append, so an unresolved claim with no event appended under its key
/// since the claim wrote nothing, and the key may run again. Also forgets the heartbeat rows
/// of processes that stopped a day ago, and their membership of workers that share rows
/// out (`liveness::Share`). Returns `(purged, released)`.
pub async fn purge_and_reconcile(client: &impl GenericClient) -> anyhow::Result<(u64, u64)> {
    let purged = client
        .execute(
            "DELETE FROM idempotency_records WHERE state = 'completed' AND completed_at < now() - interval '24 hours'",
            &[],
        )
        .await?;
    // A claim is marked unresolved at once when its outcome is not known, and no append can
    // complete under it after that (the completion guards need `processing`): what the log
    // holds for it is final, and one look, on the first pass after, settles it. Claims from
    // the last day are looked at (a claim whose operation did append stays unresolved, as the
    // contract keeps it, and is not read again after a day); the log only from each claim's
    // time on (`events_recorded_at`, V33), not the whole of it. The look is a subquery per
    // claim on purpose: as `NOT EXISTS` the planner hashes the whole log (1.7 s for 3 million
    // events, each pass, while any such claim stood); per claim it reads the pages since.
    let released = client
        .execute(
            "DELETE FROM idempotency_records r WHERE r.state = 'unresolved'
             AND r.claimed_at > now() - interval '1 day'
             AND (SELECT 1 FROM events e WHERE e.recorded_at >= r.claimed_at
                  AND e.actor_key_id = r.key_id AND e.idempotency_key = r.idempotency_key LIMIT 1) IS NULL",
            &[],
        )
        .await?;
    client.execute("DELETE FROM process_beats WHERE beat_at < now() - interval '1 day'", &[]).await?;
    client
        .execute(
            "DELETE FROM worker_members m WHERE NOT EXISTS (SELECT 1 FROM process_beats b WHERE b.process_id = m.process_id)",
            &[],
        )
        .await?;
    Ok((purged, released))
}

/// Deletes the marketing sends recorded before any frequency cap can count them at `now_ms`
/// (the longest window a cap may have, `Window::longest_lookback_ms`), a step at a time.
/// Returns how many went.
pub async fn prune_marketing_sends(client: &impl GenericClient, now_ms: i64) -> anyhow::Result<u64> {
    let before = now_ms - domain::email::send::policy::Window::longest_lookback_ms();
    let statement = client
        .prepare_cached(
            "DELETE FROM marketing_sends WHERE ctid = ANY(ARRAY(
                 SELECT ctid FROM marketing_sends WHERE at_ms < $1 LIMIT $2))",
        )
        .await?;
    let mut pruned = 0;
    loop {
        let step = client.execute(&statement, &[&before, &PRUNE_STEP]).await?;
        pruned += step;
        if step < PRUNE_STEP as u64 {
            return Ok(pruned);
        }
    }
}

/// Retires receipts accepted more than `retention` ago whose preparation is over, at most
/// `limit` per call, giving their capacity back to the scopes they counted in. Returns how
/// many were retired.
pub async fn retire_receipts(client: &impl GenericClient, retention: Duration, limit: i64) -> anyhow::Result<u64> {
    let seconds = retention.as_secs_f64();
    let statement = client
        .prepare_cached(
            "WITH gone AS (
                 DELETE FROM event_receipts WHERE id IN (
                     SELECT id FROM event_receipts
                     WHERE NOT pending AND accepted_at < now() - make_interval(secs => $1)
                     ORDER BY accepted_at LIMIT $2 FOR UPDATE SKIP LOCKED)
                 RETURNING space_id, schema_id),
             counted AS (
                 SELECT 'space:' || space_id AS scope, count(*) AS n FROM gone GROUP BY space_id
                 UNION ALL SELECT 'schema:' || schema_id, count(*) FROM gone GROUP BY schema_id
                 UNION ALL SELECT 'fleet', count(*) FROM gone),
             released AS (
                 UPDATE event_admission a SET receipts = GREATEST(a.receipts - counted.n, 0)
                 FROM counted WHERE a.scope = counted.scope AND counted.n > 0)
             SELECT count(*) FROM gone",
        )
        .await?;
    let row = client.query_one(&statement, &[&seconds, &limit]).await?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

/// Repeats, every pass, that read models hold back quarantined spaces: an open dead letter
/// needs an operator.
async fn report_dead_letters(client: &impl GenericClient) -> anyhow::Result<()> {
    let open = crate::read_models::quarantine::list_open(client).await?;
    metrics::gauge!("dead_letters_open").set(open.len() as f64);
    for letter in &open {
        tracing::error!(
            projection = %letter.name,
            version = letter.version,
            position = letter.position,
            space = %letter.space_key,
            error = %letter.error,
            "open dead letter: fix the cause, then run `projector dead-letters retry {}`",
            letter.name
        );
    }
    Ok(())
}
