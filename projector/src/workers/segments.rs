//! The `segment_windows` timer: when a `performed ... in the last` window of some segment
//! opens or closes for a contact (the `segments` read model schedules the earliest such
//! moment per contact), it appends `SegmentWindowElapsed`, and the read model evaluates the
//! contact again as of that time. Membership thereby stays a function of the log, and a
//! rebuild gives the same answer. A timer that fires twice (a process died after the append)
//! appends twice: each only evaluates again, which changes nothing the second time.

use deadpool_postgres::Transaction;
use futures_util::future::BoxFuture;
use platform::events::LogEvent;
use platform::log::{AppendRequest, EventLog, ExpectedVersion, StreamAppend};
use platform::proto;

use crate::read_models::segments::WINDOW_TIMER;
use crate::timers::{Handled, Timer, TimerHandler};

pub(crate) struct Windows {
    log: EventLog,
}

impl Windows {
    pub(crate) fn new(log: EventLog) -> Self {
        Self { log }
    }

    async fn elapse(&self, timer: &Timer) -> anyhow::Result<Handled> {
        let field = |name: &str| timer.payload.get(name).and_then(serde_json::Value::as_str).map(str::to_owned);
        let (Some(space_id), Some(contact_id)) = (field("spaceId"), field("contactId")) else {
            tracing::warn!(key = %timer.key, "a segment window timer without its contact; dropped");
            return Ok(Handled::Done);
        };
        let now = platform::time::now_millis();
        let event = LogEvent::SegmentWindowElapsed(proto::SegmentWindowElapsed {
            space_id: space_id.clone(),
            contact_id: contact_id.clone(),
            at_ms: now,
        });
        let stream = StreamAppend::one(format!("segment-clock-{contact_id}"), ExpectedVersion::Any, event, now);
        self.log.append(AppendRequest::in_space(&space_id, vec![stream], Vec::new())).await?;
        Ok(Handled::Done)
    }
}

impl TimerHandler for Windows {
    fn kind(&self) -> &'static str {
        WINDOW_TIMER
    }

    fn handle<'a>(
        &'a self,
        _transaction: &'a Transaction<'a>,
        timer: &'a Timer,
    ) -> BoxFuture<'a, anyhow::Result<Handled>> {
        Box::pin(self.elapse(timer))
    }
}
