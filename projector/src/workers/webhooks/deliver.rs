//! Deliver: attempts the due deliveries of the outbox. Any number of processes run it.
//!
//! A step claims due deliveries in one short transaction (serialised between processes by
//! an advisory lock, so the per-webhook bound holds fleet-wide): it leases each for the
//! attempt timeout plus a margin and counts the attempt. Each attempt then runs in a task of
//! its own, at most `concurrency` per process and `per_webhook_concurrency` per webhook, so
//! a slow or dead receiver holds back only its own webhook. The attempt's outcome, the
//! delivery's next state and the webhook's counters are recorded by one statement that
//! matches the lease token; a process that dies mid-attempt loses its leases when they
//! expire, and another process attempts again. That is the only way a receiver can see a
//! delivery twice after answering 2xx.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use domain::webhooks::signing::{Secret, signature_header};
use domain::webhooks::state::secret_subject;
use domain::webhooks::target;
use platform::crypto::Keys;
use platform::log::{AppendError, AppendRequest, EventLog};
use platform::proto;
use platform::settings::WebhookSettings;
use prost::Message;
use rand::Rng;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use super::decide::{Next, Plan, VersionedSecret, next_state, pause, plan_send};
use super::enqueue::DELIVERIES_CHANNEL;
use crate::runtime::{Outcome, Worker};
use crate::workers::outbound::{AttemptResult, classify, describe, retry_after};

/// Deliveries claimed per step at most.
const CLAIM_MAX: usize = 256;
/// How much longer than the attempt timeout a lease lasts, at most (and at least as long as
/// the timeout itself).
const LEASE_MARGIN: Duration = Duration::from_secs(30);
/// The advisory lock that serialises claims between processes.
const CLAIM_LOCK: i64 = 7_305_001;

/// A claimed delivery, ready to attempt or to drop.
struct Claimed {
    delivery_id: String,
    webhook_id: String,
    space_id: String,
    url: String,
    lease_token: Uuid,
    /// Attempts counted so far, this one included.
    attempts: i32,
    /// Attempts made before the owner's latest replay.
    attempt_base: i32,
    created_at: DateTime<Utc>,
    plan: Plan,
}

/// An attempt's outcome, on its way to the recorder.
struct AttemptOutcome {
    delivery_id: String,
    lease_token: Uuid,
    state: &'static str,
    status: Option<i32>,
    error: Option<String>,
    delay_seconds: Option<f64>,
    latency_ms: i32,
    failed: bool,
}

/// What the recorder answers an attempt: whether its webhook's circuit breaker opened (with
/// the consecutive failures), once its outcome is committed.
type Recorded = anyhow::Result<Option<i64>>;

type ToRecord = (AttemptOutcome, tokio::sync::oneshot::Sender<Recorded>);

/// The most outcomes one statement records.
const RECORD_BATCH: usize = 256;

/// Records outcomes as they come, every outcome that arrived while the previous statement ran
/// in one statement (and one commit): the outcome, the attempt in the delivery log and the
/// webhook's counters, each row only if its lease token still matches. Ends when the worker
/// is dropped.
async fn recorder(pool: Pool, settings: WebhookSettings, mut outcomes: tokio::sync::mpsc::UnboundedReceiver<ToRecord>) {
    let mut batch = Vec::with_capacity(RECORD_BATCH);
    while outcomes.recv_many(&mut batch, RECORD_BATCH).await > 0 {
        let (items, replies): (Vec<AttemptOutcome>, Vec<_>) = batch.drain(..).unzip();
        match record_batch(&pool, &settings, &items).await {
            Ok(opened) => {
                for (item, reply) in items.iter().zip(replies) {
                    let _ = reply.send(Ok(opened.get(&item.delivery_id).copied()));
                }
            }
            Err(error) => {
                let message = format!("{error:#}");
                for reply in replies {
                    let _ = reply.send(Err(anyhow::anyhow!("recording the outcomes failed: {message}")));
                }
            }
        }
    }
}

