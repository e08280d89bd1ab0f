//! The held sends worker: a marketing send the space's send policy held (quiet hours, or a
//! frequency cap whose outcome is `hold`) waits as an outbox row `held` until its time
//! (`next_attempt_at`). Each step leases a batch of due rows (`FOR UPDATE SKIP LOCKED`, so any
//! number of processes share them and never one row), reads what the send decision needs
//! about their contacts once for the batch (`recipients::Recipients`), and asks the decision
//! again with the facts of that moment:
//! - **send**: `EmailReleased`, the row back to `pending`, the send counted against the
//!   frequency caps from now; then queued for this process's hand-off tasks, which hand it to
//!   the relay like a broadcast's email, a bounded number at once (the step does not wait for
//!   them, so releases keep their time however slow the relay; one the queue cannot take, or
//!   a dead process left, is `pending`, and the outbox worker finishes it once the hand-off
//!   grace from its release has passed). Releases
//!   come first: while a step finds a full batch due, the hand-off tasks wait, and the
//!   messages follow at the relay's pace once every due email is decided. A task takes its
//!   share of the queue at once and rebuilds those messages from the log together
//!   (`outbox::prepare_many_from_log`), then claims and sends each in turn;
//! - **hold**: `EmailHeld` again, the row's time moved on;
//! - **skip**: `EmailSkipped` ends the email's stream (the gate and the fact that decided),
//!   the row `skipped`, a broadcast recipient `skipped` and counted into its run.
//!
//! The decision and the append it makes are `decide.rs`'s (pure, with given/when/then tests);
//! this file is its shell: the lease, the loads, the stories of skipped emails, the append and
//! the hand-offs.
//!
//! The batch's outcomes are one append per space, guarded by the lease token: a lease that
//! ran out (a process killed mid-step) makes the append fail, and the next lease decides the
//! rows again, so each held email is released, held again or skipped exactly once per time.
//! Within a batch, the emails of one contact are decided in order and a released one counts
//! against the caps of the next.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool};
use futures_util::future::{BoxFuture, join_all};
use mail::mailer::Mailer;
use mail::outbox;
use mail::send::{Authored, Gate, Origin};
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{AppendError, AppendRequest, EventLog, StreamAppend};
use platform::readmodel::live_schema;
use platform::settings::Settings;
use serde_json::Value;
use uuid::Uuid;

mod decide;

use super::recipients::Recipients;
use crate::runtime::{Outcome, Worker};
use decide::{Appends, Decided, Due, chunks};

/// Held emails leased by one step at most.
const BATCH: i64 = 2_000;

/// The longest sleep between polls that found nothing due (`runtime::idle_sleep`): a held
/// email comes due by the clock, not with a notification, so the first due after a quiet spell
/// is found within half a second of its time, and the ones after it at the poll's pace.
const IDLE_CEILING: Duration = Duration::from_millis(500);

pub(crate) struct Held {
    pool: Pool,
    log: EventLog,
    lease: Duration,
    poll: Duration,
    /// Released emails for the hand-off tasks.
    queue: tokio::sync::mpsc::Sender<String>,
    /// Whether due emails are waiting to be decided (the hand-off tasks wait meanwhile).
    releasing: tokio::sync::watch::Sender<bool>,
    /// How long a released email is this process's to hand off before the outbox worker's.
    grace_ms: i64,
}

/// Released emails waiting for a hand-off task, at most.
const QUEUED: usize = 100_000;

/// Released emails one hand-off task takes from the queue at once, at most.
const TAKEN: usize = 32;

/// What the released emails' hand-offs share.
struct HandOffs {
    pool: Pool,
    log: EventLog,
    claims: outbox::Claims,
    mailer: Mailer,
    lease: Duration,
    retry_schedule: Vec<u64>,
    public_base_url: String,
}

/// How many times a batch is decided when contacts are sent marketing email meanwhile.
const DECIDE_ATTEMPTS: usize = 3;

/// Whether `error` is an append refused because a contact's marketing sends moved.
fn is_sends_moved(error: &anyhow::Error) -> bool {
    matches!(error.downcast_ref::<AppendError>(), Some(AppendError::Conflict { code: Code::StreamMoved, .. }))
}

