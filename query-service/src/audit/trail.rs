//! The audit trail as a fold over log events (pure). Entries, newest first (log order):
//! - `consent_changed`: a record write changed an attribute marked as a consent field
//!   (`definition.consent.channel`), with the previous and the new value;
//! - `suppression_added` / `suppression_removed` (channel `email`): a suppression of an email
//!   address the contact has held, in its space or global. Those log rows are found by the
//!   address's keyed digest, their subject id.
//!
//! - email entries (channel `email`), from the contact's own events: `email_scheduled`,
//!   `email_sent`, `email_failed`, `email_outcome_unknown`, `email_bounced`,
//!   `email_complained`, `email_unsubscribed`, `email_opened`, `email_clicked` (with its
//!   link, `null` once the contact is erased), `subscription_changed` (a topic
//!   subscription's new status and what changed it), `form_submitted` and
//!   `subscription_confirmed`.
//! - workflow entries (channel `workflow`), from the runs bound to the contact:
//!   `workflow_run_requested`, `workflow_step_finished` (each step a journey executed for the
//!   contact, with its status) and `workflow_run_finished`.
//!
//! # Audit trail
//!
//! `GET /schemas/{schema}/records/{id}/audit-trail` is answered from the log (as are an email's
//! story, `GET /emails/{id}`, from the email's stream, and the preference page behind an
//! unsubscribe link, from the contact's subscriptions stream; every other read is a read
//! model's): the record's events through the subject index, decrypted with its key, give consent-field
//! changes (attributes whose definition has `consent: {channel}`); the addresses it has held
//! give the subjects of its suppressions' events. Entries are ordered newest first by log
//! position and paginated in memory: a contact's history is small, and the cost grows with it,
//! not with the log.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use domain::records::RecordState;
use platform::events::LogEvent;
use platform::log::StoredEvent;
use platform::time::format_timestamp;
use serde_json::{Value, json};

pub struct History {
    /// `(position, entry)`.
    pub entries: Vec<(i64, Value)>,
    /// Every email address the contact has held.
    pub emails: BTreeSet<String>,
}

/// Consent changes of one record, from its events in log order; `None` when the record is
/// not a live contact of `schema_id` in `space_id` (never written there, or deleted).
pub(crate) fn record_history(
    events: &[StoredEvent],
    keys: &platform::crypto::Keys,
    space_id: &str,
    schema_id: &str,
    consent: &BTreeMap<String, String>,
) -> anyhow::Result<Option<History>> {
    let mut history = History { entries: Vec::new(), emails: BTreeSet::new() };
    let mut previous: HashMap<&str, Value> = HashMap::new();
    let mut found = false;
    for event in events {
        let (state, changed, import, carrier) = match event.decode()? {
            LogEvent::RecordCreated(created) => {
                let carrier = carrier(&created.source, &created.source_id, created.import.as_ref());
                (RecordState::from_created(&created, keys)?, None, created.import, carrier)
            }
            LogEvent::RecordUpdated(updated) => {
                let changed = updated.changed_keys.clone();
                let carrier = carrier(&updated.change_source, &updated.change_source_id, updated.import.as_ref());
                (RecordState::from_updated(&updated, keys)?, Some(changed), updated.import, carrier)
            }
            LogEvent::RecordDeletionRequested(_)
            | LogEvent::RecordDeletionBlocked(_)
            | LogEvent::RecordDeletionCompleted(_) => return Ok(None),
            _ => continue,
        };
        if state.space_id != space_id || state.schema_id != schema_id {
            return Ok(None);
        }
        found = true;
        if let Some(email) = state.personal.as_ref().and_then(|personal| personal.email.clone()) {
            history.emails.insert(email);
        }
        let values = state.values();
        for (key, channel) in consent {
            let value = values.get(key).cloned().unwrap_or(Value::Null);
            let before = previous.get(key.as_str()).cloned().unwrap_or(Value::Null);
            let touched = changed.as_ref().is_none_or(|changed| changed.iter().any(|k| k == key));
            if touched && value != before {
                history.entries.push((
                    event.position,
                    json!({
                        "id": entry_id(event),
                        "type": "consent_changed",
                        "channel": channel,
                        "occurredAt": format_timestamp(event.occurred_at),
                        "attribute": key,
                        "previousValue": before,
                        "value": value,
                        "actorKeyId": event.actor_key_id,
                        "importSource": import.as_ref().map(import_source),
                        "source": carrier,
                    }),
                ));
            }
            previous.insert(key.as_str(), value);
        }
    }
    Ok(found.then_some(history))
}

