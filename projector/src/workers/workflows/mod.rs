//! The workflow engine: runs are process managers over the log.
//!
//! - **Runs** ([`Engine`], worker `workflow_runs`, any number of processes): each step reads
//!   the due runs of its process's share from `workflow_runs` (no claim is written) and
//!   advances each in a task of its own (`run.rs`), so a slow receiver holds back only its own
//!   run. Every transition is appended to the run's stream at its version together with the
//!   update of its row at the row's own version, so a transition happens once whichever
//!   process makes it, and a crash anywhere resumes from what the log (and the row written with it)
//!   holds.
//! - **Events** ([`Follower`], worker `workflow_events`, one process at a time by its lease):
//!   follows the log; an event that becomes ready for a contact ends the `wait_for_event`
//!   steps waiting for it and starts the runs of workflows it triggers; a contact's deletion
//!   makes its runs due, so the engine ends them.
//!
//! Waits are due times of the run queue itself (`workflow_runs.due_at`), not rows of the
//! runtime's `timers`: a step may call a webhook, and a timer's claim transaction must not be
//! held across an outside call (the reason the webhook outbox is a queue of its own too).
//!
//! # Workflows
//!
//! A workflow is authored (`command-service/src/authoring/workflows.rs`: the graph checked by
//! `domain::workflows::check`, references resolved to ids, branch conditions parsed into the
//! filter language, a signing secret sealed under a data key of its own) and held by the catalog
//! as `domain::workflows::WorkflowDef`. The API pauses and unpauses it on stream
//! `workflow-<id>` (with the engine's `workflow_controls` row in the same append), and triggers
//! runs (`command-service/src/workflows/`): `WorkflowRunRequested` on the run's stream
//! `workflow-run-<runId>`, the contact the input names upserted in the same append, the input
//! sealed under the contact's data key (or a key of the run's own), and the engine's row in
//! `workflow_runs`, due at once. When the run's first transition needs no fact and reaches
//! nothing outside (it starts and waits, branches on the input, or ends), the trigger makes
//! it with the engine's own decision (`journeys::decide`) and appends it with the request
//! (one write per run that only starts and waits); the row then starts where it left the
//! run, and only while the workflow is not paused (else the trigger decides again knowing the
//! pause, and the run waits).
//!
//! **The engine** (`projector/src/workers/workflows/`) runs each run as a process manager over
//! the log. Worker `workflow_runs` (any number of processes) reads due rows and advances each
//! in a task of its own, at most 1,024 per process (`APP__WORKFLOWS__CONCURRENCY`: their
//! transitions are appended together, so many runs falling due at once make few large batches).
//! **No claim is written per run.** The processes that run the engine share the runs out by a
//! hash of the run's id (`platform::liveness::Share`: each live member, in the order of its
//! process id, takes its part; a member that stops beating for 5 s is dropped and its part goes
//! to the others, each of which reads the members once a second; a live member that does not
//! advance its part, every slot held by slow calls, loses the runs of it that are 10 s overdue to
//! a process with free slots), and a process leaves out the runs it is advancing already (an in-memory set:
//! they stay due until their transitions commit). What makes a transition happen once is its
//! write: the run's stream at its version, and the row's update at the row's own version
//! (`row_version`, which every transition's update advances, also one that appends nothing,
//! as a call's later attempts do). Two processes that decide one run while the members change
//! (one joined, or one is not yet seen dead) both write; the second finds the version taken,
//! writes nothing and leaves the run alone. A transition's effects come after its commit, so the loser has
//! none. The read sends `platform::db::KEYED_PLANS` (as the log's append transactions and the
//! webhook claim do) so that its plan stays an index lookup however stale the table's
//! statistics. (Until this release the read was a claim: an update of each row's lease before
//! its transition, a fifth of the database's CPU per transition when 10,000 waits ended at
//! once; docs/benchmarks.md.) A webhook call holds its run while it goes out: the transition
//! that starts it writes a lease on the row naming its process (`APP__WORKFLOWS__LEASE_MS`, at
//! least the attempt's timeout and 5 s), which no other process passes while that process beats.
//! A run's email hand-off waits for one of two permits per relay
//! connection, so rendered messages do not pile up when the relay is slower than the runs. A
//! tick has the command side's shape:
//!
//! 1. **Load** (`run.rs`): the row (with the pause control and the run's data key), the
//!    definition at the run's revision (from its authoring stream, kept per revision).
//! 2. **Decide** (`journeys::decide`, pure and synchronous, with given/when/then tests for every step
//!    kind, branches, loop bounds, pauses and calls): `decide(row, definition, facts, given)`
//!    executes steps until one must wait, writes to another stream, or the run ends. A step
//!    that reaches for a fact not loaded yet (the contact: its record and subscriptions from
//!    the log, memberships from the `segments` read model; a send step's template with its
//!    sender, domain and allowance; whether the address is suppressed; the workflow's signing
//!    secret) gets `Decided::Needs`; `run.rs` loads that one fact and decides again from the
//!    start, so a fact is read once per tick and only when a step needs it. `now`, the retry
//!    jitter and a call's outcome are given, not read.
//! 3. **Append** the transition, in one transaction: the run's changes at the stream's version
//!    (`WorkflowRunStarted`, `WorkflowStepStarted`/`Finished`, `WorkflowRunSleeping`, `Paused`,
//!    `Resumed`, `Finished`) as one log event, `WorkflowRunAdvanced`, holding them in order when
//!    there are several (`domain::workflows::transition`; readers unwrap it with `changes`, and an
//!    earlier release's separate events fold the same), the other streams' events (`EmailScheduled` with its outbox row and
//!    allowance count, `RecordUpdated` at the record's version, `SubscriptionChanged`) and the
//!    row's update at its version.
//! 4. **Effects** once it is committed: an email's hand-off (the outbox worker is its backstop),
//!    or a webhook call (`workers/outbound.rs`, the client and answer rules webhook delivery
//!    uses too), whose outcome is given to the next decision.
//!
//! So each transition happens once, however many processes race, and a crash anywhere leaves
//! the run where the log says.
//!
//! - **Effects at most once per (run, index).** An email's id is derived from (run, index) and
//!   its stream is new, so it is scheduled once (or, refused by a gate, skipped once: the
//!   decision asks for the fact that decided, `Need::DecidedBy`, and the transition appends the
//!   email's `EmailSkipped` with the step's `skipped` record, which names the email); its hand-off is the outbox's (never twice). A
//!   record change goes at the record's version with the step's record. A webhook call is two
//!   transitions: the start, with the attempt marked going out and the row leased to the
//!   process, is committed before the request; the outcome after. A run whose call is marked
//!   going out with no outcome, found by another process once the lease ran out or its holder
//!   stopped beating, lost it in a crash: the step is `outcome_unknown` and the run goes on,
//!   never calling again. The call's
//!   `webhook-id` is derived from (run, index) too, the same for every attempt.
//! - **Waits** are the run's `due_at`: a `wait` until its time, a `wait_for_event` until its
//!   timeout. Worker `workflow_events` (one process at a time, by its lease) follows the log: an
//!   event that becomes ready for a contact ends the waits for its schema that began before it
//!   (`waiting_after`, the log head when the wait's transition was appended), and starts the
//!   runs of workflows it triggers (run ids derived from (workflow, event), so a batch followed
//!   twice starts nothing twice); a contact's deletion makes its runs due, and the engine ends
//!   them (`exited`, `contact_erased`). Waits are not rows of the runtime's `timers`: a step may
//!   call a webhook, which a timer's claim transaction must not wait on.
//! - **Engagement.** A send step's output is its `emailId`. A `wait_for_engagement` asks the
//!   log first (`Need::Engagement`: the email's stream, a person's `EmailOpened` or
//!   `EmailClicked`) and goes on at once when the person already did; otherwise it sleeps with
//!   `waiting_schema` `opened:<emailId>` (or `clicked:`), which the follower matches on a
//!   person's open or click after the wait began, as it matches events. At the timeout the
//!   engine asks the log once more, so an open recorded while the wait was being committed is
//!   not missed. A branch whose condition reads `steps.<id>.opened` or `.clicked` loads the same
//!   fact and sees it in the send step's output.
//! - **Segment triggers.** Membership is a read model, not a log event, so the `segments` read
//!   model records each join as an entry `(segment, log position of the change that made the
//!   contact a member, contact)` in the same transaction as its checkpoint. The same follower
//!   follows, per published workflow and segment it triggers on, the entries after a position
//!   of its own (`workflow_segment_triggers.through`, starting at the position of the definition
//!   that published the trigger, so members from before start nothing) up to the position the
//!   read model has reached, and starts a run per entry under the trigger's re-entry rule, its
//!   id derived from (workflow, segment, contact, position). A step that finds no entry after
//!   any trigger's position passes over the log without its lease and leaves those positions
//!   where they were. An entry is never split across steps and a repeat starts nothing twice.
//!   A contact that enters and leaves between two steps of the follower still has its entry. A rebuild of `segments` records the same entries
//!   at the same positions, except where batching evaluated a contact at a later change of the
//!   same batch: such an entry can start a second run when the rebuild goes live past the
//!   trigger's position (a re-entry rule other than `always` holds it back).
//! - **Re-entry** is read from the engine's own rows: `once` holds a start back when
//!   `workflow_runs` has any run of the workflow for the contact, `once_at_a_time` when one is
//!   unfinished, whatever started it (the API's trigger inserts its row in the append that
//!   requests the run, the follower in its own). The follower is the only process that starts
//!   trigger runs, so the rule is checked in log order; a trigger through the API at the same
//!   moment is not serialised with that check (it is an explicit request and always runs).
//! - **Pause.** While `workflow_controls.paused`, a run that becomes due is parked (`paused`,
//!   not due; `WorkflowRunPaused` when it had started) by a guard that holds the control row
//!   `FOR SHARE`, so an unpause committing meanwhile is never missed; the unpause's append makes
//!   every parked run due at once, so a wait that elapsed meanwhile completes at once.
//! - **Revisions.** A run follows the revision it was requested on. A new revision's `inFlight`
//!   rule (`domain::workflows::InFlightRule`: `pin`, `exit`, `migrate` with a step mapping) says
//!   what happens to the runs of earlier ones. The apply that publishes it counts their open
//!   runs by step from `workflow_runs`, refuses a mapping that leaves a step holding runs
//!   without a place (`check_in_flight`), and, for `exit` and `migrate`, marks the rows
//!   (`migrate_to`, due at once; a wait's due time is kept in `in_flight.untilMs`) and records the
//!   revision in `workflow_controls.moved_to`, so a run inserted later on an earlier revision (a
//!   trigger that read a stale catalog) is marked too. The engine's next transition of a marked
//!   run decides the move first (`journeys`' `decide/migrate.rs`: `WorkflowRunMigrated`, the step in flight
//!   ending `migrated`, its target started with the due time kept or planned again; or the run
//!   ending `exited`, `workflow_revised`), at the run's stream version: a run moves once, and a
//!   webhook call in flight finishes on its own step before the run moves. The `workflows` read
//!   model keeps each revision and each run's revision and migrations (`GET
//!   /workflows/{id}/revisions`).
//! - **Replay.** `workflows/replay/` plays a definition over a window of its space's log with
//!   the engine's own `decide` and no effect (`platform apply FILE --dry-run --replay 30d`): the
//!   follower's rules (ready events, segment entries, deletions, engagement) and the engine's
//!   due times on the log's clock, the facts loaded as the engine's shell loads them
//!   (`run::contacts_facts`, set-wise per batch), runs kept in memory and dropped when they end.
//!   Through the API (`POST /workflows/{id}/replays`) the request is a log event
//!   (`WorkflowReplayRequested`); the `workflow_replays` worker (`workflows/replays.rs`) runs it
//!   up to the request's position and appends `WorkflowReplayFinished` at version 2 of the
//!   replay's stream (once, whoever runs it); `GET /workflows/{id}/replays/{replayId}` reads that
//!   stream from the log.
//! - **Erasure.** A run's input and step outputs are sealed under its contact's data key:
//!   erasing the contact shreds them, and a run that finds its input unreadable ends.
//! - **Read models.** The `workflows` read model holds the definitions with their pause state,
//!   and each run with its step history; the history is the `WorkflowStepStarted` and
//!   `WorkflowStepFinished` changes of the run (on their own or inside `WorkflowRunAdvanced`),
//!   so a rebuild gives the same runs and histories. The audit trail gives an entry per change;
//!   a later change of one event has the event's entry id with `_` and its place.
//!   A batch's run events are folded in memory per run and per history record (what applying
//!   them one by one would leave) and written set-wise: six statements per batch, whatever
//!   it holds. The statements that write history records also count them in `step_counts`
//!   (workflow, step, measure): a record written for the first time is a step `entered`, a
//!   finished one counts under its status and a skipped one under its reason (the gate, or the
//!   error code). `GET /workflows/{id}/stats` reads those with `run_counts` and, for send
//!   steps, the `emails` read model's counters, in the definition's step order.

