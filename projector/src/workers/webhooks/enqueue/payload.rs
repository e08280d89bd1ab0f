//! The occurrence a log event is for webhooks: its trigger, schema and subject, and the
//! body's `data` built from the event, its sealed data opened.

use deadpool_postgres::Transaction;
use domain::records::RecordState;
use domain::webhooks::Trigger;
use platform::crypto::Keys;
use platform::events::{LogEvent, open};
use platform::log::StoredEvent;
use platform::proto;
use platform::time::format_millis;
use serde_json::{Value, json};

use super::matching::{Occurrence, deleted, email_event_type, upserted};

/// The occurrence a log event is for webhooks, if any (decision D8).
pub(super) async fn occurrence(
    transaction: &Transaction<'_>,
    stored: &StoredEvent,
    event: &LogEvent,
    keys: &Keys,
) -> anyhow::Result<Option<Occurrence>> {
    let email_type = email_event_type(event).unwrap_or_default();
    Ok(match event {
        LogEvent::RecordCreated(created) => {
            let state = RecordState::from_created(created, keys)?;
            state.personal.is_some().then(|| Occurrence {
                trigger: upserted(&created.schema_type),
                schema_id: Some(created.schema_id.clone()),
                email_type: None,
                subject_id: Some(created.record_id.clone()),
                data: state.document(),
                filter_view: None,
            })
        }
        LogEvent::RecordUpdated(updated) => {
            let state = RecordState::from_updated(updated, keys)?;
            state.personal.is_some().then(|| Occurrence {
                trigger: upserted(&updated.schema_type),
                schema_id: Some(updated.schema_id.clone()),
                email_type: None,
                subject_id: Some(updated.record_id.clone()),
                data: state.document(),
                filter_view: None,
            })
        }
        LogEvent::RecordDeletionRequested(requested) => Some(Occurrence {
            trigger: deleted(&requested.schema_type),
            schema_id: Some(requested.schema_id.clone()),
            email_type: None,
            subject_id: None,
            data: json!({"id": requested.record_id, "schemaId": requested.schema_id}),
            filter_view: None,
        }),
        LogEvent::EventAccepted(accepted) if accepted.readiness == "ready" => {
            fired(accepted, None, stored.subject_id.clone(), keys, accepted.received_at_ms)?
        }
        LogEvent::EventReadinessChanged(changed) if changed.state == "ready" => {
            let Some(accepted) = reads::business_events::accepted(transaction, &changed.id).await? else {
                return Ok(None);
            };
            fired(&accepted, Some(changed), stored.subject_id.clone(), keys, changed.changed_at_ms)?
        }
        LogEvent::EmailScheduled(scheduled) => Some(email_occurrence(
            email_type,
            (&scheduled.email_id, &scheduled.contact_id, &scheduled.template_id),
            scheduled.scheduled_at_ms,
            json!({"kind": scheduled.kind, "topicId": Some(&scheduled.topic_id).filter(|t| !t.is_empty())}),
        )),
        LogEvent::EmailSent(sent) => Some(email_occurrence(
            email_type,
            (&sent.email_id, &sent.contact_id, &template_of(transaction, &sent.email_id).await?),
            sent.sent_at_ms,
            json!({"messageId": sent.message_id}),
        )),
        LogEvent::EmailFailed(failed) => Some(email_occurrence(
            email_type,
            (&failed.email_id, &failed.contact_id, &template_of(transaction, &failed.email_id).await?),
            failed.failed_at_ms,
            json!({"error": {"code": failed.code, "message": failed.message}}),
        )),
        LogEvent::EmailBounced(bounced) => Some(email_occurrence(
            email_type,
            (&bounced.email_id, &bounced.contact_id, &template_of(transaction, &bounced.email_id).await?),
            bounced.at_ms,
            json!({
                "bounceKind": bounced.kind,
                "diagnostic": bounced.diagnostic,
                "status": Some(&bounced.status).filter(|status| !status.is_empty()),
                "source": if bounced.source.is_empty() { "relay" } else { bounced.source.as_str() },
            }),
        )),
        LogEvent::EmailComplained(complained) => Some(email_occurrence(
            email_type,
            (&complained.email_id, &complained.contact_id, &template_of(transaction, &complained.email_id).await?),
            complained.at_ms,
            json!({
                "feedbackType": complained.feedback_type,
                "reporter": Some(&complained.reporter).filter(|reporter| !reporter.is_empty()),
            }),
        )),
        LogEvent::EmailUnsubscribed(unsubscribed) => Some(email_occurrence(
            email_type,
            (
                &unsubscribed.email_id,
                &unsubscribed.contact_id,
                &template_of(transaction, &unsubscribed.email_id).await?,
            ),
            unsubscribed.at_ms,
            json!({"topicId": Some(&unsubscribed.topic_id).filter(|t| !t.is_empty())}),
        )),
        LogEvent::EmailOpened(opened) => Some(email_occurrence(
            email_type,
            (&opened.email_id, &opened.contact_id, &template_of(transaction, &opened.email_id).await?),
            opened.at_ms,
            json!({"first": opened.first, "machine": Some(&opened.machine).filter(|m| !m.is_empty())}),
        )),
        LogEvent::EmailClicked(clicked) => {
            // The link is the contact's data: once erased, there is nothing to deliver.
            let Some(link) = platform::events::open::<proto::ClickedLink>(clicked.link.as_ref(), keys)? else {
                return Ok(None);
            };
            Some(email_occurrence(
                email_type,
                (&clicked.email_id, &clicked.contact_id, &template_of(transaction, &clicked.email_id).await?),
                clicked.at_ms,
                json!({
                    "url": link.url,
                    "linkId": clicked.link_id,
                    "first": clicked.first,
                    "machine": Some(&clicked.machine).filter(|m| !m.is_empty()),
                }),
            ))
        }
        _ => None,
    })
}

