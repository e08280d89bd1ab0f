//! A run's experiment in the engine (docs/decisions.md, "Broadcast experiments"):
//!
//! - **Split** (at the run's start, in the starter's transaction): each recipient of the
//!   snapshot falls in the test with a variant, or in the rest
//!   (`domain::email::experiments::assign`, a digest of the broadcast, the run and the
//!   contact); the test recipients' variants are written set-wise, a page at a time. The run's
//!   phase is `test`: its steps send the test recipients only.
//! - **Wait**: once no test recipient is pending, the phase is `wait` and a
//!   `broadcast_experiments` timer is due at the end of the wait.
//! - **Verdict** ([`Verdicts`], that timer's handler): once every open and click taken by the
//!   end of the wait is in the log and the `emails` read model has applied it, each variant's
//!   figures are read in one statement
//!   (`reads::experiments::tallies`), decided (`domain::email::experiments::decide`) and the
//!   verdict appended as the only event of the run's own stream (`broadcast-run-<runId>`,
//!   expected not to exist), so it is recorded once: a timer that fires again after a crash
//!   finds it there and applies the recorded one. Applied in the timer's transaction: the
//!   phase becomes `winner` (contacts who joined the audience since the start join the rest)
//!   and the steps send the rest the winner; or, without a winner, the rest is skipped as
//!   `experiment_stopped` and the run completes.

use deadpool_postgres::Transaction;
use domain::email::experiments::{self, Cohort, ExperimentDef};
use futures_util::future::BoxFuture;
use platform::events::LogEvent;
use platform::log::{AppendRequest, EventLog, ExpectedVersion, StreamAppend};
use platform::proto;
use platform::readmodel::live_schema;
use prost::Message;
use serde_json::{Value, json};

use crate::timers::{Handled, Timer, TimerHandler};

/// The timer kind that decides a run's experiment at the end of its wait.
pub(crate) const VERDICT_TIMER: &str = "broadcast_experiments";

/// Recipients read per page when the test is drawn.
const PAGE: i64 = 10_000;

/// The stream of a run's verdict.
pub(crate) fn stream_id(run_id: &str) -> String {
    format!("broadcast-run-{run_id}")
}

/// Draws the test of run `run_id` over its snapshot: writes each test recipient's variant.
/// Returns how many are in the test.
pub(super) async fn split(
    transaction: &Transaction<'_>,
    (broadcast_id, run_id): (&str, &str),
    experiment: &ExperimentDef,
) -> anyhow::Result<i64> {
    let mut after = String::new();
    let mut tested = 0;
    loop {
        let contacts: Vec<String> = transaction
            .query(
                "SELECT contact_id FROM broadcast_recipients WHERE run_id = $1 AND contact_id > $2
                 ORDER BY contact_id LIMIT $3",
                &[&run_id, &after, &PAGE],
            )
            .await?
            .into_iter()
            .map(|row| row.get(0))
            .collect();
        let Some(last) = contacts.last().cloned() else { return Ok(tested) };
        let (mut ids, mut variants) = (Vec::new(), Vec::new());
        for contact_id in contacts {
            let cohort = experiments::assign(
                broadcast_id,
                run_id,
                &contact_id,
                experiment.test_share,
                experiment.variants.len(),
            );
            if let Cohort::Test(index) = cohort {
                variants.push(experiment.variants[index].id.clone());
                ids.push(contact_id);
            }
        }
        tested += i64::try_from(ids.len()).unwrap_or(i64::MAX);
        transaction
            .execute(
                "UPDATE broadcast_recipients r SET variant = t.variant
                 FROM unnest($2::text[], $3::text[]) AS t(contact_id, variant)
                 WHERE r.run_id = $1 AND r.contact_id = t.contact_id",
                &[&run_id, &ids, &variants],
            )
            .await?;
        after = last;
    }
}

/// Ends run `run_id`'s test send: the phase is `wait` and the verdict's timer is due at the end
/// of the wait, in the step's transaction.
pub(super) async fn wait(
    transaction: &Transaction<'_>,
    run_id: &str,
    experiment: &ExperimentDef,
) -> anyhow::Result<()> {
    let decide_at = chrono::Utc::now() + chrono::Duration::milliseconds(experiment.wait_ms);
    transaction
        .execute("UPDATE broadcast_runs SET phase = 'wait', decide_at = $2 WHERE run_id = $1", &[&run_id, &decide_at])
        .await?;
    crate::timers::schedule(transaction, VERDICT_TIMER, run_id, decide_at, &json!({"runId": run_id})).await?;
    Ok(())
}

