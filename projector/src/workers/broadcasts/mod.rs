//! The broadcast engine. A run is requested by `POST /broadcasts/{id}/send`, whose append
//! inserts its `broadcast_runs` row and a `broadcast_runs` timer due at its start.
//!
//! - **Start** ([`Starter`], the timer's handler): in the timer's transaction, once the
//!   `segments` read model has applied the run's request, the run's audience is snapshotted
//!   into `broadcast_recipients` (the segment's members, or the contacts subscribed to the
//!   topic, as that read model holds them) and the run becomes `sending`. Both commit together
//!   or not at all.
//! - **Send** ([`Runs`], a worker): each step locks one sending run (`FOR UPDATE SKIP
//!   LOCKED`, so any number of processes share runs and never one run), takes a batch of its
//!   `pending` recipients, reads them from the `segments` read model (where the snapshot came
//!   from), and asks the send decision (`mail::send::decide`) about each, as every send does.
//!   A recipient it lets through is rendered and its email appended with the outbox row, the
//!   allowance count and the recipient's move to `scheduled`, in one transaction; those it
//!   refuses get their story (`EmailSkipped`, with the gate and the log event that decided)
//!   appended for the whole batch at once with their move to `skipped`, and the step counts
//!   them into the run. The recipient's guard
//!   (`state = 'pending'`) makes every recipient's email happen at most once, across kill -9;
//!   a recipient left `pending` by a process that died is taken up by the next step, so none
//!   is skipped. The batch's emails are then handed to the relay, a bounded number at once;
//!   one whose hand-off a dead process left is finished by the email outbox worker, which
//!   never sends an email twice. The pace is at most `APP__BROADCASTS__RATE_PER_SECOND`
//!   recipients a second. A run with no `pending` recipient left is `completed`.
//!
//! # Broadcasts
//!
//! A broadcast is authored (`shared/domain/src/email/resources.rs`, `BroadcastDef`: a marketing
//! template whose only data key is its recipient, an audience, an optional sender and schedule);
//! `PATCH /broadcasts/{id}` appends `BroadcastUpdated`, and the `broadcasts` read model folds
//! those over the authored definition in log order (`shared/domain/src/email/broadcasts.rs`). The
//! commands fold the same from the log (`command-service/src/broadcasts/store.rs`: the authoring
//! stream and the broadcast's own, in one statement) and append at the broadcast stream's
//! version with the authoring stream held, so a send right after a PATCH takes the PATCH's
//! audience whatever the read models' lag.
//!
//! **A run** is requested by `POST /broadcasts/{id}/send`: `BroadcastRunRequested` is appended
//! with two guards, the run's row in `broadcast_runs` (a unique index allows one `scheduled` or
//! `sending` run per broadcast, so a concurrent second send fails its append: 409) and its
//! `broadcast_runs` timer, due at the start. The engine (`projector/src/workers/broadcasts/`)
//! then works from its own tables, like the webhook and email outboxes:
//!
//! 1. **Start** (the timer's handler, in the timer's transaction): once the live `segments`
//!    read model has applied the run's request (the last event of the broadcast's stream while
//!    a run is active; until then the timer is tried again 100 ms later), the audience is
//!    snapshotted into `broadcast_recipients` (the segment's members, or the topic's subscribed
//!    contacts, from that read model) and the run becomes `sending`. Both commit or neither.
//! 2. **Send** (worker `broadcast_runs`): a step locks one sending run `FOR UPDATE SKIP LOCKED`
//!    and takes a batch of its `pending` recipients. It loads what the checks need in a few
//!    set-wise statements (documents and subscriptions from the segments read model, where the
//!    snapshot came from, so a recipient is missing only when deleted since; consent attributes
//!    from the catalog; suppressions; data keys), asks the send decision about each recipient
//!    (`Recipients::facts`), appends the stories of those it refuses in one append (their
//!    `EmailSkipped`, with the log events that decided, and their move to `skipped`, marked not
//!    counted yet), renders each one let through, and appends each email with three guards: the outbox row, the allowance
//!    count, and `pending → scheduled` of the recipient. The appends go concurrently, so the
//!    batcher writes them in few transactions. A recipient decided before (by a process that
//!    died after its append) fails its guard: no email is appended twice. The batch's emails
//!    are then handed to the relay (`outbox::Claims` and `hand_off`), a bounded number at once
//!    across steps: a step returns once its last hand-off has started, so the next batch is
//!    decided while this one is sent. Each email is claimed only when its hand-off starts; one
//!    a dead process left is finished by the email outbox worker, which never sends twice. The
//!    step sleeps to keep the configured pace, and then yields to live requests as an import's
//!    wave does (`APP__BROADCASTS__LIVE_YIELD` times the batch's time, in proportion to the
//!    `live_load` rate).
//!    A recipient the send policy holds gets its email stored `held` (see Engagement, held
//!    sends) and moves to `held`; the held sends worker moves it to `scheduled` or `skipped` at
//!    its time.
//! 3. A run with no `pending` recipient left is `completed`. Its counts are kept, never
//!    counted at request time: the skips by reason in `broadcast_runs` (each step counts the
//!    run's skipped recipients not counted yet, in its transaction, which holds the run's row:
//!    its own, and any a process that died after their append left; an append never touches the
//!    run's row, which the step holds while it waits on the append), and its
//!    emails in the `emails` read model's `email_counts` (see Engagement); `pending` is the
//!    audience less both, `held` the emails the policy holds now, `queued` the emails
//!    scheduled without an outcome yet, held ones left out.
//!
//! **An experiment** (`BroadcastDef::experiment`, the pure rules in
//! `shared/domain/src/email/experiments.rs`, the engine's part in
//! `projector/src/workers/broadcasts/experiment.rs`) rides on the same steps. The run's request
//! carries the broadcast's experiment. At the start, each recipient of the snapshot is drawn into
//! the test with a variant, or into the rest, from a digest of the broadcast, the run and the
//! contact, and the run's phase is `test`: its steps take test recipients only, each batch sent
//! per variant (its template, sender and subject) with the variant on every `EmailScheduled` and
//! `EmailSkipped`. With no test recipient pending, the phase is `wait` and a
//! `broadcast_experiments` timer is due at the end of the wait. Its handler waits until every open and
//! click taken by then is in the log, the `emails` read model (and for a conversion metric, `events`) has applied it, and
//! neither holds an open dead letter of the space (whose later events it would be holding), then reads each variant's
//! figures in one statement grouped by variant (`reads::experiments::tallies`, shared with the run's read),
//! decides, and appends `BroadcastExperimentDecided` as the only event of `broadcast-run-<runId>`
//! (expected not to exist, so the verdict is recorded once; a timer fired again after a crash
//! applies the recorded one). Applied in the timer's transaction, the phase becomes `winner`:
//! contacts who joined the audience since the start are added to the rest, and the steps send
//! the rest the winner (`experiment_winner` on their emails: `origin.cohort`). Without a winner, the rest is skipped as
//! `experiment_stopped` and the run completes. A variant's subject, template, sender and preheader replace the broadcast's
//! in `Run::for_variant` and the batch's load; a `PATCH` of the broadcast changes the experiment the next run takes
//! (`command-service/src/broadcasts/decide.rs`: `check_experiment` on what the catalog holds of the named templates, senders and event schema).

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{GenericClient, Pool, Transaction};
use domain::email::experiments::ExperimentDef;
use domain::email::resources::{Audience, DomainDef, SenderDef};
use futures_util::future::BoxFuture;
use mail::mailer::Mailer;
use mail::outbox::{self, Prepared};
use mail::send::{Authored, Facts, Verdict};
use platform::error::Code;
use platform::fresh::Drawn;
use platform::log::{AppendError, AppendRequest, EventLog};
use platform::readmodel::live_schema;
use platform::settings::Settings;
use serde_json::Value;

