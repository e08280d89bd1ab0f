//! The one way a background worker runs, read models and side-effect workers alike.
//!
//! A [`Worker`] does one bounded unit of work per [`Worker::step`] and says whether it did
//! anything. The runtime drives each worker in a task of its own: while it progresses it steps
//! again at once; when it is idle it sleeps until a NOTIFY on one of its channels wakes it, or
//! its poll interval passes (the fallback when a notification is lost), an interval that
//! doubles while polls find nothing, up to the worker's idle ceiling; when a step fails it
//! waits a jittered exponential backoff (`backon`) before the next, and is healthy again after
//! a success. On shutdown no new step starts and a step in flight gets a bounded time to
//! finish; a step's database work is one transaction, so one that is cut short rolls back and
//! its lease is released.
//!
//! Exclusivity is the worker's: [`Lease`] holds the worker's checkpoint row in
//! `worker_checkpoints` `FOR UPDATE SKIP LOCKED` for the length of a step's transaction, so
//! one process at a time does a worker's work, the checkpoint commits with the work's
//! database effects, and a process that dies releases the lease with its connection. (A read
//! model's lease is its checkpoint row in `projections`, the same way.)
//!
//! Workers may share a lane ([`Worker::lane`]): one step of the lane's workers runs at a
//! time in a process. The read models share one. Under load this lets each batch gather the
//! events that arrived while the others projected (few large transactions instead of one
//! small one per model per append, as when every model stepped on every notification);
//! when the system is quiet a wake-up still projects at once.
//!
//! A worker may also have a spacing ([`Worker::spacing`]): a step that a notification woke
//! starts no sooner than that after the last one started, so a follower of a busy log takes
//! the appends of that time in one step. Followers whose work waits a moment without harm
//! (preparation, the webhooks' enqueue) have [`FOLLOWER_SPACING`]; the read models have none.
//!
//! Every worker reports its health: last success, lag to the head of the log, last error and
//! since when it has been failing.
//!
//! # The worker runtime
//!
//! Every background job of the projector is a `Worker` (`projector/src/runtime.rs`): `step()`
//! does one bounded unit of work and says `Progressed` or `Idle`. The runtime drives each worker
//! in a task: after `Progressed` it steps again at once; after `Idle` it sleeps until a NOTIFY on
//! one of the worker's channels (one LISTEN connection per channel per process) or its poll
//! interval, doubled after each poll that found nothing up to its idle ceiling (two seconds
//! for the followers of the log, whose work always comes with a notification). A worker that
//! follows the log says `Progressed` only when it read a full batch; a notification that
//! arrives during a step is kept, so the next wait ends at once. After a
//! failure it waits a jittered exponential backoff (`backon`, 100 ms to 30 s)
//! and steps again; a failure on a database that is away (`platform::db::is_transient`: a
//! restart, a failover) is logged as a warning for the first 30 s of a worker's failing, and
//! meanwhile waits at most 1 s, so that every worker steps again within a second of the
//! database's return; after that it is an error, and so is any other failure at once. On shutdown (SIGTERM or SIGINT) no new step starts, and a step in flight has
//! 10 s to finish; a step's database work is one transaction, so a step cut short rolls back.
//!
//! - **Leases.** Work that one process at a time must do holds a lease for the length of its
//!   step: the worker's checkpoint row, locked `FOR UPDATE SKIP LOCKED` in the step's
//!   transaction (`Lease`, rows of `worker_checkpoints`; a read model's version rows in
//!   `projections`). Another process finds it locked and stays idle; a process that dies
//!   releases it with its connection, so another takes over at once. The checkpoint commits
//!   with the step's database effects. A lease's transaction may wait on an outside party (the
//!   AI provider), so it lifts the pool's idle-in-transaction limit, which protects append
//!   transactions (they never hold a lease). A step may hold its lease's connection while it
//!   uses others: the projector's pool is sized for every worker stepping at once. A follower
//!   of the log first looks at its next span without the lease ([`look`]), and passes over one
//!   with nothing for it in one statement ([`Look::pass_over`]).
//! - **Workers.** One per read model (`read_model:<name>`, projecting every live or building
//!   version), `preparation`, `eraser`, `maintenance` (each minute: rate windows, batch
//!   history, idempotency purge and reconciliation, receipt retirement, the dead-letter report;
//!   once a day the marketing sends no cap can count),
//!   `webhook_enqueue` and `webhook_delivery` (see Webhook delivery), `email_outbox` with
//!   `email_held` (both chosen by `email_outbox`) and `domain_checks` (see Email), and `timers:<kind>` for each kind of timer
//!   (`timers:segment_windows`, see Segments), `timers:broadcast_runs` and
//!   `timers:broadcast_experiments` with `broadcast_runs` (see Broadcasts), and `workflow_runs` with `workflow_events` (see
//!   Workflows). `APP__PROJECTOR__WORKERS` (`all`, or a list of
//!   `read_models`, `preparation`, `eraser`, `maintenance`, `webhook_enqueue`,
//!   `webhook_delivery`, `email_outbox`, `domain_checks`, `segment_windows`, `broadcasts`,
//!   `workflows`, `engagement`, `imports`) chooses a
//!   process's workers, so a deployment can run, say, two read-model processes and one for
//!   side effects.
//! - **Timers.** The due-time scheduler (`projector/src/timers.rs`): rows of `timers` (kind,
//!   key unique within the kind, due time, payload, attempts), scheduled in the transaction of
//!   the state change that needs them. A `TimerWorker` claims the due timers of its kind `FOR
//!   UPDATE SKIP LOCKED`, hands each to its handler inside a savepoint, and deletes it or moves
//!   it to its next attempt (jittered exponential backoff, 1 s to an hour) in the same
//!   transaction. Segment windows and broadcast starts are timers; workflow waits are the due
//!   times of the workflow run queue (see Workflows).
//!   Webhook deliveries are not: an attempt waits on a receiver for up to its timeout, which a
//!   timer's claim transaction must not hold, so the delivery outbox is its own queue (below).
//! - **Lanes.** Workers that name the same lane take turns: one step of the lane at a time in
//!   a process (a fair semaphore). The read models share the lane `read_models`: when every
//!   model stepped on every notification, each append cost five small projection
//!   transactions, and record creates fell by about a quarter on two cores; taking turns,
//!   a model's next batch holds what arrived meanwhile, and a quiet system still projects on
//!   the first wake-up. Side-effect workers have no lane (a slow AI call must not hold reads
//!   back).
//! - **Health.** The runtime records each worker's last success, lag to the log head, last
//!   error and since when it has been failing, and exports steps, failures and lag as metrics.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::BackoffBuilder;
use chrono::{DateTime, Utc};
use deadpool_postgres::{Client, Pool, Transaction};
use futures_util::future::BoxFuture;
use serde::Serialize;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