/// Decides runs' experiments when their wait ends.
pub(crate) struct Verdicts {
    log: EventLog,
    /// `APP__PROJECTOR__CRASH_AFTER_VERDICT`: the kill test's fault.
    crash_after_verdict: bool,
}

impl Verdicts {
    pub(crate) fn new(log: EventLog, crash_after_verdict: bool) -> Self {
        Self { log, crash_after_verdict }
    }

    async fn decide(&self, transaction: &Transaction<'_>, timer: &Timer) -> anyhow::Result<Handled> {
        let Some(run_id) = timer.payload.get("runId").and_then(Value::as_str) else { return Ok(Handled::Done) };
        let Some(row) = transaction
            .query_opt(
                "SELECT space_id, broadcast_id, experiment, audience, decide_at, verdict_due FROM broadcast_runs
                 WHERE run_id = $1 AND phase = 'wait' FOR UPDATE",
                &[&run_id],
            )
            .await?
        else {
            return Ok(Handled::Done);
        };
        let (space_id, broadcast_id): (String, String) = (row.get(0), row.get(1));
        let experiment: ExperimentDef = serde_json::from_value(row.get(2))?;
        let audience: domain::email::resources::Audience = serde_json::from_value(row.get(3))?;
        let decide_at: chrono::DateTime<chrono::Utc> = row.get(4);
        let due: Option<i64> = row.get(5);
        let (Some(emails), Some(segments), Some(events)) = (
            live_schema(transaction, "emails").await?,
            live_schema(transaction, "segments").await?,
            live_schema(transaction, "events").await?,
        ) else {
            return Ok(Handled::Retry("a read model the verdict reads has no live version yet".to_owned()));
        };
        let decided = match self.recorded(transaction, run_id).await? {
            Some(decided) => decided,
            None => {
                // The figures count every open and click taken by the end of the wait: once the
                // engagement worker has appended them all, the log's head then is the verdict's
                // due position (kept on the run, so a retry waits for the same one), and the
                // `emails` read model (and for conversions, `events`) must have applied that far.
                let waiting = transaction
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM engagement_inbox WHERE at_ms <= $1)",
                        &[&decide_at.timestamp_millis()],
                    )
                    .await?
                    .get::<_, bool>(0);
                if waiting {
                    return Ok(Handled::RetryAt(chrono::Utc::now() + chrono::Duration::milliseconds(200)));
                }
                let due: i64 = match due {
                    Some(due) => due,
                    None => transaction
                        .query_one(
                            "UPDATE broadcast_runs SET verdict_due = (SELECT position FROM log_head) WHERE run_id = $1
                             RETURNING verdict_due",
                            &[&run_id],
                        )
                        .await?
                        .get(0),
                };
                let read = match experiment.metric {
                    experiments::Metric::Conversion { .. } => vec!["emails", "events"],
                    experiments::Metric::Clicks | experiments::Metric::Opens => vec!["emails"],
                };
                let reached: i64 = transaction
                    .query_one(
                        "SELECT COALESCE(min(position), 0) FROM projections WHERE name = ANY($1) AND status = 'live'",
                        &[&read],
                    )
                    .await?
                    .get(0);
                if reached < due {
                    return Ok(Handled::RetryAt(chrono::Utc::now() + chrono::Duration::milliseconds(200)));
                }
                // A read model that quarantined one of the space's events holds the space's later
                // ones until an operator retries it: its figures would be short, so the verdict
                // waits for the retry rather than decide on them.
                let held = transaction
                    .query_one(
                        "SELECT EXISTS (
                             SELECT 1 FROM projection_dead_letters d
                             JOIN projections p ON p.name = d.name AND p.version = d.version AND p.status = 'live'
                             WHERE d.name = ANY($1) AND d.space_key = $2 AND d.resolved_at IS NULL)",
                        &[&read, &space_id],
                    )
                    .await?
                    .get::<_, bool>(0);
                if held {
                    tracing::warn!(
                        run = %run_id,
                        "the verdict waits: a read model it reads holds a dead letter of the run's space \
                         (projector dead-letters list)"
                    );
                    return Ok(Handled::RetryAt(chrono::Utc::now() + chrono::Duration::seconds(5)));
                }
                let tallies =
                    reads::experiments::tallies(transaction, (&emails, &events), run_id, &experiment.metric).await?;
                let ordered: Vec<experiments::Tally> = experiment
                    .variants
                    .iter()
                    .map(|variant| tallies.get(&variant.id).copied().unwrap_or_default())
                    .collect();
                let verdict = experiments::decide(&experiment, &ordered);
                let now = platform::time::now_millis();
                let event = proto::BroadcastExperimentDecided {
                    run_id: run_id.to_owned(),
                    broadcast_id: broadcast_id.clone(),
                    space_id: space_id.clone(),
                    winner: verdict.winner.clone().unwrap_or_default(),
                    clear: verdict.clear,
                    rule: verdict.rule.to_owned(),
                    verdict_json: serde_json::to_string(&verdict)?,
                    decided_at_ms: now,
                };
                let stream = StreamAppend::one(
                    stream_id(run_id),
                    ExpectedVersion::NoStream,
                    LogEvent::BroadcastExperimentDecided(event),
                    now,
                );
                // Another attempt may have recorded it (a process died before applying it):
                // what the log holds is applied, whichever attempt wrote it.
                if let Err(error) = self.log.append(AppendRequest::in_space(&space_id, vec![stream], Vec::new())).await
                {
                    tracing::info!(run = %run_id, %error, "the verdict was recorded before; applying the recorded one");
                }
                if self.crash_after_verdict {
                    tracing::error!(
                        "injected fault: aborting the projector between a verdict's append and its application"
                    );
                    std::process::abort();
                }
                match self.recorded(transaction, run_id).await? {
                    Some(decided) => decided,
                    None => return Ok(Handled::Retry("the verdict could not be recorded".to_owned())),
                }
            }
        };
        let verdict: Value = serde_json::from_str(&decided.verdict_json)?;
        if decided.winner.is_empty() {
            transaction
                .execute(
                    "WITH moved AS (
                         UPDATE broadcast_recipients SET state = 'skipped', reason = 'experiment_stopped'
                         WHERE run_id = $1 AND state = 'pending' AND variant IS NULL RETURNING 1)
                     UPDATE broadcast_runs SET phase = 'stopped', verdict = $2, status = 'completed',
                         finished_at = clock_timestamp(), skipped_experiment_stopped = (SELECT count(*) FROM moved)
                     WHERE run_id = $1",
                    &[&run_id, &verdict],
                )
                .await?;
            return Ok(Handled::Done);
        }
        // Contacts who joined the audience since the start are sent the winner with the rest.
        let joined = super::snapshot(transaction, run_id, &space_id, &audience, &segments).await?.0;
        transaction
            .execute(
                "UPDATE broadcast_runs SET phase = 'winner', winner = $2, verdict = $3,
                     audience_count = audience_count + $4
                 WHERE run_id = $1",
                &[&run_id, &decided.winner, &verdict, &i32::try_from(joined).unwrap_or(i32::MAX)],
            )
            .await?;
        transaction.execute("SELECT pg_notify($1, $2)", &[&super::RUNS_CHANNEL, &run_id]).await?;
        Ok(Handled::Done)
    }

    /// The verdict the log holds for run `run_id`, if it holds one.
    async fn recorded(
        &self,
        transaction: &Transaction<'_>,
        run_id: &str,
    ) -> anyhow::Result<Option<proto::BroadcastExperimentDecided>> {
        let row = transaction
            .query_opt("SELECT payload FROM events WHERE stream_id = $1 AND stream_version = 1", &[&stream_id(run_id)])
            .await?;
        Ok(row.map(|row| proto::BroadcastExperimentDecided::decode(row.get::<_, &[u8]>(0))).transpose()?)
    }
}

impl TimerHandler for Verdicts {
    fn kind(&self) -> &'static str {
        VERDICT_TIMER
    }

    fn handle<'a>(
        &'a self,
        transaction: &'a Transaction<'a>,
        timer: &'a Timer,
    ) -> BoxFuture<'a, anyhow::Result<Handled>> {
        Box::pin(self.decide(transaction, timer))
    }
}