use crate::runtime::{Outcome, Worker};
use crate::timers::{Handled, Timer, TimerHandler};
use crate::workers::email::recipients::Recipients;

mod decide;
mod experiment;

pub(crate) use decide::reason;
use decide::{Batch, Run, Skipped, Step, decide_batch, skip_stories};

/// The channel notified when a run starts sending.
pub(crate) const RUNS_CHANNEL: &str = "broadcast_runs";

/// Starts runs when their timer is due.
pub(crate) struct Starter;

impl Starter {
    async fn start(transaction: &Transaction<'_>, timer: &Timer) -> anyhow::Result<Handled> {
        let Some(run_id) = timer.payload.get("runId").and_then(Value::as_str) else { return Ok(Handled::Done) };
        let row = transaction
            .query_opt(
                "SELECT space_id, audience, broadcast_id, experiment FROM broadcast_runs
                 WHERE run_id = $1 AND status = 'scheduled' FOR UPDATE",
                &[&run_id],
            )
            .await?;
        let Some(row) = row else { return Ok(Handled::Done) };
        let (space_id, audience, broadcast_id): (String, Value, String) = (row.get(0), row.get(1), row.get(2));
        let audience: Audience = serde_json::from_value(audience)?;
        let experiment: Option<ExperimentDef> =
            row.get::<_, Option<Value>>(3).map(serde_json::from_value).transpose()?;
        let Some(segments) = live_schema(transaction, "segments").await? else {
            return Ok(Handled::Retry("the segments read model has no live version yet".to_owned()));
        };
        // The audience is as the log holds it at the send: membership and subscriptions must
        // include every write before the run's request (a contact added, a segment created a
        // moment earlier). While no run of the broadcast is scheduled or sending, nothing else
        // is appended to its stream, so the request is the stream's last event.
        let (requested_at, reached): (i64, i64) = transaction
            .query_one(
                "SELECT COALESCE((SELECT max(position) FROM events WHERE stream_id = $1), 0),
                        COALESCE((SELECT position FROM projections WHERE name = 'segments' AND status = 'live'), 0)",
                &[&domain::email::broadcasts::stream_id(&broadcast_id)],
            )
            .await
            .map(|row| (row.get(0), row.get(1)))?;
        if reached < requested_at {
            return Ok(Handled::RetryAt(chrono::Utc::now() + chrono::Duration::milliseconds(100)));
        }
        let (snapshot, found) = snapshot(transaction, run_id, &space_id, &audience, &segments).await?;
        if found {
            // With an experiment, the test share is drawn and sent first.
            if let Some(experiment) = &experiment {
                experiment::split(transaction, (&broadcast_id, run_id), experiment).await?;
            }
            transaction
                .execute(
                    "UPDATE broadcast_runs SET status = 'sending', started_at = clock_timestamp(), audience_count = $2,
                         phase = CASE WHEN experiment IS NULL THEN NULL ELSE 'test' END
                     WHERE run_id = $1",
                    &[&run_id, &i32::try_from(snapshot).unwrap_or(i32::MAX)],
                )
                .await?;
            transaction.execute("SELECT pg_notify($1, $2)", &[&RUNS_CHANNEL, &run_id]).await?;
        } else {
            transaction
                .execute(
                    "UPDATE broadcast_runs SET status = 'failed', started_at = clock_timestamp(),
                         finished_at = clock_timestamp(), audience_count = 0,
                         error = 'the audience segment was deleted before the run started'
                     WHERE run_id = $1",
                    &[&run_id],
                )
                .await?;
        }
        Ok(Handled::Done)
    }
}

