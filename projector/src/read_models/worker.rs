//! A read model on the worker runtime: each step projects the next batch of every version of
//! it that is live or being built (each version's checkpoint row is its lease).

use std::time::Duration;

use deadpool_postgres::Pool;
use futures_util::future::BoxFuture;
use platform::log::LOG_CHANNEL;

use super::ReadModel;
use super::runner::{Faults, project_versions};
use crate::runtime::{Outcome, Worker};

/// How long an idle read model waits for a notification before looking at the log again.
const POLL: Duration = Duration::from_millis(250);

pub(crate) struct ReadModelWorker {
    pool: Pool,
    model: &'static dyn ReadModel,
    /// This process, as recorded in the batch history.
    process: String,
    faults: Faults,
}

impl ReadModelWorker {
    pub(crate) fn new(pool: Pool, model: &'static dyn ReadModel, process: String, faults: Faults) -> Self {
        Self { pool, model, process, faults }
    }

    /// One batch of every version this process can lease. `Idle` unless a batch was full:
    /// a notification that arrives meanwhile wakes the worker again at once.
    async fn project(&self) -> anyhow::Result<Outcome> {
        let more = project_versions(&self.pool, self.model, &self.process, &self.faults).await?;
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