/// What a step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It did some work; there may be more, so step again at once.
    Progressed,
    /// Nothing to do (or another process holds the lease): wait for a wake-up.
    Idle,
}

/// A background worker.
pub trait Worker: Send + Sync + 'static {
    /// A stable name: its lease, its checkpoint and its label in health and metrics.
    fn name(&self) -> String;

    /// The NOTIFY channels that mean there may be work.
    fn channels(&self) -> &'static [&'static str];

    /// How long to sleep when idle and no notification arrives.
    fn poll_interval(&self) -> Duration;

    /// The longest an idle worker sleeps: each poll that found nothing, with no notification
    /// meanwhile, doubles the next sleep from [`Worker::poll_interval`] up to this; work found
    /// or a notification brings it back to the poll interval ([`idle_sleep`]). The poll
    /// interval (the default): a worker whose work comes due by the clock polls at its pace.
    fn idle_ceiling(&self) -> Duration {
        self.poll_interval()
    }

    /// One bounded unit of work.
    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>>;

    /// How many log positions the worker is behind the head of the log, when it follows the
    /// log.
    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>>;

    /// Workers that name the same lane take turns: one step of theirs at a time in a process.
    /// `None` (the default): the worker steps whenever it has work.
    fn lane(&self) -> Option<&'static str> {
        None
    }

    /// The least time from the start of one step to the start of the next that a notification
    /// woke: a worker woken by every append of a busy log takes the appends that arrived
    /// meanwhile in one step instead of one step each. A step after a quiet spell starts at
    /// once; a step that found more work (`Progressed`) is followed at once. Zero (the
    /// default): every wake-up steps.
    fn spacing(&self) -> Duration {
        Duration::ZERO
    }
}