/// One statement for a batch of outcomes. Counters follow the outcomes in their order: a
/// webhook's consecutive failures are those after its last success in the batch (added to
/// the stored run when the batch has no success). Returns, by delivery, the consecutive
/// failures of each webhook whose circuit breaker opened (keyed by its last failed delivery).
async fn record_batch(
    pool: &Pool,
    settings: &WebhookSettings,
    items: &[AttemptOutcome],
) -> anyhow::Result<HashMap<String, i64>> {
    let client = pool.get().await?;
    let statement = client
        .prepare_cached(
            "WITH input AS (
                 SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::int[], $5::text[], $6::float8[],
                                      $7::int[], $8::bool[])
                     WITH ORDINALITY AS i(delivery_id, token, state, status, error, delay, latency, failed, n)),
             done AS (
                 UPDATE webhook_deliveries d
                 SET state = i.state, leased_until = NULL, lease_token = NULL, last_status = i.status,
                     last_error = i.error,
                     next_attempt_at = CASE WHEN i.delay IS NULL THEN d.next_attempt_at
                                            ELSE clock_timestamp() + make_interval(secs => i.delay) END,
                     finished_at = CASE WHEN i.state = 'pending' THEN NULL ELSE clock_timestamp() END
                 FROM input i WHERE d.delivery_id = i.delivery_id AND d.lease_token = i.token
                 RETURNING d.delivery_id, d.webhook_id, d.attempts, i.status, i.latency, i.error, i.failed, i.n),
             logged AS (
                 INSERT INTO webhook_attempts (delivery_id, attempt, attempted_at, status, latency_ms, error)
                 SELECT delivery_id, attempts, clock_timestamp(), status, latency, error FROM done
                 ON CONFLICT DO NOTHING),
             marks AS (SELECT webhook_id, max(n) FILTER (WHERE NOT failed) AS last_ok, max(n) AS last
                       FROM done GROUP BY webhook_id),
             per_webhook AS (
                 SELECT d.webhook_id, count(*) AS calls, count(*) FILTER (WHERE d.failed) AS failures,
                        count(*) FILTER (WHERE d.failed AND d.n > COALESCE(m.last_ok, 0)) AS trailing,
                        m.last_ok IS NOT NULL AS any_ok,
                        (array_agg(d.error ORDER BY d.n DESC))[1] AS last_error,
                        (array_agg(d.delivery_id ORDER BY d.n DESC))[1] AS last_delivery
                 FROM done d JOIN marks m USING (webhook_id) GROUP BY d.webhook_id, m.last_ok)
             UPDATE webhook_counters c
             SET total_calls = c.total_calls + p.calls,
                 failed_calls = c.failed_calls + p.failures,
                 failed_calls_in_a_row = CASE WHEN p.any_ok THEN p.trailing ELSE c.failed_calls_in_a_row + p.trailing END,
                 failing_since = CASE WHEN p.trailing = 0 THEN NULL
                                      WHEN p.any_ok THEN clock_timestamp()
                                      ELSE COALESCE(c.failing_since, clock_timestamp()) END,
                 last_called_at = clock_timestamp(),
                 last_call_error_message = p.last_error
             FROM per_webhook p WHERE c.webhook_id = p.webhook_id
             RETURNING p.last_delivery, c.failed_calls_in_a_row, p.trailing > 0,
                       c.failing_since <= clock_timestamp() - make_interval(secs => $9::float8)",
        )
        .await?;
    let ids: Vec<&str> = items.iter().map(|item| item.delivery_id.as_str()).collect();
    let tokens: Vec<Uuid> = items.iter().map(|item| item.lease_token).collect();
    let states: Vec<&str> = items.iter().map(|item| item.state).collect();
    let statuses: Vec<Option<i32>> = items.iter().map(|item| item.status).collect();
    let errors: Vec<Option<&str>> = items.iter().map(|item| item.error.as_deref()).collect();
    let delays: Vec<Option<f64>> = items.iter().map(|item| item.delay_seconds).collect();
    let latencies: Vec<i32> = items.iter().map(|item| item.latency_ms).collect();
    let failed: Vec<bool> = items.iter().map(|item| item.failed).collect();
    let window = settings.breaker_window_seconds as f64;
    let rows = client
        .query(&statement, &[&ids, &tokens, &states, &statuses, &errors, &delays, &latencies, &failed, &window])
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| {
            let (last_delivery, in_a_row, failing, window_passed): (String, i64, bool, Option<bool>) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            let open = failing && in_a_row >= settings.breaker_failures && window_passed == Some(true);
            open.then_some((last_delivery, in_a_row))
        })
        .collect())
}