/// Adds the contacts of `audience` (as the `segments` read model's version `segments` holds
/// them) to run `run_id`'s recipients, in `transaction`: those already there stay as they are.
/// Returns how many were added, and whether the audience exists.
pub(super) async fn snapshot(
    transaction: &Transaction<'_>,
    run_id: &str,
    space_id: &str,
    audience: &Audience,
    segments: &str,
) -> anyhow::Result<(u64, bool)> {
    Ok(match audience {
        Audience::Segment { segment_id } => {
            let exists = transaction
                .query_one(
                    &format!(
                        "SELECT EXISTS (SELECT 1 FROM {segments}.segments WHERE segment_id = $1 AND space_id = $2)"
                    ),
                    &[segment_id, &space_id],
                )
                .await?
                .get::<_, bool>(0);
            let inserted = transaction
                .execute(
                    &format!(
                        "INSERT INTO broadcast_recipients (run_id, contact_id)
                         SELECT $1, contact_id FROM {segments}.members WHERE segment_id = $2 ON CONFLICT DO NOTHING"
                    ),
                    &[&run_id, segment_id],
                )
                .await?;
            (inserted, exists)
        }
        Audience::Topic { topic_id } => {
            let inserted = transaction
                .execute(
                    &format!(
                        "INSERT INTO broadcast_recipients (run_id, contact_id)
                         SELECT $1, contact_id FROM {segments}.contacts
                         WHERE space_id = $2 AND doc IS NOT NULL AND subscriptions ->> $3 = 'subscribed'
                         ON CONFLICT DO NOTHING"
                    ),
                    &[&run_id, &space_id, topic_id],
                )
                .await?;
            (inserted, true)
        }
    })
}