/// The spacing of the followers of the log whose work waits a moment without harm (an event's
/// preparation, a webhook's delivery): a follower steps at most 50 times a second while
/// appends keep coming, each step reading what arrived since the last one. While template sends
/// kept the two cores busy, each such follower had stepped about 300 times a second, every
/// step a read of the log and a write of its checkpoint (docs/benchmarks.md, issue 70:
/// "Followers step at most every 20 ms").
pub const FOLLOWER_SPACING: Duration = Duration::from_millis(20);

/// The idle ceiling ([`Worker::idle_ceiling`]) of the followers of the log: every append
/// notifies them (and a lost listener's reconnection wakes them), so their poll is only the
/// fallback (docs/benchmarks.md, "An idle process polls less").
pub const FOLLOWER_IDLE_CEILING: Duration = Duration::from_secs(2);

/// One worker's health as the runtime saw it.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerHealth {
    pub last_success_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    /// When the current run of failures began; `None` while healthy.
    pub failing_since: Option<DateTime<Utc>>,
    /// Positions behind the head of the log, for workers that follow it.
    pub lag: Option<i64>,
    pub steps: u64,
    pub failures: u64,
}

/// The health of every worker of a process, shared with its operations endpoints.
#[derive(Debug, Clone, Default)]
pub struct Health(Arc<Mutex<BTreeMap<String, WorkerHealth>>>);

impl Health {
    pub fn snapshot(&self) -> BTreeMap<String, WorkerHealth> {
        self.0.lock().map(|health| health.clone()).unwrap_or_default()
    }

    fn update(&self, name: &str, change: impl FnOnce(&mut WorkerHealth)) {
        if let Ok(mut health) = self.0.lock() {
            change(health.entry(name.to_owned()).or_default());
        }
    }

    /// Workers that have been failing for longer than `grace`.
    pub(crate) fn failing_longer_than(&self, grace: Duration) -> Vec<String> {
        let limit = Utc::now() - chrono::Duration::from_std(grace).unwrap_or_default();
        self.snapshot()
            .into_iter()
            .filter(|(_, health)| health.failing_since.is_some_and(|since| since < limit))
            .map(|(name, _)| name)
            .collect()
    }
}

/// How long a step in flight may take to finish once shutdown began.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How often a worker's lag is measured.
const LAG_INTERVAL: Duration = Duration::from_secs(2);

/// How long a worker's steps may fail on a database that is away (a restart, a failover)
/// before each failure is logged as an error rather than a warning.
const TRANSIENT_GRACE: Duration = Duration::from_secs(30);

/// The backoff between failed steps: exponential from 100 ms to 30 s, with jitter.
pub(crate) fn failure_backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times()
}

/// The longest a worker waits between steps that fail on a database briefly away.
const TRANSIENT_RETRY: Duration = Duration::from_secs(1);

/// The wait after a failed step: the backoff's, but at most [`TRANSIENT_RETRY`] while the
/// database is briefly away (`transient`: for the first [`TRANSIENT_GRACE`] of failing on it).
/// A failover keeps every worker failing for seconds; doubling waits would leave a worker
/// asleep for up to as long again after the database is back, and what waits on it (a send's
/// answer that its hand-off records, a webhook, a journey's timer) with it.
pub(crate) fn failure_delay(backoff: Duration, transient: bool) -> Duration {
    if transient { backoff.min(TRANSIENT_RETRY) } else { backoff }
}

/// Runs a set of workers until shutdown.
pub struct Runtime {
    workers: Vec<Arc<dyn Worker>>,
    health: Health,
    database_url: String,
}

impl Runtime {
    pub fn new(database_url: String, workers: Vec<Arc<dyn Worker>>) -> Self {
        Self { workers, health: Health::default(), database_url }
    }

    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Drives every worker until `shutdown` is cancelled, then waits for them to stop.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut wakers: HashMap<&'static str, Vec<Arc<Notify>>> = HashMap::new();
        let mut lanes: HashMap<&'static str, Arc<Semaphore>> = HashMap::new();
        let mut tasks = Vec::new();
        let mut drivers = Vec::new();
        for worker in self.workers {
            let wake = Arc::new(Notify::new());
            for channel in worker.channels() {
                wakers.entry(channel).or_default().push(wake.clone());
            }
            let lane =
                worker.lane().map(|lane| lanes.entry(lane).or_insert_with(|| Arc::new(Semaphore::new(1))).clone());
            drivers.push((worker, wake, lane));
        }
        // One listening connection per channel for the whole process.
        for (channel, wakes) in wakers {
            let mut notifications = platform::db::listen(self.database_url.clone(), channel);
            let stop = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        received = notifications.recv() => match received {
                            Some(_) => {
                                notified(channel);
                                wakes.iter().for_each(|wake| wake.notify_one());
                            }
                            None => return,
                        },
                    }
                }
            }));
        }
        for (worker, wake, lane) in drivers {
            tasks.push(tokio::spawn(drive(worker, wake, lane, self.health.clone(), shutdown.clone())));
        }
        for task in tasks {
            let _ = task.await;
        }
    }
}