impl Held {
    pub(crate) fn new(pool: Pool, log: EventLog, settings: &Settings) -> anyhow::Result<Self> {
        let handoffs = Arc::new(HandOffs {
            pool: pool.clone(),
            log: log.clone(),
            claims: outbox::Claims::start(pool.clone()),
            mailer: Mailer::from_settings(&settings.email)?,
            lease: settings.email_lease(),
            retry_schedule: settings.email.retry_schedule_ms.clone(),
            public_base_url: settings.email.public_base_url.clone(),
        });
        let (queue, released) = tokio::sync::mpsc::channel::<String>(QUEUED);
        let released = Arc::new(tokio::sync::Mutex::new(released));
        let (releasing, _) = tokio::sync::watch::channel(false);
        let tasks = settings.broadcasts.handoffs.max(1);
        for _ in 0..tasks {
            let (handoffs, released) = (Arc::clone(&handoffs), Arc::clone(&released));
            let mut decided = releasing.subscribe();
            tokio::spawn(async move {
                let mut taken = Vec::with_capacity(TAKEN);
                loop {
                    // Releases first: the tasks wait while due emails are being decided.
                    if decided.wait_for(|releasing| !releasing).await.is_err() {
                        return;
                    }
                    {
                        let mut released = released.lock().await;
                        // Its share of what is queued, so that a few released emails are not
                        // sent one after another by one task while the others wait.
                        let share = (released.len() / tasks).clamp(1, TAKEN);
                        if released.recv_many(&mut taken, share).await == 0 {
                            return;
                        }
                    }
                    if let Err(error) = handoffs.hand_off(&taken).await {
                        tracing::warn!(emails = taken.len(), error = %format!("{error:#}"),
                            "released emails are left to the outbox worker");
                    }
                    taken.clear();
                }
            });
        }
        Ok(Self {
            pool,
            log,
            lease: settings.email_lease(),
            // Held sends keep their time: a due one is looked for (on its index) at least every 100 ms.
            poll: Duration::from_millis(settings.email.outbox_poll_ms.clamp(10, 100)),
            queue,
            releasing,
            grace_ms: i64::try_from(settings.email.handoff_grace_ms).unwrap_or(i64::MAX),
        })
    }

    async fn run(&self) -> anyhow::Result<Outcome> {
        let counted = self.count_runs().await?;
        let token = Uuid::now_v7();
        let due = self.lease_due(token).await;
        // A full batch: more may be due, and the hand-offs wait until a step finds fewer.
        self.releasing.send_replace(matches!(&due, Ok(due) if due.len() >= BATCH as usize));
        let due = due?;
        if due.is_empty() {
            return Ok(if counted { Outcome::Progressed } else { Outcome::Idle });
        }
        let chunks = chunks(due);
        let decided =
            join_all(chunks.iter().map(|(space_id, emails)| self.decide_space(space_id, emails, token))).await;
        for ((space_id, _), result) in chunks.iter().zip(decided) {
            if let Err(error) = result {
                // The lease runs out and a later step decides them again.
                tracing::warn!(space = %space_id, error = %format!("{error:#}"), "held sends stay held for a later step");
            }
        }
        self.count_runs().await?;
        Ok(Outcome::Progressed)
    }

    /// Leases up to [`BATCH`] due held emails under `token` and reads their `EmailScheduled`.
    async fn lease_due(&self, token: Uuid) -> anyhow::Result<Vec<Due>> {
        let client = self.pool.get().await?;
        let statement = client
            .prepare_cached(
                "UPDATE email_outbox o SET lease_token = $1, leased_until = now() + make_interval(secs => $2)
                 FROM (SELECT email_id FROM email_outbox
                       WHERE state = 'held' AND next_attempt_at <= now()
                         AND (leased_until IS NULL OR leased_until < now())
                       ORDER BY next_attempt_at LIMIT $3 FOR UPDATE SKIP LOCKED) due
                 WHERE o.email_id = due.email_id
                 RETURNING o.email_id",
            )
            .await?;
        let ids: Vec<String> = client
            .query(&statement, &[&token, &self.lease.as_secs_f64(), &BATCH])
            .await?
            .into_iter()
            .map(|row| row.get(0))
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let streams: Vec<String> = ids.iter().map(|id| domain::email::stream_id(id)).collect();
        let statement = client
            .prepare_cached(
                "SELECT payload FROM events WHERE stream_id = ANY($1) AND event_type = 'EmailScheduled.v1'
                 ORDER BY position",
            )
            .await?;
        let mut due = Vec::with_capacity(ids.len());
        for row in client.query(&statement, &[&streams]).await? {
            let LogEvent::EmailScheduled(event) = LogEvent::decode("EmailScheduled.v1", row.get(0))? else {
                continue;
            };
            due.push(Due {
                email_id: event.email_id.into(),
                space_id: event.space_id.into(),
                contact_id: event.contact_id.into(),
                template_id: event.template_id,
                topic_id: Some(event.topic_id).filter(|topic| !topic.is_empty()),
                origin: (
                    event.origin,
                    event.form_id,
                    event.parent_id,
                    event.step_id,
                    event.variant,
                    event.experiment_winner,
                ),
            });
        }
        Ok(due)
    }

