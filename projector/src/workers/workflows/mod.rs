//! The workflow engine: runs are process managers over the log.
//!
//! - **Runs** ([`Engine`], worker `workflow_runs`, any number of processes): each step claims
//!   due runs from `workflow_runs` (a lease per run: a token and a time, like the webhook
//!   outbox, because a step may wait on a webhook receiver) and advances each in a task of its
//!   own (`run.rs`), so a slow receiver holds back only its own run. Every transition is
//!   appended to the run's stream at its version together with the update of its row, so a
//!   transition happens once whichever process makes it, and a crash anywhere resumes from
//!   what the log (and the row written with it) holds.
//! - **Events** ([`Follower`], worker `workflow_events`, one process at a time by its lease):
//!   follows the log; an event that becomes ready for a contact ends the `wait_for_event`
//!   steps waiting for it and starts the runs of workflows it triggers; a contact's deletion
//!   makes its runs due, so the engine ends them.
//!
//! Waits are due times of the run queue itself (`workflow_runs.due_at`), not rows of the
//! runtime's `timers`: a step may call a webhook, and a timer's claim transaction must not be
//! held across an outside call (the reason the webhook outbox is a queue of its own too).

mod decide;
mod follow;
pub mod replay;
mod replays;
mod run;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::Pool;
use domain::workflows::WorkflowDef;
use futures_util::future::BoxFuture;
use mail::mailer::Mailer;
use platform::log::EventLog;
use platform::settings::Settings;
use tokio::sync::Semaphore;
use uuid::Uuid;

use follow::Follower;

use crate::runtime::{Outcome, Worker};

/// The workflow workers: the engine, its log follower, and the replays' worker.
pub fn workers(pool: &Pool, log: &EventLog, settings: &Settings) -> anyhow::Result<Vec<Arc<dyn Worker>>> {
    Ok(vec![
        Arc::new(Engine::new(pool.clone(), log.clone(), settings)?),
        Arc::new(Follower::new(pool.clone(), log.clone())),
        Arc::new(replays::Replays::new(pool.clone(), log.clone(), settings)),
    ])
}

/// What every run's task shares.
pub(crate) struct Inner {
    pool: Pool,
    log: EventLog,
    http: reqwest::Client,
    mailer: Mailer,
    /// Hand-off claims of the engine's emails, made together.
    claims: mail::outbox::Claims,
    settings: Settings,
    /// Where the engine's emails' links point, and the keys that sign tracking links.
    site: mail::send::Site,
    /// Definitions by (workflow, revision): immutable once appended.
    definitions: Mutex<HashMap<(String, i64), Arc<WorkflowDef>>>,
    slots: Arc<Semaphore>,
    /// The lease tokens of this process's claims with runs still being advanced, and how many
    /// each still has. A run leased under one of them is never claimed again by this process,
    /// even once its lease ran out: on a machine too busy to advance a claim's runs within
    /// the lease, claiming them again made every transition find its lease lost, over and
    /// over, and the runs stood still. (Another process still takes them over when their
    /// lease runs out, as it must for a process that stalled or died.)
    in_flight: Arc<Mutex<HashMap<Uuid, usize>>>,
    /// Emails' hand-offs under way or waiting for a relay connection: two per pooled
    /// connection, so every connection has the next message ready and no more are held.
    handoffs: Arc<Semaphore>,
}

impl Inner {
    /// How long a claimed run is leased (at least the webhook call timeout and a margin).
    pub(crate) fn lease(&self) -> Duration {
        let call = Duration::from_millis(self.settings.webhooks.attempt_timeout_ms) + Duration::from_secs(5);
        Duration::from_millis(self.settings.workflows.lease_ms).max(call)
    }
}

pub struct Engine(Arc<Inner>);

impl Engine {
    pub fn new(pool: Pool, log: EventLog, settings: &Settings) -> anyhow::Result<Self> {
        let timeout = Duration::from_millis(settings.webhooks.attempt_timeout_ms.max(1));
        let agent = concat!("platform-workflows/", env!("CARGO_PKG_VERSION"));
        let http = crate::workers::outbound::client(timeout, settings.webhooks.allow_loopback, agent)?;
        let mailer = Mailer::from_settings(&settings.email)?;
        let claims = mail::outbox::Claims::start(pool.clone());
        let site = mail::send::Site::from_settings(&settings.email)?;
        Ok(Self(Arc::new(Inner {
            pool,
            log,
            http,
            mailer,
            claims,
            settings: settings.clone(),
            site,
            definitions: Mutex::default(),
            slots: Arc::new(Semaphore::new(settings.workflows.concurrency.max(1))),
            in_flight: Arc::default(),
            handoffs: Arc::new(Semaphore::new(2 * usize::try_from(settings.email.pool_size.max(1)).unwrap_or(1))),
        })))
    }