/// When this process last received a notification on each channel it listens to.
static NOTIFIED: Mutex<BTreeMap<&'static str, Instant>> = Mutex::new(BTreeMap::new());

/// Records that a notification on `channel` arrived now, before the workers it wakes are woken.
fn notified(channel: &'static str) {
    NOTIFIED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(channel, Instant::now());
}

/// When this process last received a notification on `channel` (`None`: not since it started,
/// or it does not listen to it). A step that began after a notification's wake-up sees this at
/// least as late as that notification's arrival.
pub(crate) fn last_notified(channel: &str) -> Option<Instant> {
    NOTIFIED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(channel).copied()
}

async fn drive(
    worker: Arc<dyn Worker>,
    wake: Arc<Notify>,
    lane: Option<Arc<Semaphore>>,
    health: Health,
    shutdown: CancellationToken,
) {
    let name = worker.name();
    let mut backoff: Option<backon::ExponentialBackoff> = None;
    let mut lag_measured = Instant::now() - LAG_INTERVAL;
    metrics::gauge!("worker_running", "worker" => name.clone()).set(1.0);
    let spacing = worker.spacing();
    // Polls in a row that found nothing with no notification between them.
    let mut idle_polls = 0_u32;
    while !shutdown.is_cancelled() {
        if lag_measured.elapsed() >= LAG_INTERVAL {
            lag_measured = Instant::now();
            if let Ok(lag) = worker.lag().await {
                if let Some(lag) = lag {
                    metrics::gauge!("worker_lag_positions", "worker" => name.clone()).set(lag as f64);
                }
                health.update(&name, |health| health.lag = lag);
            }
        }
        // The semaphores are never closed, so a permit always comes.
        let turn = match &lane {
            Some(lane) => tokio::select! {
                permit = lane.clone().acquire_owned() => permit.ok(),
                () = shutdown.cancelled() => break,
            },
            None => None,
        };
        let step_started = Instant::now();
        let step = worker.step();
        tokio::pin!(step);
        let outcome = tokio::select! {
            outcome = &mut step => outcome,
            () = shutdown.cancelled() => match tokio::time::timeout(SHUTDOWN_GRACE, &mut step).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    tracing::warn!(worker = %name, "a step did not finish within the shutdown grace; abandoned");
                    break;
                }
            },
        };
        drop(turn);
        match outcome {
            Ok(outcome) => {
                backoff = None;
                metrics::counter!("worker_steps_total", "worker" => name.clone()).increment(1);
                health.update(&name, |health| {
                    health.last_success_at = Some(Utc::now());
                    health.failing_since = None;
                    health.steps += 1;
                });
                if outcome == Outcome::Progressed {
                    idle_polls = 0;
                    tokio::task::yield_now().await;
                    continue;
                }
                let sleep = idle_sleep(worker.poll_interval(), worker.idle_ceiling(), idle_polls);
                let woken = tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = wake.notified() => true,
                    () = tokio::time::sleep(sleep) => false,
                };
                idle_polls = if woken { 0 } else { idle_polls.saturating_add(1) };
                let early = spacing.saturating_sub(step_started.elapsed());
                if woken && !early.is_zero() {
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(early) => {}
                    }
                    // A wake-up that came meanwhile is for an append the next step reads.
                    let _ = futures_util::FutureExt::now_or_never(wake.notified());
                }
            }
            Err(error) => {
                let message = format!("{error:#}");
                let mut failing_since = Utc::now();
                health.update(&name, |health| {
                    failing_since = *health.failing_since.get_or_insert_with(Utc::now);
                    health.last_error = Some(message.clone());
                    health.failures += 1;
                });
                // A database that is briefly away (a restart, a failover) fails every worker's
                // steps at once: a warning while it passes, an error once it lasts.
                let lasting =
                    Utc::now() - failing_since >= chrono::Duration::from_std(TRANSIENT_GRACE).unwrap_or_default();
                if platform::db::is_transient(&error) && !lasting {
                    tracing::warn!(worker = %name, error = %message, "a worker step failed on the database; retrying after a backoff");
                } else {
                    tracing::error!(worker = %name, error = %message, "a worker step failed; retrying after a backoff");
                }
                metrics::counter!("worker_failures_total", "worker" => name.clone()).increment(1);
                let delay = failure_delay(
                    backoff.get_or_insert_with(|| failure_backoff().build()).next().unwrap_or(Duration::from_secs(30)),
                    platform::db::is_transient(&error) && !lasting,
                );
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    metrics::gauge!("worker_running", "worker" => name.clone()).set(0.0);
    tracing::info!(worker = %name, "worker stopped");
}

