//! A read model on the worker runtime: each step projects the next batch of every version of
//! it that is live or being built (each version's checkpoint row is its lease).

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use futures_util::future::BoxFuture;
use platform::log::LOG_CHANNEL;

use super::ReadModel;
use super::runner::{Faults, IdlePasses, project_versions};
use crate::runtime::{Outcome, Worker};

/// How long an idle read model waits for a notification before looking at the log again.
const POLL: Duration = Duration::from_millis(250);

pub(crate) struct ReadModelWorker {
    pool: Pool,
    model: &'static dyn ReadModel,
    /// This process, as recorded in the batch history.
    process: String,
    faults: Faults,
    /// The pass over idle spans this process's read models share.
    idle: Arc<IdlePasses>,
}

impl ReadModelWorker {
    pub(crate) fn new(
        pool: Pool,
        model: &'static dyn ReadModel,
        process: String,
        faults: Faults,
        idle: Arc<IdlePasses>,
    ) -> Self {
        Self { pool, model, process, faults, idle }
    }

    /// One batch of every version this process can lease, unless the process's pass over
    /// idle spans passed over them all. `Idle` unless a batch was full: a notification that
    /// arrives meanwhile wakes the worker again at once.
    async fn project(&self) -> anyhow::Result<Outcome> {
        // A crash injected mid-batch needs a batch to crash in, even one without events.
        let idle = if self.faults.crash_after_events.is_none() {
            self.idle.outcome(&self.pool, self.model).await?
        } else {
            None
        };
        let more = project_versions(&self.pool, self.model, idle, &self.process, &self.faults).await?;
        Ok(if more { Outcome::Progressed } else { Outcome::Idle })
    }
}

impl Worker for ReadModelWorker {
    fn name(&self) -> String {
        format!("read_model:{}", self.model.name())
    }

    fn channels(&self) -> &'static [&'static str] {
        &[LOG_CHANNEL]
    }

    fn poll_interval(&self) -> Duration {
        POLL
    }

    fn idle_ceiling(&self) -> Duration {
        crate::runtime::FOLLOWER_IDLE_CEILING
    }

    fn lane(&self) -> Option<&'static str> {
        Some("read_models")
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(self.project())
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(crate::runtime::lag_behind(
            &self.pool,
            "SELECT position FROM projections WHERE name = $1 AND status = 'live'",
            self.model.name(),
        ))
    }
}