    async fn step(&self) -> anyhow::Result<Outcome> {
        let first = self.0.slots.clone().acquire_owned().await?;
        let free = self.0.slots.available_permits() + 1;
        let token = Uuid::now_v7();
        let mut client = self.0.pool.get().await?;
        // The claim returns what each run's first tick reads. Its statement finds rows by key
        // and by the index of due times; `db::CLAIM_SETTINGS` keeps it to those whatever the
        // table's statistics say (a plan made while the table was small joined the claimed
        // runs by a scan of all of it), and its commit does not wait for the disk.
        let transaction = client.transaction().await?;
        let statement = transaction
            .prepare_cached(&format!(
                "UPDATE workflow_runs r SET lease_token = $1, lease_until = clock_timestamp() + make_interval(secs => $3)
                 WHERE r.run_id IN (
                     SELECT run_id FROM workflow_runs
                     WHERE due_at <= clock_timestamp() AND (lease_until IS NULL OR lease_until < clock_timestamp())
                       AND (lease_token IS NULL OR lease_token <> ALL($4::uuid[]))
                     ORDER BY due_at LIMIT $2 FOR UPDATE SKIP LOCKED)
                 RETURNING {}",
                run::ROW
            ))
            .await?;
        let limit = i64::try_from(free).unwrap_or(1);
        let lease = self.0.lease().as_secs_f64();
        let mine: Vec<Uuid> =
            self.0.in_flight.lock().map(|tokens| tokens.keys().copied().collect()).unwrap_or_default();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&token, &limit, &lease, &mine];
        let (_, rows) = tokio::try_join!(
            transaction.batch_execute(platform::db::CLAIM_SETTINGS),
            transaction.query(&statement, &params)
        )?;
        transaction.commit().await?;
        drop(client);
        let claimed = rows.len();
        if claimed > 0
            && let Ok(mut tokens) = self.0.in_flight.lock()
        {
            tokens.insert(token, claimed);
        }
        let mut first = Some(first);
        for row in &rows {
            let permit = match first.take() {
                Some(permit) => permit,
                None => self.0.slots.clone().acquire_owned().await?,
            };
            let inner = self.0.clone();
            let run_id: String = row.get(0);
            let read = decide::Row::read(row);
            let done = InFlight { tokens: inner.in_flight.clone(), token };
            tokio::spawn(async move {
                let _done = done;
                let advanced = match read {
                    Ok(row) => run::advance(&inner, row, token).await,
                    Err(error) => Err(error),
                };
                if let Err(error) = advanced {
                    tracing::warn!(run = %run_id, error = format!("{error:#}"), "a workflow run will be tried again");
                    run::back_off(&inner.pool, &run_id, token).await;
                }
                drop(permit);
            });
        }
        Ok(if claimed >= free { Outcome::Progressed } else { Outcome::Idle })
    }
}

/// One run of a claim being advanced; when the last is done (or its task is gone), the
/// claim's token leaves [`Inner::in_flight`].
struct InFlight {
    tokens: Arc<Mutex<HashMap<Uuid, usize>>>,
    token: Uuid,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut tokens) = self.tokens.lock()
            && let Some(left) = tokens.get_mut(&self.token)
        {
            *left = left.saturating_sub(1);
            if *left == 0 {
                tokens.remove(&self.token);
            }
        }
    }
}

impl Worker for Engine {
    fn name(&self) -> String {
        "workflow_runs".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[platform::log::LOG_CHANNEL]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(200)
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(Engine::step(self))
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async {
            // Not a log follower: its backlog is the due runs, counted in metrics instead.
            let client = self.0.pool.get().await?;
            let due: i64 = client
                .query_one("SELECT count(*) FROM workflow_runs WHERE due_at <= clock_timestamp()", &[])
                .await?
                .get(0);
            metrics::gauge!("workflow_runs_due").set(due as f64);
            Ok(None)
        })
    }
}