/// How long an idle worker sleeps after `idle_polls` polls in a row found nothing: its poll
/// interval, doubled per such poll, at most `ceiling` (and never less than the poll). A quiet
/// process's followers, whose work comes with a notification, poll every few seconds
/// instead of several times a second; while work keeps coming they poll at their pace.
pub(crate) fn idle_sleep(poll: Duration, ceiling: Duration, idle_polls: u32) -> Duration {
    poll.saturating_mul(1_u32.checked_shl(idle_polls.min(16)).unwrap_or(u32::MAX)).min(ceiling.max(poll))
}

/// The name of a worker's lease (its row in `worker_checkpoints`). It remembers that the row
/// exists, so that only a worker's first step creates it: keep one per worker and database.
#[derive(Debug)]
pub struct LeaseName {
    name: String,
    created: AtomicBool,
}

impl LeaseName {
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), created: AtomicBool::new(false) }
    }
}

/// A transaction holding a worker's checkpoint row in `worker_checkpoints` (`FOR UPDATE SKIP
/// LOCKED`): while it lives, no other process can take the same lease. Committing stores the
/// new checkpoint with whatever else the transaction did; dropping it rolls everything back.
pub struct Lease<'c> {
    transaction: Transaction<'c>,
    name: String,
    /// The log position (or other progress mark) the worker had reached.
    pub checkpoint: i64,
}

impl<'c> Lease<'c> {
    /// Takes the lease `lease`, or `None` when another process holds it.
    pub async fn acquire(client: &'c mut Client, lease: &LeaseName) -> anyhow::Result<Option<Lease<'c>>> {
        let name = lease.name.as_str();
        if !lease.created.load(Ordering::Relaxed) {
            // Outside the lease's transaction, so it never waits on another holder's insert.
            let ensure = client
                .prepare_cached("INSERT INTO worker_checkpoints (name) VALUES ($1) ON CONFLICT DO NOTHING")
                .await?;
            client.execute(&ensure, &[&name]).await?;
            lease.created.store(true, Ordering::Relaxed);
        }
        let transaction = client.transaction().await?;
        let lock = transaction
            .prepare_cached("SELECT position FROM worker_checkpoints WHERE name = $1 FOR UPDATE SKIP LOCKED")
            .await?;
        // A step may wait on an outside party (an AI provider, later a webhook receiver) while
        // holding its lease; the pool's idle-in-transaction limit guards append transactions,
        // which never hold a lease. Pipelined with the lock.
        let named: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&name];
        let (_, row) = tokio::try_join!(
            transaction.batch_execute("SET LOCAL idle_in_transaction_session_timeout = 0"),
            transaction.query_opt(&lock, &named)
        )?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(Lease { checkpoint: row.get(0), transaction, name: name.to_owned() }))
    }

    pub fn transaction(&self) -> &Transaction<'c> {
        &self.transaction
    }

    /// Ends a step that changed nothing, without writing the checkpoint.
    pub async fn rollback(self) -> anyhow::Result<()> {
        self.transaction.rollback().await?;
        Ok(())
    }

    /// Stores `checkpoint` and commits the step, once its log is flushed.
    pub async fn commit(self, checkpoint: i64) -> anyhow::Result<()> {
        let save = self
            .transaction
            .prepare_cached("UPDATE worker_checkpoints SET position = $2, updated_at = now() WHERE name = $1")
            .await?;
        self.transaction.execute(&save, &[&self.name, &checkpoint]).await?;
        self.transaction.commit().await?;
        Ok(())
    }

    /// Stores `checkpoint` after a step that passed over its span: it did nothing outside its
    /// transaction (no append, no call), and wrote nothing in it that another process acts on
    /// (at most the worker's own progress). It commits without waiting for
    /// its log's flush, as a read model's pass over a span without its events does: most
    /// appends are passed over by most workers, and each such commit waited for a flush of
    /// its own, queued with the appends' (docs/benchmarks.md, issue 70: "A pass over a span
    /// waits for no flush"). A crash of PostgreSQL before the WAL writer flushes it (within a
    /// second) loses only the step (the checkpoint's advance and its own progress), and the
    /// worker passes over the same span again; any later commit that waits for its flush
    /// flushes it first. The caller says so: the transaction cannot tell by itself (its
    /// lease's row lock already gave it an id).
    pub async fn pass_over(self, checkpoint: i64) -> anyhow::Result<()> {
        let save = self
            .transaction
            .prepare_cached("UPDATE worker_checkpoints SET position = $2, updated_at = now() WHERE name = $1")
            .await?;
        let saved: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&self.name, &checkpoint];
        tokio::try_join!(
            self.transaction.batch_execute("SET LOCAL synchronous_commit = off"),
            self.transaction.execute(&save, &saved)
        )?;
        self.transaction.commit().await?;
        Ok(())
    }
}