impl TimerHandler for Starter {
    fn kind(&self) -> &'static str {
        domain::email::broadcasts::RUN_TIMER
    }

    fn handle<'a>(
        &'a self,
        transaction: &'a Transaction<'a>,
        timer: &'a Timer,
    ) -> BoxFuture<'a, anyhow::Result<Handled>> {
        Box::pin(Self::start(transaction, timer))
    }
}

/// What a hand-off needs, shared by the hand-off tasks of every step.
struct Sender {
    pool: Pool,
    claims: outbox::Claims,
    log: EventLog,
    mailer: Mailer,
    lease: Duration,
    retry_schedule: Vec<u64>,
}

pub struct Runs {
    pool: Pool,
    log: EventLog,
    sender: Arc<Sender>,
    /// Hand-offs under way: a step waits for a free one before it starts another, so the
    /// next batch is decided while the last one is still being sent.
    handoffs: Arc<tokio::sync::Semaphore>,
    settings: Settings,
    /// Where the emails' links point, and the keys that sign tracking links.
    site: mail::send::Site,
}

impl Runs {
    pub fn new(pool: Pool, log: EventLog, settings: &Settings) -> anyhow::Result<Self> {
        let sender = Sender {
            pool: pool.clone(),
            claims: outbox::Claims::start(pool.clone()),
            log: log.clone(),
            mailer: Mailer::from_settings(&settings.email)?,
            lease: settings.email_lease(),
            retry_schedule: settings.email.retry_schedule_ms.clone(),
        };
        let handoffs = Arc::new(tokio::sync::Semaphore::new(settings.broadcasts.handoffs.max(1)));
        let site = mail::send::Site::from_settings(&settings.email)?;
        Ok(Self { pool, log, sender: Arc::new(sender), handoffs, settings: settings.clone(), site })
    }

    async fn step(&self) -> anyhow::Result<Outcome> {
        let started = Instant::now();
        let mut client = self.pool.get().await?;
        let transaction = client.transaction().await?;
        transaction.batch_execute("SET LOCAL idle_in_transaction_session_timeout = 0").await?;
        let row = transaction
            .query_opt(
                "SELECT run_id, space_id, template_id, sender_id, broadcast_id, phase, experiment, winner
                 FROM broadcast_runs WHERE status = 'sending' AND phase IS DISTINCT FROM 'wait'
                 ORDER BY started_at LIMIT 1 FOR UPDATE SKIP LOCKED",
                &[],
            )
            .await?;
        let Some(row) = row else { return Ok(Outcome::Idle) };
        let run = Run {
            run_id: row.get(0),
            space_id: row.get(1),
            template_id: row.get(2),
            sender_id: row.get(3),
            broadcast_id: row.get(4),
            variant: None,
            subject: None,
            preheader: None,
            winner: false,
        };
        let phase: Option<String> = row.get(5);
        let experiment: Option<ExperimentDef> =
            row.get::<_, Option<Value>>(6).map(serde_json::from_value).transpose()?;
        let winner: Option<String> = row.get(7);
        let testing = phase.as_deref() == Some("test");
        let batch = i64::try_from(self.batch_size()).unwrap_or(200);
        // While an experiment tests, only its test recipients are sent; the rest wait for the
        // verdict.
        let pending_sql = if testing {
            "SELECT contact_id, variant FROM broadcast_recipients WHERE run_id = $1 AND state = 'pending'
             AND variant IS NOT NULL ORDER BY contact_id LIMIT $2"
        } else {
            "SELECT contact_id, variant FROM broadcast_recipients WHERE run_id = $1 AND state = 'pending'
             ORDER BY contact_id LIMIT $2"
        };
        let pending: Vec<(String, Option<String>)> = transaction
            .query(pending_sql, &[&run.run_id, &batch])
            .await?
            .into_iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        if pending.is_empty() && testing {
            if let Some(experiment) = &experiment {
                experiment::wait(&transaction, &run.run_id, experiment).await?;
            }
            transaction.commit().await?;
            return Ok(Outcome::Progressed);
        }
        if pending.is_empty() {
            transaction
                .execute(
                    "UPDATE broadcast_runs SET status = 'completed', finished_at = clock_timestamp() WHERE run_id = $1",
                    &[&run.run_id],
                )
                .await?;
            transaction.commit().await?;
            return Ok(Outcome::Progressed);
        }
        let (mut prepared, mut scheduled) = (Vec::new(), 0);
        for ((variant, as_winner), contacts) in by_variant(&pending, winner.as_deref()) {
            let variant = variant.and_then(|id| experiment.as_ref()?.variants.iter().find(|variant| variant.id == id));
            let run = match variant {
                Some(variant) => run.for_variant(variant, as_winner),
                None => run.clone(),
            };
            let (emails, appended) = self.send_batch(&run, &contacts).await?;
            prepared.extend(emails);
            scheduled += appended;
        }
        count_skipped(&transaction, &run.run_id).await?;
        transaction.commit().await?;
        self.hand_off(prepared).await;
        let worked = started.elapsed();
        // The pace is of emails: recipients skipped (no consent, the allowance used up) are
        // recorded at the database's pace, not the relay's.
        self.keep_pace(started, scheduled).await;
        // A run gives way to live requests as an import does.
        let live_yield = self.settings.broadcasts.live_yield;
        api::live_load::yield_to_live(&self.pool, worked, live_yield, "broadcast_live_yield_milliseconds_total")
            .await?;
        Ok(Outcome::Progressed)
    }