    /// Decides the space's due emails again and records the outcomes in one append; when a
    /// contact was sent marketing email since the decision read its sends, decides again from
    /// a new reading (a few times, then the lease runs out and a later step does).
    async fn decide_space(&self, space_id: &str, emails: &[Due], token: Uuid) -> anyhow::Result<()> {
        for _ in 1..DECIDE_ATTEMPTS {
            match self.decide_space_once(space_id, emails, token).await {
                Err(error) if is_sends_moved(&error) => {
                    tracing::debug!(space = %space_id, error = %format!("{error:#}"), "held sends decided again");
                }
                other => return other,
            }
        }
        self.decide_space_once(space_id, emails, token).await
    }

    async fn decide_space_once(&self, space_id: &str, emails: &[Due], token: Uuid) -> anyhow::Result<()> {
        let client = self.pool.get().await?;
        let (Some(catalog), Some(segments)) =
            (live_schema(&client, "catalog").await?, live_schema(&client, "segments").await?)
        else {
            anyhow::bail!("a read model the held sends need has no live version yet");
        };
        let mut templates: HashMap<&str, Option<Authored>> = HashMap::new();
        for email in emails {
            if !templates.contains_key(email.template_id.as_str()) {
                let authored = Authored::load(&client, &catalog, space_id, &email.template_id).await?;
                templates.insert(&email.template_id, authored);
            }
        }
        let lookback = templates
            .values()
            .flatten()
            .find_map(|authored| authored.policy.as_ref())
            .and_then(mail::send::SendPolicy::lookback_ms);
        let contact_ids: Vec<String> = emails.iter().map(|email| email.contact_id.to_string()).collect();
        let mut recipients = Recipients::load(&client, (&catalog, &segments), space_id, &contact_ids, lookback).await?;
        let now = platform::time::now_millis();
        let decided = decide::decide(emails, &templates, &mut recipients, now);
        let stories = self.stories(&client, space_id, &templates, &recipients, &decided, now).await?;
        drop(client);
        let Appends { streams, guards, released } =
            decide::appends(space_id, &decided, stories, (token, self.grace_ms), now);
        self.log.append(AppendRequest::in_space(space_id, streams, guards)).await?;
        for email_id in released {
            // A full queue leaves the email to the outbox worker (it is `pending`, due to it
            // after the grace).
            if self.queue.try_send(email_id).is_err() {
                break;
            }
        }
        Ok(())
    }