mod follow;
pub mod replay;
mod replays;
mod run;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use domain::workflows::WorkflowDef;
use futures_util::future::BoxFuture;
use mail::mailer::Mailer;
use platform::log::EventLog;
use platform::settings::Settings;
use tokio::sync::Semaphore;

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
    /// Held while a definition is read from the log, so that the runs that fall due together
    /// for a workflow this process has not read yet read it once, not once each.
    loading: tokio::sync::Mutex<()>,
    slots: Arc<Semaphore>,
    /// The runs this process is advancing. None is read again by this process until its task
    /// is done: on a machine too busy to advance runs promptly, taking them again made every
    /// transition lose its version to another, over and over, and the runs stood still.
    in_flight: Arc<Mutex<HashSet<String>>>,
    /// This process's share of the runs and when it was read: read again once a second, not
    /// on every step (a step follows each append's notification).
    share: Mutex<Option<(Instant, platform::liveness::Share)>>,
    /// When this process last looked for runs overdue in other processes' shares.
    took_over_at: Mutex<Option<Instant>>,
    /// Emails' hand-offs under way or waiting for a relay connection: two per pooled
    /// connection, so every connection has the next message ready and no more are held.
    handoffs: Arc<Semaphore>,
}

impl Inner {
    /// How long a run with a call out is leased to this process (at least the webhook call
    /// timeout and a margin), unless the process stops beating sooner.
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
            loading: tokio::sync::Mutex::new(()),
            slots: Arc::new(Semaphore::new(settings.workflows.concurrency.max(1))),
            in_flight: Arc::default(),
            share: Mutex::default(),
            took_over_at: Mutex::default(),
            handoffs: Arc::new(Semaphore::new(2 * usize::try_from(settings.email.pool_size.max(1)).unwrap_or(1))),
        })))
    }

    async fn step(&self) -> anyhow::Result<Outcome> {
        let first = self.0.slots.clone().acquire_owned().await?;
        let free = self.0.slots.available_permits() + 1;
        let mut client = self.0.pool.get().await?;
        let share = self.share(&client).await?;
        // The due runs of this process's share that it is not advancing already, and not held
        // by a call going out from a live process. Reading them writes nothing: the run's
        // transition, appended at its stream's version with the row's update at the row's own
        // version, is what makes it happen once. The statement finds rows by the index of due
        // times; `db::KEYED_PLANS` keeps it to that whatever the table's statistics say. The
        // runs in flight here are still due until their transitions commit, so the scan passes
        // over them: `NOT IN` a subquery makes that a hashed lookup (`<> ALL` of the array
        // compared each row with every id, 24 ms a read with 1,000 in flight against 1 ms).
        // The same statement reads the runs other shares hold back (`$7` false, overdue by `$6`).
        let transaction = client.transaction().await?;
        let statement = transaction
            .prepare_cached(&format!(
                "SELECT {} FROM workflow_runs r
                 WHERE r.due_at <= clock_timestamp() - make_interval(secs => $6)
                   AND (r.lease_until IS NULL OR r.lease_until < clock_timestamp() OR {})
                   AND r.run_id NOT IN (SELECT unnest($2::text[])) AND {} = $7::bool
                 ORDER BY r.due_at LIMIT $1",
                run::ROW,
                platform::liveness::is_dead("r.lease_token", "$3"),
                platform::liveness::Share::holds("r.run_id", "$4", "$5"),
            ))
            .await?;
        let limit = i64::try_from(free).unwrap_or(1);
        let mine: Vec<String> = self.0.in_flight.lock().map(|runs| runs.iter().cloned().collect()).unwrap_or_default();
        let dead_after = platform::liveness::DEAD_AFTER.as_secs_f64();
        let (now, of_this_share) = (0.0_f64, true);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
            [&limit, &mine, &dead_after, &share.index, &share.of, &now, &of_this_share];
        let (_, mut rows) = tokio::try_join!(
            transaction.batch_execute(platform::db::KEYED_PLANS),
            transaction.query(&statement, &params)
        )?;
        // A member that beats but does not advance its share (every slot held by slow calls, a
        // process stuck) would hold its runs back for as long as it lives: a process with slots
        // to spare takes the runs of other shares that are overdue by `TAKE_OVER_AFTER`, at
        // most once a second. Their writes' versions keep a run that two processes decide to
        // one transition, as in any change of the members.
        if share.of > 1 && rows.len() < free && self.may_take_over() {
            let left = limit - i64::try_from(rows.len()).unwrap_or(limit);
            let (overdue, of_this_share) = (TAKE_OVER_AFTER.as_secs_f64(), false);
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
                [&left, &mine, &dead_after, &share.index, &share.of, &overdue, &of_this_share];
            let taken = transaction.query(&statement, &params).await?;
            if !taken.is_empty() {
                tracing::info!(runs = taken.len(), "taking over runs overdue in other processes' shares");
                metrics::counter!("workflow_runs_taken_over_total").increment(taken.len() as u64);
            }
            rows.extend(taken);
        }
        transaction.commit().await?;
        drop(client);
        let claimed = rows.len();
        let mut first = Some(first);
        for row in &rows {
            let permit = match first.take() {
                Some(permit) => permit,
                None => self.0.slots.clone().acquire_owned().await?,
            };
            let inner = self.0.clone();
            let run_id: String = row.get(0);
            // The row's version read: a failed tick backs off only a run no one moved since.
            let version: Option<i64> = row.try_get(run::ROW_VERSION).ok();
            let read = run::read_row(row);
            let done = InFlight::enter(&inner.in_flight, &run_id);
            tokio::spawn(async move {
                let _done = done;
                match read {
                    Ok(row) => run::advance(&inner, row).await,
                    Err(error) => {
                        tracing::warn!(run = %run_id, error = format!("{error:#}"), "a workflow run will be tried again");
                        run::back_off(&inner.pool, &run_id, version).await;
                    }
                }
                drop(permit);
            });
        }
        Ok(if claimed >= free { Outcome::Progressed } else { Outcome::Idle })
    }
}

