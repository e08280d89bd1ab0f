//! The `segment_windows` timer: when a `performed ... in the last` window of some segment
//! opens or closes for a contact (the `segments` read model schedules the earliest such
//! moment per contact), it appends `SegmentWindowElapsed`, and the read model evaluates the
//! contact again as of that time. Membership thereby stays a function of the log, and a
//! rebuild gives the same answer. A timer that fires twice (a process died after the append)
//! appends twice: each only evaluates again, which changes nothing the second time.
//!
//! # Segments
//!
//! A segment is a name, the caller's definition and the filter the AI provider made of it once
//! (`command-service/src/segments/`): `POST /segments` reads the space's vocabulary (contact
//! attributes and consent attributes, event schemas, topics) and credits from the catalog in one
//! statement, asks the provider, resolves the filter's names (`decide.rs`: event and topic slugs
//! to ids, `consent.email` to the contact schemas' consent attributes; an unknown field, event or
//! topic is a failed generation, 422) and appends `SegmentCreated` with the resolved filter and
//! the credit it spent. The filter stays in the log; the API shows its `description`.
//!
//! **The filter language** (`shared/filter/src/lib.rs`) has, beside conditions on fields, facts
//! about a contact: `performed <event> [at least N times] [in the last N <unit>]`,
//! `subscribed to <topic>` (the field `subscriptions.<topic>`), `has email consent`. Evaluation
//! takes `Facts`: the document, the event times by schema and the time of the evaluation;
//! `next_change_ms` says when the answer can next change by time alone (an occurrence leaving
//! or entering a window). Engagement facts (`shared/filter/src/engaged.rs`): `opened` and
//! `clicked` (a link containing a text), of any email or of one a broadcast, a template or a
//! workflow (step) sent, in a window, a person's only unless `including machines`; `Facts`
//! carries the contact's opens and clicks for them. Each `EmailOpened` and `EmailClicked` carries
//! what sent its email (`EmailSource`, copied from `EmailScheduled` by the tracking endpoint), so
//! a consumer reads one event alone.
//!
//! **Membership** is the `segments` read model (`projector/src/read_models/segments.rs`). It
//! keeps its own copy of what filters read (each contact's record document and subscriptions,
//! the times of its ready events, and its opens and clicks: a click's target kept sealed as in
//! the log and opened, with the contact's key, only to evaluate `clicked a link containing`)
//! and re-evaluates only what a log event touches: a record, subscription, event, open or click
//! re-evaluates that contact against its space's segments; a new segment is evaluated once
//! against the space's contacts, a page at a time; a deletion removes the contact everywhere.
//! Each evaluation is as of the log event's recording time, so a rebuild gives the same
//! membership. When some window will open or close for a contact, the model schedules the
//! `segment_windows` timer (one per contact, the earliest moment wins); the timer appends
//! `SegmentWindowElapsed`, and the model evaluates the contact again as of that time. Time
//! passing is thus in the log. A timer that fires twice, or one a rebuilding version schedules
//! for a moment already past, only evaluates again. Each join is also kept as an entry
//! (segment, position, contact), what segment triggers of workflows follow (see Workflows);
//! entries go with their segment or contact.
//!
//! **Segment conditions on webhooks.** The enqueue worker reads membership from the live
//! version of `segments`: an occurrence at position P is matched only once that version has
//! reached P (otherwise the step commits up to P − 1 and waits), for the contact the
//! occurrence is about (the upserted contact, the event's contact, the email's recipient).

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