/// What carried a consent change: `{type, id}`, the type `api`, `import`, `form`,
/// `confirmation`, `preferences`, `unsubscribe` or `workflow`, the id that of the import, the
/// form, the email or the run (null for `api`). A write recorded before the carrier was
/// (empty) was the API's, or its import's.
fn carrier(source: &str, source_id: &str, import: Option<&platform::proto::ImportProvenance>) -> Value {
    match (source, import) {
        ("" | "api", None) => json!({"type": "api", "id": null}),
        ("" | "import", Some(import)) => json!({"type": "import", "id": import.import_id}),
        (source, _) => json!({"type": source, "id": (!source_id.is_empty()).then_some(source_id)}),
    }
}

/// The import a consent change came from, with the consent source it stated: `{importId,
/// label, fileName}` (null for every other write).
fn import_source(import: &platform::proto::ImportProvenance) -> Value {
    json!({
        "importId": import.import_id,
        "label": (!import.consent_label.is_empty()).then_some(&import.consent_label),
        "fileName": (!import.file_name.is_empty()).then_some(&import.file_name),
    })
}

/// Suppression entries of the caller's space and global ones.
pub(crate) fn suppression_entries(events: &[StoredEvent], space_id: &str) -> anyhow::Result<Vec<(i64, Value)>> {
    let mut added: HashMap<String, (String, String, bool)> = HashMap::new();
    let mut entries = Vec::new();
    for event in events {
        let (suppression_id, kind, scope_space) = match event.decode()? {
            LogEvent::SuppressionAdded(suppression) => {
                let identifier = domain::suppressions::suppression_document(&suppression)?
                    .and_then(|document| document["identifier"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                let global = suppression.space_id.is_empty();
                added.insert(suppression.suppression_id.clone(), (suppression.reason.clone(), identifier, global));
                (suppression.suppression_id, "suppression_added", suppression.space_id)
            }
            LogEvent::SuppressionRemoved(removed) => (removed.suppression_id, "suppression_removed", removed.space_id),
            _ => continue,
        };
        if !scope_space.is_empty() && scope_space != space_id {
            continue;
        }
        let (reason, identifier, global) = added.get(&suppression_id).cloned().unwrap_or_default();
        entries.push((
            event.position,
            json!({
                "id": entry_id(event),
                "type": kind,
                "channel": "email",
                "occurredAt": format_timestamp(event.occurred_at),
                "suppressionId": suppression_id,
                "reason": reason,
                "identifier": identifier,
                "scope": if global { "global" } else { "space" },
                "actorKeyId": event.actor_key_id,
            }),
        ));
    }
    Ok(entries)
}

/// The email entries among a contact's events (its subject's events, in log order).
/// A click's link is opened with the contact's key (`keys`): `null` once erased.
pub(crate) fn email_entries(
    events: &[StoredEvent],
    keys: &platform::crypto::Keys,
    space_id: &str,
) -> anyhow::Result<Vec<(i64, Value)>> {
    let mut entries = Vec::new();
    for event in events {
        let (kind, space, details) = match event.decode()? {
            LogEvent::EmailScheduled(e) => (
                "email_scheduled",
                e.space_id,
                json!({"emailId": e.email_id, "templateId": e.template_id, "kind": e.kind,
                       "topicId": non_empty(e.topic_id), "origin": e.origin}),
            ),
            LogEvent::EmailSent(e) => {
                ("email_sent", e.space_id, json!({"emailId": e.email_id, "messageId": e.message_id}))
            }
            LogEvent::EmailFailed(e) => (
                "email_failed",
                e.space_id,
                json!({"emailId": e.email_id, "error": {"code": e.code, "message": e.message}}),
            ),
            LogEvent::EmailOutcomeUnknown(e) => ("email_outcome_unknown", e.space_id, json!({"emailId": e.email_id})),
            LogEvent::EmailBounced(e) => (
                "email_bounced",
                e.space_id,
                json!({"emailId": e.email_id, "bounceKind": e.kind,
                       "status": non_empty(e.status),
                       "source": if e.source.is_empty() { "relay".to_owned() } else { e.source }}),
            ),
            LogEvent::EmailComplained(e) => {
                ("email_complained", e.space_id, json!({"emailId": e.email_id, "feedbackType": e.feedback_type}))
            }
            LogEvent::EmailUnsubscribed(e) => {
                ("email_unsubscribed", e.space_id, json!({"emailId": e.email_id, "topicId": non_empty(e.topic_id)}))
            }
            LogEvent::EmailOpened(e) => (
                "email_opened",
                e.space_id,
                json!({"emailId": e.email_id, "first": e.first, "machine": non_empty(e.machine)}),
            ),
            LogEvent::EmailClicked(e) => {
                let link = platform::events::open::<platform::proto::ClickedLink>(e.link.as_ref(), keys)?;
                (
                    "email_clicked",
                    e.space_id,
                    json!({"emailId": e.email_id, "url": link.map(|link| link.url), "linkId": e.link_id,
                           "first": e.first, "machine": non_empty(e.machine)}),
                )
            }
            LogEvent::SubscriptionChanged(e) => (
                "subscription_changed",
                e.space_id,
                json!({"topicId": e.topic_id, "status": e.status, "source": e.source, "sourceId": e.source_id}),
            ),
            LogEvent::FormSubmitted(e) => {
                ("form_submitted", e.space_id, json!({"formId": e.form_id, "pendingConfirmation": e.pending}))
            }
            LogEvent::SubmissionConfirmed(e) => ("subscription_confirmed", e.space_id, json!({"formId": e.form_id})),
            _ => continue,
        };
        if space == space_id {
            entries.push((event.position, entry(event, kind, "email", details)));
        }
    }
    Ok(entries)
}

/// The ingest entries among a contact's events (channel `ingest`): each message of the
/// Segment-compatible ingest whose traits or properties no attribute held, with what it kept
/// (opened with the contact's key: `null` once erased).
pub(crate) fn ingest_entries(
    events: &[StoredEvent],
    keys: &platform::crypto::Keys,
    space_id: &str,
) -> anyhow::Result<Vec<(i64, Value)>> {
    let mut entries = Vec::new();
    for event in events {
        let LogEvent::IngestMessageKept(kept) = event.decode()? else { continue };
        if kept.space_id != space_id {
            continue;
        }
        let data = platform::events::open::<platform::proto::IngestKeptData>(kept.data.as_ref(), keys)?;
        let kept_values = data.and_then(|data| serde_json::from_str::<Value>(&data.json).ok());
        let details = json!({"writeKeyId": kept.write_key_id, "messageId": kept.message_id,
                             "messageType": kept.message_type, "kept": kept_values});
        entries.push((event.position, entry(event, "ingest_message", "ingest", details)));
    }
    Ok(entries)
}

/// The workflow entries among a contact's events: the runs bound to it and their steps.
pub(crate) fn workflow_entries(events: &[StoredEvent], space_id: &str) -> anyhow::Result<Vec<(i64, Value)>> {
    let mut entries = Vec::new();
    for event in events {
        // A transition that changed the run several times is one log event: an entry per
        // change, the first named by the event and each later one by the event and its place,
        // pushed latest first so that the trail's newest-first order (a stable sort by
        // position) shows them as it shows separate events.
        let changes = domain::workflows::changes(event.decode()?);
        for (place, change) in changes.into_iter().enumerate().rev() {
            if let Some((kind, details)) = workflow_entry(change, space_id) {
                let mut entry = entry(event, kind, "workflow", details);
                if place > 0 {
                    entry["id"] = Value::String(format!("{}_{place}", entry_id(event)));
                }
                entries.push((event.position, entry));
            }
        }
    }
    Ok(entries)
}

/// The kind and details of a workflow entry for `event`, when it is one of `space_id`'s.
fn workflow_entry(event: LogEvent, space_id: &str) -> Option<(&'static str, Value)> {
    {
        let (kind, space, details) = match event {
            LogEvent::WorkflowRunRequested(e) => (
                "workflow_run_requested",
                e.space_id,
                json!({"workflowId": e.workflow_id, "runId": e.run_id, "trigger": {"type": e.trigger, "id": e.trigger_id}}),
            ),
            LogEvent::WorkflowStepFinished(e) => (
                "workflow_step_finished",
                e.space_id,
                json!({"runId": e.run_id, "index": e.index, "stepId": e.step_id, "stepType": e.step_type,
                "status": e.status, "emailId": non_empty(e.email_id),
                "error": (!e.error_code.is_empty()).then(|| {
                    let mut error = json!({"code": e.error_code, "message": e.error_message});
                    if !e.gate.is_empty() {
                        error["gate"] = Value::String(e.gate.clone());
                    }
                    error
                })}),
            ),
            LogEvent::WorkflowRunFinished(e) => (
                "workflow_run_finished",
                e.space_id,
                json!({"runId": e.run_id, "status": e.status,
                       "error": (!e.error_code.is_empty()).then(|| json!({"code": e.error_code, "message": e.error_message}))}),
            ),
            _ => return None,
        };
        (space == space_id).then_some((kind, details))
    }
}

/// An entry of `kind` on `channel` about `event`, with `details` beside the common fields.
fn entry(event: &StoredEvent, kind: &str, channel: &str, details: Value) -> Value {
    let mut entry = json!({
        "id": entry_id(event),
        "type": kind,
        "channel": channel,
        "occurredAt": format_timestamp(event.occurred_at),
        "actorKeyId": event.actor_key_id,
    });
    if let (Some(entry), Value::Object(details)) = (entry.as_object_mut(), details) {
        entry.extend(details);
    }
    entry
}

/// An entry's id: `aud_` and the log event's UUID, so it carries a type prefix like every
/// other identifier (decision D2) and names the one log event the entry was built from.
fn entry_id(event: &StoredEvent) -> String {
    format!("aud_{}", event.event_id.simple())
}

fn non_empty(text: String) -> Option<String> {
    Some(text).filter(|text| !text.is_empty())
}