impl Engine {
    /// Whether this step may look for overdue runs of other shares: at most once a second.
    fn may_take_over(&self) -> bool {
        let Ok(mut last) = self.0.took_over_at.lock() else { return false };
        if last.is_some_and(|at| at.elapsed() < SHARE_FOR) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    /// This process's share of the runs, read at most once a second (the members change as
    /// processes start and as their beats age past `liveness::DEAD_AFTER`, a bound of seconds).
    async fn share(&self, client: &deadpool_postgres::Client) -> anyhow::Result<platform::liveness::Share> {
        let kept = self.0.share.lock().ok().and_then(|kept| *kept);
        if let Some((read_at, share)) = kept
            && read_at.elapsed() < SHARE_FOR
        {
            return Ok(share);
        }
        let share = platform::liveness::Share::read(client, "workflow_runs").await?;
        if let Ok(mut kept) = self.0.share.lock() {
            *kept = Some((Instant::now(), share));
        }
        Ok(share)
    }
}

/// How long the engine keeps the share it read.
const SHARE_FOR: Duration = Duration::from_secs(1);

/// How long a run may be overdue in another live member's share before a process with free
/// slots takes it: twice the time a dead member takes to be noticed, so a member that keeps up
/// is never raced for its runs.
const TAKE_OVER_AFTER: Duration = Duration::from_secs(10);

/// A run this process is advancing: it stays out of the process's reads of due runs until
/// its task is done (or gone).
struct InFlight {
    runs: Arc<Mutex<HashSet<String>>>,
    run_id: String,
}

impl InFlight {
    fn enter(runs: &Arc<Mutex<HashSet<String>>>, run_id: &str) -> Self {
        if let Ok(mut set) = runs.lock() {
            set.insert(run_id.to_owned());
        }
        Self { runs: runs.clone(), run_id: run_id.to_owned() }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut runs) = self.runs.lock() {
            runs.remove(&self.run_id);
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