    fn batch_size(&self) -> usize {
        let batch = self.settings.broadcasts.batch.max(1);
        match self.settings.broadcasts.rate_per_second {
            0 => batch,
            rate => batch.min(usize::try_from(rate).unwrap_or(usize::MAX)),
        }
    }

    /// Sleeps so that `handled` recipients took at least `handled / rate` seconds.
    async fn keep_pace(&self, started: Instant, handled: usize) {
        let rate = self.settings.broadcasts.rate_per_second;
        if rate == 0 {
            return;
        }
        let due = Duration::from_secs_f64(handled as f64 / f64::from(rate));
        if let Some(rest) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(rest).await;
        }
    }

    /// Decides a batch of recipients (`mail::send::decide`) and appends the emails of those it
    /// lets through and the stories of those it refuses: what to hand off, and how many emails
    /// were scheduled (sent or held).
    async fn send_batch(&self, run: &Run, pending: &[String]) -> anyhow::Result<(Vec<Prepared>, usize)> {
        let (authored, recipients) = self.load(run, pending).await?;
        let now = platform::time::now_millis();
        let Batch { appends, mut skipped } = decide_batch(
            Step { run, authored: &authored, recipients: &recipients, site: &self.site, now },
            pending,
            &mut Drawn,
        )?;
        let results =
            futures_util::future::join_all(appends.into_iter().map(|(contact_id, request, prepared)| async move {
                (contact_id, self.log.append(request).await, prepared)
            }))
            .await;
        let (mut prepared, mut scheduled) = (Vec::new(), 0);
        for (contact_id, result, email) in results {
            match result {
                Ok(_) => {
                    scheduled += 1;
                    prepared.extend(email);
                }
                Err(AppendError::Conflict { code: Code::EmailLimitReached, .. }) => {
                    let facts = Facts { allowance_refused: true, ..recipients.facts(&authored, &contact_id, now) };
                    if let Verdict::Skip { gate, decided_by } = mail::send::decide(&facts) {
                        skipped.push((contact_id, gate, decided_by));
                    }
                }
                // Already decided by an earlier attempt: nothing to do.
                Err(AppendError::Conflict { code: Code::OperationTaken, .. }) => {}
                // The contact was sent marketing email since the batch read its sends (a journey,
                // a template send): the next step decides it from a new reading.
                Err(AppendError::Conflict { code: Code::StreamMoved, .. }) => {
                    tracing::debug!(run = %run.run_id, contact = %contact_id, "a recipient is decided again");
                }
                Err(error) => {
                    tracing::warn!(run = %run.run_id, contact = %contact_id, %error, "a recipient stays pending for a later step");
                }
            }
        }
        self.stories(run, &authored, &recipients, skipped, now).await?;
        Ok((prepared, scheduled))
    }

    /// Records the batch's refused recipients: each one's `EmailSkipped` (with the log event
    /// that decided, looked up for all of them at once) and its move to `skipped`, in one
    /// append. A recipient another step decided meanwhile fails the append, and the batch's
    /// refusals stay pending for the next step.
    async fn stories(
        &self,
        run: &Run,
        authored: &Authored,
        recipients: &Recipients,
        skipped: Skipped,
        now: i64,
    ) -> anyhow::Result<()> {
        if skipped.is_empty() {
            return Ok(());
        }
        let client = self.pool.get().await?;
        let no_keys: Vec<String> = Vec::new();
        let refused: Vec<mail::skipped::Refused<'_>> = skipped
            .iter()
            .map(|(contact_id, gate, filled_by)| {
                let contact = recipients.contacts.get(contact_id);
                mail::skipped::Refused {
                    contact_id,
                    gate: *gate,
                    address: contact
                        .and_then(|contact| contact.document.get("email"))
                        .and_then(Value::as_str)
                        .unwrap_or(""),
                    topic_id: authored.template.topic_id.as_deref(),
                    consent_keys: contact
                        .and_then(|contact| recipients.consent_keys.get(&contact.schema_id))
                        .unwrap_or(&no_keys),
                    filled_by: *filled_by,
                }
            })
            .collect();
        let found = mail::skipped::decided_by(&client, &run.space_id, &refused, &recipients.keys).await?;
        drop(client);
        let (streams, moved) = skip_stories(run, (authored, recipients), &skipped, found, now, &mut Drawn);
        if let Err(error) = self.log.append(AppendRequest::in_space(&run.space_id, streams, vec![moved])).await {
            tracing::warn!(run = %run.run_id, %error, "the batch's refused recipients stay pending for a later step");
        }
        Ok(())
    }

    /// The run's template (with the run's own sender) and what the checks read about the
    /// `pending` recipients, from the read models' live versions.
    async fn load(&self, run: &Run, pending: &[String]) -> anyhow::Result<(Authored, Recipients)> {
        let client = self.pool.get().await?;
        let (Some(catalog), Some(segments)) =
            (live_schema(&client, "catalog").await?, live_schema(&client, "segments").await?)
        else {
            anyhow::bail!("a read model a run needs has no live version yet");
        };
        let Some(mut authored) = Authored::load(&client, &catalog, &run.space_id, &run.template_id).await? else {
            anyhow::bail!("template {} of run {} is gone", run.template_id, run.run_id);
        };
        if let Some(sender_id) = run.sender_id.as_ref().filter(|id| **id != authored.sender_id) {
            let (sender, domain) = sender_of(&client, &catalog, &run.space_id, sender_id).await?;
            (authored.sender_id, authored.sender, authored.domain) = (sender_id.clone(), sender, domain);
        }
        // An experiment's variant may replace the subject and set a preheader (of a template
        // without language variants: the workspace's apply refuses them otherwise).
        if let Some(subject) = &run.subject {
            authored.template.subject = subject.clone();
        }
        authored.preheader = run.preheader.clone();
        let lookback = authored.policy.as_ref().and_then(mail::send::SendPolicy::lookback_ms);
        let recipients = Recipients::load(&client, (&catalog, &segments), &run.space_id, pending, lookback).await?;
        Ok((authored, recipients))
    }

    /// Starts the batch's hand-offs, a bounded number at once across steps; returns once the
    /// last has started. Each email is claimed only when its turn comes: a claimed email
    /// whose process dies is settled as unknown and never sent, so nothing is claimed ahead of
    /// its hand-off. One the process did not reach is finished by the email outbox worker.
    async fn hand_off(&self, prepared: Vec<Prepared>) {
        for email in prepared {
            let Ok(permit) = Arc::clone(&self.handoffs).acquire_owned().await else { return };
            let sender = Arc::clone(&self.sender);
            tokio::spawn(async move {
                sender.hand_off(&email).await;
                drop(permit);
            });
        }
    }
}