    /// The `EmailSkipped` of each refused email, with the log event that decided (looked up
    /// for all of them at once).
    async fn stories(
        &self,
        client: &impl GenericClient,
        space_id: &str,
        templates: &HashMap<&str, Option<Authored>>,
        recipients: &Recipients,
        decided: &[(&Due, Decided, Option<mail::send::ZoneUsed>)],
        now: i64,
    ) -> anyhow::Result<Vec<StreamAppend>> {
        let no_keys: Vec<String> = Vec::new();
        let refused: Vec<(&Due, &Authored, mail::skipped::Refused<'_>, Option<&mail::send::ZoneUsed>)> = decided
            .iter()
            .filter_map(|(email, outcome, zone)| {
                let Decided::Skip { gate, filled_by } = outcome else { return None };
                // A contact deleted meanwhile: its emails' stories went with it, so none is
                // written again (the row is `skipped` all the same).
                if *gate == Gate::Gone {
                    return None;
                }
                let authored = templates.get(email.template_id.as_str())?.as_ref()?;
                let contact = recipients.contacts.get(email.contact_id.as_str());
                let refused = mail::skipped::Refused {
                    contact_id: &email.contact_id,
                    gate: *gate,
                    address: contact
                        .and_then(|contact| contact.document.get("email"))
                        .and_then(Value::as_str)
                        .unwrap_or(""),
                    topic_id: email.topic_id.as_deref(),
                    consent_keys: contact
                        .and_then(|contact| recipients.consent_keys.get(&contact.schema_id))
                        .unwrap_or(&no_keys),
                    filled_by: *filled_by,
                };
                Some((*email, authored, refused, zone.as_ref()))
            })
            .collect();
        if refused.is_empty() {
            return Ok(Vec::new());
        }
        let asked: Vec<mail::skipped::Refused<'_>> = refused.iter().map(|(_, _, refused, _)| *refused).collect();
        let found = mail::skipped::decided_by(client, space_id, &asked, &recipients.keys).await?;
        Ok(refused
            .iter()
            .zip(found)
            .map(|((email, authored, refused, zone), by)| {
                let (kind, source, parent, step, variant, winner) = &email.origin;
                mail::skipped::skipped_after(mail::skipped::Skip {
                    email_id: &email.email_id,
                    space_id,
                    authored,
                    contact_id: &email.contact_id,
                    origin: Origin {
                        kind,
                        source_id: source,
                        parent_id: parent,
                        step_id: step,
                        variant,
                        winner: *winner,
                    },
                    gate: refused.gate,
                    decided_by: by.as_ref(),
                    // Its `EmailScheduled` named the address.
                    recipient: None,
                    zone: *zone,
                    at_ms: now,
                })
            })
            .collect())
    }

    /// Counts skipped broadcast recipients not counted yet into their runs, for runs no step
    /// holds (a sending run's step counts its own).
    async fn count_runs(&self) -> anyhow::Result<bool> {
        let mut client = self.pool.get().await?;
        let runs: Vec<String> = client
            .query("SELECT DISTINCT run_id FROM broadcast_recipients WHERE state = 'skipped' AND NOT counted", &[])
            .await?
            .into_iter()
            .map(|row| row.get(0))
            .collect();
        let mut counted = false;
        for run_id in runs {
            let transaction = client.transaction().await?;
            let locked = transaction
                .query_opt("SELECT 1 FROM broadcast_runs WHERE run_id = $1 FOR UPDATE SKIP LOCKED", &[&run_id])
                .await?;
            if locked.is_some() {
                crate::workers::broadcasts::count_skipped(&transaction, &run_id).await?;
                counted = true;
            }
            transaction.commit().await?;
        }
        Ok(counted)
    }
}

impl HandOffs {
    /// Rebuilds the `released` emails' messages together, then claims and sends each in turn.
    async fn hand_off(&self, released: &[String]) -> anyhow::Result<()> {
        let mut client = self.pool.get().await?;
        let prepared = outbox::prepare_many_from_log(&mut client, released, &self.public_base_url).await?;
        drop(client);
        // One erased since is left to the outbox worker, which records it.
        for prepared in prepared.into_iter().flatten() {
            match self.claims.claim(&prepared.parties.email_id, self.lease).await {
                Ok(Some(lease)) => {
                    outbox::hand_off(
                        &self.pool,
                        &self.log,
                        &self.mailer,
                        &lease,
                        &prepared,
                        Some(&self.retry_schedule),
                    )
                    .await;
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(email = %prepared.parties.email_id, error = %format!("{error:#}"),
                    "a released email is left to the outbox worker"),
            }
        }
        Ok(())
    }
}

impl Worker for Held {
    fn name(&self) -> String {
        "email_held".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[]
    }

    fn poll_interval(&self) -> Duration {
        self.poll
    }

    fn idle_ceiling(&self) -> Duration {
        IDLE_CEILING
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(self.run())
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async {
            let client = self.pool.get().await?;
            let held: i64 =
                client.query_one("SELECT count(*) FROM email_outbox WHERE state = 'held'", &[]).await?.get(0);
            metrics::gauge!("email_held").set(held as f64);
            Ok(None)
        })
    }
}