struct Inner {
    pool: Pool,
    log: EventLog,
    http: reqwest::Client,
    settings: WebhookSettings,
    slots: Arc<Semaphore>,
    /// Signalled when an attempt of this process ends, which may let a webhook at its
    /// concurrency bound have its next delivery claimed.
    finished: tokio::sync::Notify,
    /// The recorder's queue (see [`recorder`]), started with the first step.
    recorder: tokio::sync::mpsc::UnboundedSender<ToRecord>,
    recorder_queue: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<ToRecord>>>,
}

pub struct Deliver(Arc<Inner>);

impl Deliver {
    pub fn new(pool: Pool, log: EventLog, settings: &WebhookSettings) -> anyhow::Result<Self> {
        let timeout = Duration::from_millis(settings.attempt_timeout_ms.max(1));
        let agent = concat!("platform-webhooks/", env!("CARGO_PKG_VERSION"));
        let http = crate::workers::outbound::client(timeout, settings.allow_loopback, agent)?;
        let slots = Arc::new(Semaphore::new(settings.concurrency.max(1)));
        let finished = tokio::sync::Notify::new();
        let (recorder, queue) = tokio::sync::mpsc::unbounded_channel();
        let recorder_queue = std::sync::Mutex::new(Some(queue));
        let settings = settings.clone();
        Ok(Self(Arc::new(Inner { pool, log, http, settings, slots, finished, recorder, recorder_queue })))
    }