impl Sender {
    async fn hand_off(&self, email: &Prepared) {
        let email_id = &email.parties.email_id;
        match self.claims.claim(email_id, self.lease).await {
            Ok(Some(lease)) => {
                outbox::hand_off(&self.pool, &self.log, &self.mailer, &lease, email, Some(&self.retry_schedule)).await;
            }
            // The outbox worker has it.
            Ok(None) => {}
            Err(error) => tracing::warn!(error = %format!("{error:#}"), email = %email_id,
                "could not claim a hand-off; the outbox worker will"),
        }
    }
}

/// Counts the run's skipped recipients not counted yet into the run, in the step's
/// transaction (which holds the run's row): this step's, and any a process that died after
/// their append left.
pub(crate) async fn count_skipped(transaction: &Transaction<'_>, run_id: &str) -> anyhow::Result<()> {
    transaction
        .execute(
            "WITH moved AS (
                 UPDATE broadcast_recipients SET counted = true
                 WHERE run_id = $1 AND state = 'skipped' AND NOT counted
                 RETURNING reason)
             UPDATE broadcast_runs SET
                 skipped_no_consent = skipped_no_consent + (SELECT count(*) FROM moved WHERE reason = 'no_consent'),
                 skipped_not_subscribed = skipped_not_subscribed
                     + (SELECT count(*) FROM moved WHERE reason = 'not_subscribed'),
                 skipped_suppressed = skipped_suppressed + (SELECT count(*) FROM moved WHERE reason = 'suppressed'),
                 skipped_allowance = skipped_allowance + (SELECT count(*) FROM moved WHERE reason = 'allowance'),
                 skipped_no_address = skipped_no_address + (SELECT count(*) FROM moved WHERE reason = 'no_address'),
                 skipped_gone = skipped_gone + (SELECT count(*) FROM moved WHERE reason = 'gone'),
                 skipped_frequency_cap = skipped_frequency_cap
                     + (SELECT count(*) FROM moved WHERE reason = 'frequency_cap'),
                 skipped_quiet_hours = skipped_quiet_hours + (SELECT count(*) FROM moved WHERE reason = 'quiet_hours')
             WHERE run_id = $1 AND EXISTS (SELECT 1 FROM moved)",
            &[&run_id],
        )
        .await?;
    Ok(())
}