/// A follower's next span, read without its lease ([`look`]).
pub struct Look {
    /// The stored checkpoint the span follows.
    pub checkpoint: i64,
    /// The span and its events of the wanted types.
    pub followed: platform::log::Followed,
}

/// What a follower's look before its lease found.
pub enum Looked {
    /// The span needed nothing and was passed over (or there was none): the step's outcome.
    Done(Outcome),
    /// The step takes its lease, with the span looked at if there was one.
    Lease(Option<Look>),
}

impl Look {
    /// Passes over the span in one statement ([`pass_over_looked`]): the step is done,
    /// `Progressed` after a span as long as `limit` (more may follow). If another process
    /// moved the checkpoint or holds the lease meanwhile, the step takes its lease instead.
    pub async fn pass_over(
        self,
        client: &impl deadpool_postgres::GenericClient,
        lease: &LeaseName,
        limit: i64,
    ) -> anyhow::Result<Looked> {
        let Some(last) = self.followed.last else { return Ok(Looked::Done(Outcome::Idle)) };
        if !pass_over_looked(client, lease, self.checkpoint, last).await? {
            return Ok(Looked::Lease(None));
        }
        let full = i64::try_from(self.followed.read).unwrap_or(i64::MAX) >= limit;
        Ok(Looked::Done(if full { Outcome::Progressed } else { Outcome::Idle }))
    }
}

/// The span a step under `lease` follows: the one `looked` at if the lease still stands at
/// the checkpoint it was read from (the log up to a head once read never changes), else read
/// again under the lease.
pub async fn followed(
    lease: &Lease<'_>,
    looked: Option<Look>,
    limit: i64,
    wanted: &[&str],
) -> anyhow::Result<platform::log::Followed> {
    match looked.filter(|look| look.checkpoint == lease.checkpoint) {
        Some(look) => Ok(look.followed),
        None => Ok(platform::log::read_wanted(lease.transaction(), lease.checkpoint, limit, wanted).await?),
    }
}

/// Reads the span after the stored checkpoint of `lease` (up to `limit` positions, no further
/// than the head) and its events of the `wanted` types, in one statement, without the lease:
/// what a follower looks at before it decides whether the span needs its lease at all. Most
/// appends need nothing of most followers, and a step under the lease is a transaction of
/// seven statements (docs/benchmarks.md, issue 70: "Followers look before they lease").
/// `None` until the worker's first step has created its row.
pub async fn look(
    client: &impl deadpool_postgres::GenericClient,
    lease: &LeaseName,
    limit: i64,
    wanted: &[&str],
) -> anyhow::Result<Option<Look>> {
    let checkpoint = "SELECT position FROM worker_checkpoints WHERE name = $1";
    let read = platform::log::read_wanted_after(client, checkpoint, &lease.name, limit, wanted).await?;
    Ok(read.map(|(checkpoint, followed)| Look { checkpoint, followed }))
}

