//! `GET /schemas/{schema}/records/{id}/audit-trail`: a contact's consent and communication
//! history, read straight from the event log (through the index on the subject), not from a
//! projection.
//!
//! Entries, newest first (log order):
//! - `consent_changed`: a record write changed an attribute marked as a consent field
//!   (`definition.consent.channel`), with the previous and the new value;
//! - `suppression_added` / `suppression_removed` (channel `email`): a suppression of an email
//!   address the contact has held, in its space or global. Those log rows are found by the
//!   address's keyed digest, their subject id.
//!
//! Sends and unsubscribes join as the email pipeline arrives.

use shared::error::Code;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};
use shared::catalog::{self, CATALOG};
use shared::error::ApiError;
use shared::events::LogEvent;
use shared::http::{page_body, query_pairs};
use shared::log::{EVENT_COLUMNS, StoredEvent};
use shared::pagination::PageRequest;
use shared::records::{CHANNELS, RecordState};
use shared::time::format_timestamp;

use super::schemas::schema_not_found;
use super::{authorize_read, consistent_read, respond};
use crate::State;

pub async fn get(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let query = query_pairs(&req);
    let page = PageRequest::parse(&query)?;
    let channel = match shared::http::query_value(&query, "channel") {
        Some(channel) if CHANNELS.contains(&channel) => Some(channel.to_owned()),
        Some(other) => {
            return Err(ApiError::bad_request(
                Code::InvalidQueryParameter,
                format!("channel must be one of {}; got {other:?}", CHANNELS.join(", ")),
            ));
        }
        None => None,
    };
    let (schema_ref, record_id) = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (context, consistent) = consistent_read(&state, &caller, token, &[CATALOG], |client, models| {
        let c = models.schema(CATALOG);
        let (space_id, schema_ref) = (space_id.clone(), schema_ref.clone());
        Box::pin(async move { Ok(catalog::write_context(client, &c, &space_id, &schema_ref).await?) })
    })
    .await?;
    let (schema, attributes, _) = context.ok_or_else(|| schema_not_found(&schema_ref))?;
    if schema.schema_type != "contact" {
        return Err(ApiError::not_found(
            Code::SchemaNotFound,
            format!("{schema_ref:?} is not a contact schema; audit trails exist for contacts only"),
        ));
    }
    let consent: BTreeMap<String, String> = attributes
        .iter()
        .filter_map(|attribute| {
            let channel = attribute.definition.get("consent")?.get("channel")?.as_str()?;
            Some((attribute.key.clone(), channel.to_owned()))
        })
        .collect();

    let client = state.pool.get().await?;
    let statement = client
        .prepare_cached(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE subject_id = $1 ORDER BY position"))
        .await?;
    let rows = client.query(&statement, &[&record_id]).await?;
    let record_events: Vec<StoredEvent> = rows.iter().map(StoredEvent::from_row).collect();
    let keys = shared::crypto::load_keys(&client, std::slice::from_ref(&record_id)).await?;
    let history = record_history(&record_events, &keys, &space_id, &schema.schema_id, &consent)?
        .ok_or_else(|| ApiError::not_found(Code::RecordNotFound, format!("no record {record_id:?} in this schema")))?;

    let subjects = history
        .emails
        .iter()
        .map(|email| shared::crypto::email_subject(email))
        .collect::<anyhow::Result<Vec<String>>>()?;
    let statement = client
        .prepare_cached(&format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE subject_id = ANY($1)
               AND event_type IN ('SuppressionAdded.v1', 'SuppressionRemoved.v1') ORDER BY position"
        ))
        .await?;
    let rows = client.query(&statement, &[&subjects]).await?;
    drop(client);
    let suppression_events: Vec<StoredEvent> = rows.iter().map(StoredEvent::from_row).collect();
    let mut entries = history.entries;
    entries.extend(suppression_entries(&suppression_events, &space_id)?);
    // Newest first: log order, reversed.
    entries.sort_by_key(|entry| std::cmp::Reverse(entry.0));
    let filtered: Vec<Value> = entries
        .into_iter()
        .map(|(_, entry)| entry)
        .filter(|entry| channel.as_deref().is_none_or(|channel| entry["channel"] == channel))
        .collect();
    let total = i64::try_from(filtered.len()).unwrap_or(i64::MAX);
    let items: Vec<Value> = filtered
        .into_iter()
        .skip(usize::try_from(page.offset()).unwrap_or(0))
        .take(usize::try_from(page.limit()).unwrap_or(0))
        .collect();
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

struct History {
    /// `(position, entry)`.
    entries: Vec<(i64, Value)>,
    /// Every email address the contact has held.
    emails: BTreeSet<String>,
}

/// Consent changes of one record, from its events in log order; `None` when the record is
/// not a live contact of `schema_id` in `space_id` (never written there, or deleted).
fn record_history(
    events: &[StoredEvent],
    keys: &shared::crypto::Keys,
    space_id: &str,
    schema_id: &str,
    consent: &BTreeMap<String, String>,
) -> anyhow::Result<Option<History>> {
    let mut history = History { entries: Vec::new(), emails: BTreeSet::new() };
    let mut previous: HashMap<&str, Value> = HashMap::new();
    let mut found = false;
    for event in events {
        let (state, changed): (RecordState, Option<Vec<String>>) = match event.decode()? {
            LogEvent::RecordCreated(created) => (RecordState::from_created(&created, keys)?, None),
            LogEvent::RecordUpdated(updated) => {
                let changed = updated.changed_keys.clone();
                (RecordState::from_updated(&updated, keys)?, Some(changed))
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
                        "id": event.event_id.to_string(),
                        "type": "consent_changed",
                        "channel": channel,
                        "occurredAt": format_timestamp(event.occurred_at),
                        "attribute": key,
                        "previousValue": before,
                        "value": value,
                        "actorKeyId": event.actor_key_id,
                    }),
                ));
            }
            previous.insert(key.as_str(), value);
        }
    }
    Ok(found.then_some(history))
}

/// Suppression entries of the caller's space and global ones.
fn suppression_entries(events: &[StoredEvent], space_id: &str) -> anyhow::Result<Vec<(i64, Value)>> {
    let mut added: HashMap<String, (String, String, bool)> = HashMap::new();
    let mut entries = Vec::new();
    for event in events {
        let (suppression_id, kind, scope_space) = match event.decode()? {
            LogEvent::SuppressionAdded(suppression) => {
                let identifier = shared::suppressions::suppression_document(&suppression)?
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
                "id": event.event_id.to_string(),
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