/// An `email event` occurrence: `{emailId, type, templateId, contactId, occurredAt}` and the
/// type's own details. Sealed under the contact's key, like everything about its mail.
fn email_occurrence(
    kind: &str,
    (email_id, contact_id, template_id): (&str, &str, &str),
    at_ms: i64,
    details: Value,
) -> Occurrence {
    let mut data = json!({
        "emailId": email_id,
        "type": kind,
        "templateId": Some(template_id).filter(|t| !t.is_empty()),
        "contactId": contact_id,
        "occurredAt": format_millis(at_ms),
    });
    if let (Some(data), Value::Object(details)) = (data.as_object_mut(), details) {
        data.extend(details);
    }
    Occurrence {
        trigger: Trigger::EmailEvent,
        schema_id: None,
        email_type: Some(kind.to_owned()),
        subject_id: Some(contact_id.to_owned()),
        data,
        filter_view: None,
    }
}

/// The template an email was rendered from, from its stream.
async fn template_of(transaction: &Transaction<'_>, email_id: &str) -> anyhow::Result<String> {
    let statement = transaction
        .prepare_cached("SELECT payload FROM events WHERE stream_id = $1 AND event_type = 'EmailScheduled.v1'")
        .await?;
    let Some(row) = transaction.query_opt(&statement, &[&domain::email::stream_id(email_id)]).await? else {
        return Ok(String::new());
    };
    Ok(match LogEvent::decode("EmailScheduled.v1", row.get(0))? {
        LogEvent::EmailScheduled(scheduled) => scheduled.template_id,
        _ => String::new(),
    })
}

/// An `event fired` occurrence: the event as the list shows it, with its values (the
/// accepted ones and any prepared ones). `None` when its subject's data is erased.
fn fired(
    accepted: &proto::EventAccepted,
    changed: Option<&proto::EventReadinessChanged>,
    subject_id: Option<String>,
    keys: &Keys,
    ready_at_ms: i64,
) -> anyhow::Result<Option<Occurrence>> {
    let Some(data) = open::<proto::EventData>(accepted.data.as_ref(), keys)? else { return Ok(None) };
    let mut values: serde_json::Map<String, Value> = serde_json::from_str(&data.values_json).unwrap_or_default();
    if let Some(prepared) =
        changed.map(|changed| open::<proto::EventData>(changed.prepared.as_ref(), keys)).transpose()?
    {
        let Some(prepared) = prepared else { return Ok(None) };
        let prepared: serde_json::Map<String, Value> = serde_json::from_str(&prepared.values_json).unwrap_or_default();
        values.extend(prepared);
    }
    let non_empty = |text: &str| Some(text.to_owned()).filter(|text| !text.is_empty());
    let mut view = json!({
        "id": accepted.id,
        "schemaId": accepted.schema_id,
        "eventId": accepted.event_id,
        "contactId": non_empty(&accepted.contact_id),
        "objectId": non_empty(&accepted.object_id),
    });
    if let Some(view) = view.as_object_mut() {
        for (key, value) in &values {
            view.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    Ok(Some(Occurrence {
        trigger: Trigger::EventFired,
        schema_id: Some(accepted.schema_id.clone()),
        email_type: None,
        subject_id,
        data: json!({
            "id": accepted.id,
            "schemaId": accepted.schema_id,
            "eventId": accepted.event_id,
            "occurredAt": format_millis(accepted.occurred_at_ms),
            "receivedAt": format_millis(accepted.received_at_ms),
            "readyAt": format_millis(ready_at_ms),
            "readinessState": "ready",
            "definitionRevision": accepted.definition_revision.to_string(),
            "contactId": non_empty(&accepted.contact_id),
            "objectId": non_empty(&accepted.object_id),
            "data": values,
        }),
        filter_view: Some(view),
    }))
}
