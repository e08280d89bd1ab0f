//! The replays' worker (`workflow_replays`, under the lease of the same name): follows the log
//! for replay requests (`POST /workflows/{id}/replays`), runs each ([`super::replay`]) over
//! the log up to the request's position, and appends its report to the replay's stream.
//!
//! A replay has no effect, so a process that dies mid-way leaves nothing behind: the next
//! holder of the lease runs it again from the checkpoint, and the report's append at version 2
//! of the replay's stream is refused if a report is already there, so each replay has one.

use std::time::Duration;

use deadpool_postgres::Pool;
use futures_util::future::BoxFuture;
use platform::events::LogEvent;
use platform::log::{AppendError, AppendRequest, EventLog, ExpectedVersion, StreamAppend};
use platform::proto;
use platform::settings::Settings;

use super::replay;
use super::run::definition_at;
use crate::runtime::{Lease, LeaseName, Looked, Outcome, Worker};

const REQUESTED: &[&str] = &["WorkflowReplayRequested.v1"];
/// Log positions scanned per step at most.
const SPAN: i64 = 10_000;

pub(crate) struct Replays {
    pool: Pool,
    log: EventLog,
    settings: Settings,
    lease: LeaseName,
}

impl Replays {
    pub(crate) fn new(pool: Pool, log: EventLog, settings: &Settings) -> Self {
        Self { pool, log, settings: settings.clone(), lease: LeaseName::new("workflow_replays") }
    }

    /// Runs the next replay asked for after the checkpoint (one per step), or passes over a
    /// span of the log without one.
    async fn step(&self) -> anyhow::Result<Outcome> {
        let mut client = self.pool.get().await?;
        // Most spans hold no request: passed over without the lease.
        let looked = match crate::runtime::look(&client, &self.lease, SPAN, REQUESTED).await? {
            Some(look) if look.followed.events.is_empty() => look.pass_over(&client, &self.lease, SPAN).await?,
            look => Looked::Lease(look),
        };
        let looked = match looked {
            Looked::Done(outcome) => return Ok(outcome),
            Looked::Lease(look) => look,
        };
        let Some(lease) = Lease::acquire(&mut client, &self.lease).await? else { return Ok(Outcome::Idle) };
        let followed = crate::runtime::followed(&lease, looked, SPAN, REQUESTED).await?;
        let Some(last) = followed.last else {
            lease.rollback().await?;
            return Ok(Outcome::Idle);
        };
        let Some(stored) = followed.events.first() else {
            lease.pass_over(last).await?;
            return Ok(if followed.read as i64 >= SPAN { Outcome::Progressed } else { Outcome::Idle });
        };
        if let LogEvent::WorkflowReplayRequested(requested) = stored.decode()? {
            self.run(&requested, stored.position).await?;
        }
        lease.commit(stored.position).await?;
        Ok(Outcome::Progressed)
    }

    /// Runs one replay and appends its report (or why it could not run).
    async fn run(&self, requested: &proto::WorkflowReplayRequested, position: i64) -> anyhow::Result<()> {
        let started = std::time::Instant::now();
        let outcome = async {
            let client = self.pool.get().await?;
            let definition = definition_at(&client, &requested.workflow_id, requested.revision).await?;
            drop(client);
            let request = replay::Request {
                space_id: &requested.space_id,
                workflow_id: &requested.workflow_id,
                definition: &definition,
                from_ms: requested.from_ms,
                to_ms: requested.to_ms,
                until_position: Some(position),
            };
            let (report, _) = replay::replay(&self.pool, &self.settings, request).await?;
            anyhow::Ok(serde_json::to_string(&report)?)
        }
        .await;
        let (report_json, error) = match outcome {
            Ok(report) => (report, String::new()),
            Err(error) => {
                tracing::warn!(replay = %requested.replay_id, error = %format!("{error:#}"), "a workflow replay failed");
                (String::new(), "the replay could not run; the projector's log says why".to_owned())
            }
        };
        let now = platform::time::now_millis();
        let finished = proto::WorkflowReplayFinished {
            replay_id: requested.replay_id.clone(),
            space_id: requested.space_id.clone(),
            report_json,
            error,
            elapsed_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
            at_ms: now,
        };
        let stream = StreamAppend::one(
            domain::workflows::replay_stream_id(&requested.replay_id),
            ExpectedVersion::Exactly(1),
            LogEvent::WorkflowReplayFinished(finished),
            now,
        );
        match self.log.append(AppendRequest::in_space(&requested.space_id, vec![stream], Vec::new())).await {
            // Reported by a process that died before its checkpoint.
            Ok(_) | Err(AppendError::WrongVersion { .. }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

impl Worker for Replays {
    fn name(&self) -> String {
        "workflow_replays".to_owned()
    }

    // Requests are rare: a poll each second costs one read of the log's new span, where waking
    // on every append would cost a transaction per append under a busy log.
    fn channels(&self) -> &'static [&'static str] {
        &[]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(Replays::step(self))
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(crate::runtime::lag_behind(
            &self.pool,
            "SELECT position FROM worker_checkpoints WHERE name = $1",
            "workflow_replays",
        ))
    }
}