/// Stores `to` as the checkpoint of `lease` after a [`look`] found nothing for the worker in
/// the span after `from`, in one statement: only if the checkpoint is still `from` and no
/// step holds the lease (`FOR UPDATE SKIP LOCKED`), and without waiting for its flush, as
/// [`Lease::pass_over`] stores it. Returns whether it stored it; if not, the worker takes its
/// lease as usual.
async fn pass_over_looked(
    client: &impl deadpool_postgres::GenericClient,
    lease: &LeaseName,
    from: i64,
    to: i64,
) -> anyhow::Result<bool> {
    // The commit setting is made in the lease's row read, before the row is updated.
    let statement = client
        .prepare_cached(
            "WITH leased AS (
                 SELECT name, set_config('synchronous_commit', 'off', true) FROM worker_checkpoints
                 WHERE name = $1 AND position = $2 FOR UPDATE SKIP LOCKED)
             UPDATE worker_checkpoints c SET position = $3, updated_at = now() FROM leased
             WHERE c.name = leased.name",
        )
        .await?;
    Ok(client.execute(&statement, &[&lease.name, &from, &to]).await? == 1)
}

/// The head of the log less `position`.
pub(crate) async fn lag_behind(pool: &Pool, position_sql: &str, name: &str) -> anyhow::Result<Option<i64>> {
    let client = pool.get().await?;
    let row = client.query_opt(&format!("SELECT (SELECT position FROM log_head) - ({position_sql})"), &[&name]).await?;
    Ok(row.and_then(|row| row.get::<_, Option<i64>>(0)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures_util::future::BoxFuture;
    use tokio::sync::Notify;
    use tokio_util::sync::CancellationToken;

    use super::{Health, Outcome, Worker, drive, failure_delay, idle_sleep};

    #[test]
    fn an_idle_sleep_doubles_from_the_poll_to_the_ceiling() {
        let (poll, ceiling) = (Duration::from_millis(250), Duration::from_secs(2));
        let sleeps: Vec<u128> = (0..6).map(|polls| idle_sleep(poll, ceiling, polls).as_millis()).collect();
        assert_eq!(sleeps, [250, 500, 1_000, 2_000, 2_000, 2_000]);
        assert_eq!(idle_sleep(poll, ceiling, u32::MAX), ceiling, "no overflow after a long quiet spell");
        assert_eq!(idle_sleep(poll, poll, 5), poll, "the default ceiling: the poll's own pace");
        assert_eq!(idle_sleep(poll, Duration::ZERO, 3), poll, "a ceiling below the poll is the poll");
    }

    /// A worker that never finds work and counts its steps.
    struct Quiet {
        steps: Arc<AtomicUsize>,
    }

    impl Worker for Quiet {
        fn name(&self) -> String {
            "quiet".to_owned()
        }
        fn channels(&self) -> &'static [&'static str] {
            &[]
        }
        fn poll_interval(&self) -> Duration {
            Duration::from_millis(5)
        }
        fn idle_ceiling(&self) -> Duration {
            Duration::from_millis(200)
        }
        fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
            self.steps.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(Outcome::Idle) })
        }
        fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
            Box::pin(async { Ok(None) })
        }
    }

    #[tokio::test]
    async fn an_idle_worker_polls_less_and_less_until_a_notification_brings_its_pace_back() {
        let steps = Arc::new(AtomicUsize::new(0));
        let (wake, shutdown) = (Arc::new(Notify::new()), CancellationToken::new());
        let driven = tokio::spawn(drive(
            Arc::new(Quiet { steps: steps.clone() }),
            wake.clone(),
            None,
            Health::default(),
            shutdown.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let quiet = steps.load(Ordering::SeqCst);
        // Every 5 ms, a second would be some 200 polls; doubling to 200 ms, about 10.
        assert!((3..=20).contains(&quiet), "polls in an idle second: {quiet}");
        wake.notify_one();
        tokio::time::sleep(Duration::from_millis(150)).await;
        let woken = steps.load(Ordering::SeqCst) - quiet;
        // The wake-up's step, then polls 5, 10, 20, 40 ms apart: at 200 ms apart, one.
        assert!(woken >= 3, "polls in the 150 ms after a notification: {woken}");
        shutdown.cancel();
        driven.await.expect("the driver ends on shutdown");
    }

    #[test]
    fn a_step_failing_on_a_database_briefly_away_waits_at_most_a_second_and_other_failures_back_off() {
        let doubled = Duration::from_millis(6_400);
        assert_eq!(failure_delay(doubled, true), Duration::from_secs(1), "a failover: back within a second");
        assert_eq!(failure_delay(Duration::from_millis(200), true), Duration::from_millis(200));
        assert_eq!(failure_delay(doubled, false), doubled, "any other failure, or a lasting one: the backoff");
    }
}
