//! The steps that write to the run's contact: `update_contact` (its record, at its version)
//! and `subscribe` / `unsubscribe` (its subscription to a topic).

use std::collections::BTreeMap;

use domain::workflows::{Source, Step, StepKind, at_path};
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{ExpectedVersion, NewEvent, StreamAppend};
use platform::proto;
use serde_json::Value;

use super::super::facts::{ContactFacts, Facts, Stop};
use super::super::tick::Tick;

/// Starts an `update_contact`: the values that change are written to the contact's record;
/// `true` when the step wrote (or failed).
pub(super) fn start_update(
    tick: &mut Tick,
    step: &Step,
    (set, next): (&BTreeMap<String, Source>, Option<&str>),
    input: &Value,
    facts: &Facts,
    now: i64,
) -> Result<bool, Stop> {
    let ContactFacts::Live(live) = facts.contact()? else { return Ok(false) };
    let started = tick.start(step, now);
    let mut values = live.state.values();
    let mut changed = Vec::new();
    for (key, source) in set {
        let value = match source {
            Source::Value(value) => value.clone(),
            Source::Input(path) => at_path(input, path).cloned().unwrap_or(Value::Null),
        };
        // An attribute's value is held to its type and maximum, as on every door
        // that writes a record; the step (and the run) fails naming the field.
        let value = if live.attributes.iter().any(|a| &a.key == key) {
            match domain::attributes::writable_record_value(&live.attributes, key, value) {
                Ok(value) => value,
                Err(issue) => {
                    let code = issue.code.unwrap_or(Code::InvalidAttributeValue);
                    tick.fail(&started, code.as_str(), issue.message, now);
                    return Ok(true);
                }
            }
        } else {
            value
        };
        if values.get(key) != Some(&value) {
            values.insert(key.clone(), value);
            changed.push(key.clone());
        }
    }
    if !changed.is_empty() {
        let personal = live.state.personal_with_values(values);
        let mut sealed = platform::events::seal(&live.state.record_id, &personal);
        if let Some(key) = &live.key {
            platform::events::encrypt(&mut sealed, key)?;
        }
        let updated = live.state.after_update(personal, now);
        let mut event = updated.updated_event(sealed, changed, 0);
        event.change_source = "workflow".to_owned();
        tick.row.run_id.as_str().clone_into(&mut event.change_source_id);
        tick.streams.push(StreamAppend {
            stream_id: domain::records::stream_id(&live.state.record_id),
            expected: ExpectedVersion::Exactly(live.version),
            events: vec![NewEvent {
                event: LogEvent::RecordUpdated(event),
                subject_id: Some(live.state.record_id.clone()),
                occurred_at: platform::time::from_millis(now),
            }],
        });
    }
    tick.finish(&started, "completed", None, next, now);
    Ok(true)
}

/// Starts a `subscribe` or an `unsubscribe`: the contact's subscription to the topic changes
/// unless it is so already.
pub(super) fn start_subscription(
    tick: &mut Tick,
    step: &Step,
    (topic_id, next): (&str, Option<&str>),
    facts: &Facts,
    now: i64,
) -> Result<bool, Stop> {
    let ContactFacts::Live(live) = facts.contact()? else { return Ok(false) };
    let status = if matches!(step.kind, StepKind::Subscribe { .. }) { "subscribed" } else { "unsubscribed" };
    let started = tick.start(step, now);
    if live.subscriptions.get(topic_id).map(String::as_str) != Some(status) {
        let contact_id = live.state.record_id.clone();
        tick.streams.push(StreamAppend {
            stream_id: domain::email::subscriptions_stream(&contact_id),
            expected: ExpectedVersion::Any,
            events: vec![NewEvent {
                event: LogEvent::SubscriptionChanged(proto::SubscriptionChanged {
                    space_id: tick.space(),
                    contact_id: contact_id.clone(),
                    topic_id: topic_id.to_owned(),
                    status: status.to_owned(),
                    source: "workflow".to_owned(),
                    source_id: tick.row.run_id.clone().into(),
                    at_ms: now,
                }),
                subject_id: Some(contact_id),
                occurred_at: platform::time::from_millis(now),
            }],
        });
    }
    tick.finish(&started, "completed", None, next, now);
    Ok(true)
}
