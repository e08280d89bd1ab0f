//! The subscription changes email actions and record writes append, and what carried them.

use platform::events::LogEvent;
use platform::log::{ExpectedVersion, NewEvent, StreamAppend};
use platform::proto;

/// What carried a consent or subscription change: `form`, `confirmation`, `preferences` or
/// `unsubscribe`, and the form or email that did.
#[derive(Clone, Copy)]
pub(crate) struct Source<'a> {
    pub kind: &'a str,
    pub id: &'a str,
}

/// The contact's subscriptions stream with `status` for each of `topic_ids`; `None` when
/// there are none.
pub(crate) fn subscription_changes(
    (space_id, contact_id): (&str, &str),
    topic_ids: &[&String],
    status: &str,
    source: Source<'_>,
    now: i64,
) -> Option<StreamAppend> {
    if topic_ids.is_empty() {
        return None;
    }
    let events = topic_ids
        .iter()
        .map(|topic_id| NewEvent {
            event: LogEvent::SubscriptionChanged(proto::SubscriptionChanged {
                space_id: space_id.to_owned(),
                contact_id: contact_id.to_owned(),
                topic_id: (*topic_id).clone(),
                status: status.to_owned(),
                source: source.kind.to_owned(),
                source_id: source.id.to_owned(),
                at_ms: now,
            }),
            subject_id: Some(contact_id.to_owned()),
            occurred_at: platform::time::from_millis(now),
        })
        .collect();
    Some(StreamAppend {
        stream_id: domain::email::subscriptions_stream(contact_id),
        expected: ExpectedVersion::Any,
        events,
    })
}