/// What a group of a batch is sent: the experiment's variant (`None` without an experiment),
/// and whether as the winner.
type Sent<'a> = (Option<&'a str>, bool);

/// A batch's recipients by the variant each is sent and whether as the winner: a test
/// recipient's own, else the run's winner, in the batch's order within each.
fn by_variant<'a>(pending: &'a [(String, Option<String>)], winner: Option<&'a str>) -> Vec<(Sent<'a>, Vec<String>)> {
    let mut groups: Vec<(Sent<'_>, Vec<String>)> = Vec::new();
    for (contact_id, variant) in pending {
        let variant = match variant.as_deref() {
            Some(tested) => (Some(tested), false),
            None => (winner, winner.is_some()),
        };
        match groups.iter_mut().find(|(group, _)| *group == variant) {
            Some((_, contacts)) => contacts.push(contact_id.clone()),
            None => groups.push((variant, vec![contact_id.clone()])),
        }
    }
    groups
}

/// A sender of the space and its domain, from catalog version schema `catalog`.
async fn sender_of(
    client: &impl GenericClient,
    catalog: &str,
    space_id: &str,
    sender_id: &str,
) -> anyhow::Result<(SenderDef, DomainDef)> {
    let row = client
        .query_opt(
            &format!(
                "SELECT s.definition, d.definition FROM {catalog}.resources s
                 JOIN {catalog}.resources d ON d.kind = 'domain' AND d.space_id = s.space_id
                     AND d.resource_id = s.definition ->> 'domainId'
                 WHERE s.kind = 'sender' AND s.space_id = $1 AND s.resource_id = $2"
            ),
            &[&space_id, &sender_id],
        )
        .await?
        .ok_or_else(|| anyhow::anyhow!("sender {sender_id} or its domain is gone"))?;
    Ok((serde_json::from_value(row.get(0))?, serde_json::from_value(row.get(1))?))
}

impl Worker for Runs {
    fn name(&self) -> String {
        "broadcast_runs".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[RUNS_CHANNEL]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(500)
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(Runs::step(self))
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async {
            let client = self.pool.get().await?;
            let pending: i64 = client
                .query_one(
                    "SELECT count(*) FROM broadcast_recipients r JOIN broadcast_runs b USING (run_id)
                     WHERE b.status = 'sending' AND r.state = 'pending'",
                    &[],
                )
                .await?
                .get(0);
            metrics::gauge!("broadcast_recipients_pending").set(pending as f64);
            Ok(None)
        })
    }
}

/// The engine's workers: the run starter and the experiments' verdicts (on the timers), and
/// the run sender.
pub fn workers(pool: &Pool, log: &EventLog, settings: &Settings) -> anyhow::Result<Vec<Arc<dyn Worker>>> {
    Ok(vec![
        Arc::new(crate::timers::TimerWorker::new(pool.clone(), Arc::new(Starter))),
        Arc::new(crate::timers::TimerWorker::new(
            pool.clone(),
            Arc::new(experiment::Verdicts::new(log.clone(), settings.projector.crash_after_verdict)),
        )),
        Arc::new(Runs::new(pool.clone(), log.clone(), settings)?),
    ])
}