    async fn run(&self) -> anyhow::Result<Outcome> {
        // The recorder runs as long as the worker (its queue closes when the worker goes).
        if let Some(queue) = self.0.recorder_queue.lock().ok().and_then(|mut queue| queue.take()) {
            tokio::spawn(recorder(self.0.pool.clone(), self.0.settings.clone(), queue));
        }
        // At least one free slot; while every slot is busy, wait a little for one.
        let Ok(Ok(first)) = tokio::time::timeout(Duration::from_secs(1), self.0.slots.clone().acquire_owned()).await
        else {
            return Ok(Outcome::Idle);
        };
        let mut permits = vec![first];
        while permits.len() < CLAIM_MAX {
            match self.0.slots.clone().try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        let claimed = self.0.claim(permits.len()).await?;
        if claimed.is_empty() {
            drop(permits);
            let in_flight = self.0.slots.available_permits() < self.0.settings.concurrency.max(1);
            if in_flight {
                // Due deliveries may be waiting for an attempt of this process to end (the
                // per-webhook bound): claim again as soon as one does.
                let _ = tokio::time::timeout(self.poll_interval(), self.0.finished.notified()).await;
                return Ok(Outcome::Progressed);
            }
            return Ok(Outcome::Idle);
        }
        for (delivery, permit) in claimed.into_iter().zip(permits) {
            let inner = self.0.clone();
            tokio::spawn(async move { inner.attempt(delivery, permit).await });
        }
        Ok(Outcome::Progressed)
    }
}

impl Inner {
    /// Claims up to `limit` due deliveries and prepares each: its body opened and its secrets
    /// chosen, or the reason it is dropped.
    async fn claim(&self, limit: usize) -> anyhow::Result<Vec<Claimed>> {
        let mut client = self.pool.get().await?;
        let transaction = client.transaction().await?;
        let token = Uuid::now_v7();
        let limit = i64::try_from(limit).unwrap_or(1);
        let timeout = Duration::from_millis(self.settings.attempt_timeout_ms);
        let lease = (timeout + timeout.min(LEASE_MARGIN)).as_secs_f64();
        let claim = transaction
            .prepare_cached(
                "WITH busy AS (
                     SELECT webhook_id, count(*) AS n FROM webhook_deliveries
                     WHERE state = 'pending' AND leased_until > clock_timestamp() GROUP BY webhook_id),
                 due AS (
                     SELECT d.delivery_id, d.next_attempt_at,
                            row_number() OVER (PARTITION BY d.webhook_id ORDER BY d.next_attempt_at, d.delivery_id)
                              + COALESCE(b.n, 0) AS slot
                     FROM (SELECT delivery_id, webhook_id, next_attempt_at FROM webhook_deliveries
                           WHERE state = 'pending' AND next_attempt_at <= clock_timestamp()
                             AND (leased_until IS NULL OR leased_until <= clock_timestamp())
                           ORDER BY next_attempt_at LIMIT 2000) d
                     LEFT JOIN busy b USING (webhook_id)),
                 picked AS (SELECT delivery_id FROM due WHERE slot <= $3 ORDER BY next_attempt_at LIMIT $2)
                 UPDATE webhook_deliveries d
                 SET leased_until = clock_timestamp() + make_interval(secs => $4), lease_token = $1,
                     attempts = d.attempts + 1
                 FROM picked WHERE d.delivery_id = picked.delivery_id
                 RETURNING d.delivery_id, d.webhook_id, d.space_id, d.url, d.secret_version, d.subject_id, d.body,
                           d.attempts, d.created_at,
                           (SELECT e.status FROM webhook_endpoints e WHERE e.webhook_id = d.webhook_id),
                           d.attempt_base",
            )
            .await?;
        // A claim is no acknowledgement: losing one in a database crash only lets its
        // deliveries be claimed again. So its commit does not wait for the disk, which keeps
        // the claims (serialised between processes) cheap.
        let lock = transaction.prepare_cached("SELECT pg_advisory_xact_lock($1)").await?;
        let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&CLAIM_LOCK];
        // Its statements find rows by key and by the partial indexes of due and leased rows:
        // `db::CLAIM_SETTINGS` keeps them to those, whatever the table's statistics say.
        tokio::try_join!(
            transaction.batch_execute(platform::db::CLAIM_SETTINGS),
            transaction.execute(&lock, &lock_params)
        )?;
        let per_webhook = self.settings.per_webhook_concurrency.max(1);
        let rows = transaction.query(&claim, &[&token, &limit, &per_webhook, &lease]).await?;
        transaction.commit().await?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let webhooks: Vec<String> = rows.iter().map(|row| row.get(1)).collect();
        let mut subjects: Vec<String> = webhooks.iter().map(|webhook| secret_subject(webhook)).collect();
        subjects.extend(rows.iter().filter_map(|row| row.get::<_, Option<String>>(5)));
        subjects.sort();
        subjects.dedup();
        let keys = platform::crypto::load_keys(&client, &subjects).await?;
        let secrets = self.secrets(&client, &webhooks, &keys).await?;
        let now = Utc::now();
        Ok(rows
            .into_iter()
            .map(|row| {
                let webhook_id: String = row.get(1);
                let subject: Option<String> = row.get(5);
                let status: Option<String> = row.get(9);
                let plan = match status.as_deref() {
                    Some("live") => {
                        plan_send(&keys, subject.as_deref(), row.get(6), secrets.get(&webhook_id), row.get(4), now)
                    }
                    Some("paused") => Plan::Drop("the webhook was paused"),
                    _ => Plan::Drop("the webhook was deleted"),
                };
                Claimed {
                    delivery_id: row.get(0),
                    webhook_id,
                    space_id: row.get(2),
                    url: row.get(3),
                    lease_token: token,
                    attempts: row.get(7),
                    attempt_base: row.get(10),
                    created_at: row.get(8),
                    plan,
                }
            })
            .collect())
    }

    /// The secrets of `webhooks` by version, opened, with when each ceases to be the
    /// "previous" one that still signs.
    async fn secrets(
        &self,
        client: &deadpool_postgres::Client,
        webhooks: &[String],
        keys: &Keys,
    ) -> anyhow::Result<HashMap<String, Vec<VersionedSecret>>> {
        let statement = client
            .prepare_cached(
                "SELECT webhook_id, version, sealed, previous_valid_until FROM webhook_secrets
                 WHERE webhook_id = ANY($1) ORDER BY webhook_id, version",
            )
            .await?;
        let mut secrets: HashMap<String, Vec<VersionedSecret>> = HashMap::new();
        for row in client.query(&statement, &[&webhooks]).await? {
            let sealed = proto::Sealed::decode(row.get::<_, &[u8]>(2))?;
            let opened = platform::events::open::<proto::WebhookSecret>(Some(&sealed), keys)?;
            if let Some(secret) = opened.and_then(|opened| Secret::parse(&opened.secret)) {
                secrets.entry(row.get(0)).or_default().push((row.get(1), secret, row.get(3)));
            }
        }
        Ok(secrets)
    }

    /// Attempts one delivery and records the outcome; the permit frees its slot at the end.
    async fn attempt(self: Arc<Self>, delivery: Claimed, permit: OwnedSemaphorePermit) {
        let slot = permit;
        let result = match &delivery.plan {
            Plan::Drop(reason) => self.drop_delivery(&delivery, reason).await,
            Plan::Send { body, secrets } => {
                let started = Instant::now();
                let result = self.send(&delivery, body, secrets).await;
                self.record(&delivery, &result, started.elapsed()).await
            }
        };
        if let Err(error) = result {
            // The lease expires and another attempt follows.
            tracing::warn!(delivery = %delivery.delivery_id, error = format!("{error:#}"),
                "could not record a webhook attempt");
        }
        drop(slot);
        self.finished.notify_one();
    }

    async fn send(&self, delivery: &Claimed, body: &[u8], secrets: &[Secret]) -> AttemptResult {
        if let Some(refusal) = target::url_refusal(&delivery.url, self.settings.allow_loopback) {
            return AttemptResult::Rejected {
                status: None,
                error: format!("the target is refused: {}", refusal.message()),
            };
        }
        let timestamp = Utc::now().timestamp();
        let signature = signature_header(secrets, &delivery.delivery_id, timestamp, body);
        let sent = self
            .http
            .post(&delivery.url)
            .header("content-type", "application/json")
            .header("webhook-id", &delivery.delivery_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .header("x-webhook-id", &delivery.delivery_id)
            .body(body.to_vec())
            .send()
            .await;
        match sent {
            Ok(response) => classify(response.status().as_u16(), retry_after(response.headers())),
            Err(error) => AttemptResult::Retryable { status: None, error: describe(&error), retry_after: None },
        }
    }

    /// Records an attempt through the recorder (which batches the outcomes of every attempt
    /// that ends meanwhile into one statement), then pauses the webhook when the receiver is
    /// gone or the circuit breaker opens.
    async fn record(&self, delivery: &Claimed, result: &AttemptResult, latency: Duration) -> anyhow::Result<()> {
        if *result == AttemptResult::Gone {
            // Paused before the outcome is recorded: a crash in between re-attempts a delivery
            // of a paused webhook, which drops it.
            self.pause(delivery, "gone", "the receiver answered 410 Gone").await?;
        }
        let retry = usize::try_from(delivery.attempts - delivery.attempt_base - 1).unwrap_or(0);
        let jitter = rand::rng().random_range(0.8..1.2);
        let Next { state, delay: next_delay, status, error } =
            next_state(&self.settings.retry_schedule_ms, retry, result, jitter);
        let outcome = AttemptOutcome {
            delivery_id: delivery.delivery_id.clone(),
            lease_token: delivery.lease_token,
            state,
            status: status.map(i32::from),
            error: error.clone(),
            delay_seconds: next_delay.map(|delay| delay.as_secs_f64()),
            latency_ms: i32::try_from(latency.as_millis()).unwrap_or(i32::MAX),
            failed: !matches!(result, AttemptResult::Delivered { .. }),
        };
        let (reply, recorded) = tokio::sync::oneshot::channel();
        self.recorder.send((outcome, reply)).map_err(|_| anyhow::anyhow!("the webhook outcome recorder stopped"))?;
        let breaker = recorded.await.map_err(|_| anyhow::anyhow!("the webhook outcome recorder stopped"))??;
        let label = match result {
            AttemptResult::Delivered { .. } => "delivered",
            AttemptResult::Retryable { .. } => "retryable",
            AttemptResult::Gone => "gone",
            AttemptResult::Rejected { .. } => "rejected",
        };
        metrics::counter!("webhook_attempts_total", "outcome" => label).increment(1);
        if matches!(result, AttemptResult::Delivered { .. }) {
            let age = (Utc::now() - delivery.created_at).to_std().unwrap_or_default();
            metrics::histogram!("webhook_delivery_seconds").record(age.as_secs_f64());
        }
        if let Some(in_a_row) = breaker {
            let detail = format!(
                "{in_a_row} consecutive failed attempts over at least {} s; the last: {}",
                self.settings.breaker_window_seconds,
                error.as_deref().unwrap_or("failed")
            );
            self.pause(delivery, "failing", &detail).await?;
        }
        Ok(())
    }

    async fn drop_delivery(&self, delivery: &Claimed, reason: &str) -> anyhow::Result<()> {
        let client = self.pool.get().await?;
        client
            .execute(
                "UPDATE webhook_deliveries SET state = 'dropped', leased_until = NULL, lease_token = NULL,
                     last_error = $3, finished_at = clock_timestamp(), attempts = attempts - 1
                 WHERE delivery_id = $1 AND lease_token = $2",
                &[&delivery.delivery_id, &delivery.lease_token, &reason],
            )
            .await?;
        metrics::counter!("webhook_deliveries_dropped_total").increment(1);
        Ok(())
    }

    /// Pauses the webhook with a reason the owner sees on GET, unless it is no longer live.
    async fn pause(&self, delivery: &Claimed, reason: &str, detail: &str) -> anyhow::Result<()> {
        let client = self.pool.get().await?;
        let (version, current) = reads::webhooks::load(&client, &delivery.webhook_id).await?;
        drop(client);
        if !current.is_some_and(|webhook| webhook.live && !webhook.deleted) {
            return Ok(());
        }
        let stream =
            pause(&delivery.webhook_id, &delivery.space_id, version, (reason, detail), platform::time::now_millis());
        let request = AppendRequest::in_space(&delivery.space_id, vec![stream], Vec::new());
        match self.log.append(request).await {
            // Changed meanwhile (its owner, or another worker pausing it): nothing to do.
            Ok(_) | Err(AppendError::WrongVersion { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

impl Worker for Deliver {
    fn name(&self) -> String {
        "webhook_delivery".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[DELIVERIES_CHANNEL]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(250)
    }

    fn step(&self) -> futures_util::future::BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(self.run())
    }

    fn lag(&self) -> futures_util::future::BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async {
            let client = self.0.pool.get().await?;
            let due: i64 = client
                .query_one(
                    "SELECT count(*) FROM webhook_deliveries WHERE state = 'pending' AND next_attempt_at <= now()",
                    &[],
                )
                .await?
                .get(0);
            metrics::gauge!("webhook_deliveries_due").set(due as f64);
            Ok(None)
        })
    }
}
