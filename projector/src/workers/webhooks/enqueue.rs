//! Enqueue: follows the log under the lease `webhook_enqueue` and turns each (log event,
//! matching webhook) pair into one row of the `webhook_deliveries` outbox.
//!
//! In one transaction per batch it folds the webhook events themselves into
//! `webhook_endpoints` and `webhook_secrets` (so an event is matched against exactly the
//! webhooks live at its position, with the URL, filter and secret version of that moment),
//! inserts the deliveries, and advances its checkpoint. The delivery id is derived from the
//! log position and the webhook id, so a batch that runs twice inserts nothing new. A custom
//! filter is evaluated here: a delivery it rejects is never enqueued, sent or counted.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use deadpool_postgres::{Pool, Transaction};
use domain::records::RecordState;
use domain::webhooks::Trigger;
use filter::Filter;
use platform::crypto::Keys;
use platform::events::{LogEvent, open};
use platform::log::StoredEvent;
use platform::proto;
use platform::time::{format_millis, format_timestamp};
use prost::Message;
use serde_json::{Value, json};

use crate::runtime::{Lease, LeaseName, Outcome, Worker};

/// The channel notified when deliveries are enqueued.
pub(crate) const DELIVERIES_CHANNEL: &str = "webhook_deliveries";
/// Log events read per step.
const BATCH: i64 = 500;

/// A webhook as the enqueue worker matches it.
#[derive(Debug, Clone)]
struct Endpoint {
    webhook_id: String,
    trigger: String,
    schema_id: Option<String>,
    email_event_types: Vec<String>,
    url: String,
    filter: Option<Filter>,
    /// A segment condition: deliver only for contacts in this segment.
    segment_id: Option<String>,
    live: bool,
    secret_version: i32,
}

/// A delivery to insert.
struct Delivery {
    delivery_id: String,
    webhook_id: String,
    space_id: String,
    position: i64,
    kind: String,
    url: String,
    secret_version: i32,
    subject_id: Option<String>,
    body: Vec<u8>,
}

/// What an event asks of webhooks: its trigger, schema, subject (whose key seals the body)
/// and the `data` of the body.
struct Occurrence {
    trigger: Trigger,
    /// `None` for email events, which name no schema.
    schema_id: Option<String>,
    /// The email event type (`bounced`) of an `email event`.
    email_type: Option<String>,
    subject_id: Option<String>,
    data: Value,
    /// What a custom filter reads when it is not `data` itself: an event's values beside
    /// its fields, so `amount is over 100` works on an event as on a record.
    filter_view: Option<Value>,
}

impl Occurrence {
    /// The contact the occurrence is about, which a segment condition tests: the upserted
    /// contact, an event's contact, an email's recipient.
    fn contact_id(&self) -> Option<&str> {
        match self.trigger {
            Trigger::ContactUpserted | Trigger::EmailEvent => self.subject_id.as_deref(),
            Trigger::EventFired => self.filter_view.as_ref()?.get("contactId")?.as_str(),
            _ => None,
        }
    }

    /// The delivery's `type`: the trigger's (`contact.upserted`), or `email.<type>` for an
    /// email event (`email.bounced`).
    fn kind(&self) -> String {
        match &self.email_type {
            Some(email_type) => format!("email.{email_type}"),
            None => self.trigger.delivery_type().to_owned(),
        }
    }
}

pub(crate) struct Enqueue {
    pool: Pool,
    lease: LeaseName,
}

impl Enqueue {
    pub(crate) fn new(pool: Pool) -> Self {
        Self { pool, lease: LeaseName::new("webhook_enqueue") }
    }

    async fn run(&self) -> anyhow::Result<Outcome> {
        let mut client = self.pool.get().await?;
        let Some(lease) = Lease::acquire(&mut client, &self.lease).await? else {
            return Ok(Outcome::Idle);
        };
        let followed = platform::log::read_wanted(lease.transaction(), lease.checkpoint, BATCH, EVENT_TYPES).await?;
        let Some(last) = followed.last else {
            return Ok(Outcome::Idle);
        };
        let (enqueued, waiting_at) = enqueue_batch(lease.transaction(), &followed.events).await?;
        if enqueued > 0 {
            lease.transaction().execute("SELECT pg_notify($1, '')", &[&DELIVERIES_CHANNEL]).await?;
        }
        if let Some(position) = waiting_at {
            // A segment condition needs membership as of `position`, which the segments read
            // model has not reached: everything before it is done, the rest waits.
            let done = position - 1;
            lease.commit(done).await?;
            metrics::counter!("webhook_deliveries_enqueued_total").increment(enqueued);
            return Ok(Outcome::Idle);
        }
        lease.commit(last).await?;
        metrics::counter!("webhook_deliveries_enqueued_total").increment(enqueued);
        Ok(if i64::try_from(followed.read).unwrap_or(0) < BATCH { Outcome::Idle } else { Outcome::Progressed })
    }
}

/// The types this worker reads; everything else is skipped without decoding.
const EVENT_TYPES: &[&str] = &[
    "WebhookCreated.v1",
    "WebhookUpdated.v1",
    "WebhookPaused.v1",
    "WebhookSecretRotated.v1",
    "WebhookDeleted.v1",
    "WebhookDeliveryReplayRequested.v1",
    "WebhookTestRequested.v1",
    "RecordCreated.v1",
    "RecordUpdated.v1",
    "RecordDeletionRequested.v1",
    "EventAccepted.v1",
    "EventReadinessChanged.v1",
    "EmailScheduled.v1",
    "EmailSent.v1",
    "EmailFailed.v1",
    "EmailBounced.v1",
    "EmailComplained.v1",
    "EmailUnsubscribed.v1",
    "EmailOpened.v1",
    "EmailClicked.v1",
];

/// The `segments` read model as the enqueue worker reads it: its live version's schema and
/// position, loaded when a segment condition first needs it.
#[derive(Default)]
struct Membership {
    live: Option<Option<(String, i64)>>,
}

impl Membership {
    /// Whether `contact_id` is in `segment_id` as of `position` or later; `None` when the read
    /// model has not reached `position` yet.
    async fn contains(
        &mut self,
        transaction: &Transaction<'_>,
        segment_id: &str,
        contact_id: &str,
        position: i64,
    ) -> anyhow::Result<Option<bool>> {
        if self.live.is_none() {
            let row = transaction
                .query_opt("SELECT version, position FROM projections WHERE name = 'segments' AND status = 'live'", &[])
                .await?;
            self.live = Some(row.map(|row| (platform::readmodel::schema_name("segments", row.get(0)), row.get(1))));
        }
        let Some(Some((schema, reached))) = &self.live else { return Ok(None) };
        if *reached < position {
            return Ok(None);
        }
        let statement = transaction
            .prepare_cached(&format!(
                "SELECT EXISTS (SELECT 1 FROM {schema}.members WHERE segment_id = $1 AND contact_id = $2)"
            ))
            .await?;
        Ok(Some(transaction.query_one(&statement, &[&segment_id, &contact_id]).await?.get(0)))
    }
}

/// Enqueues the batch's deliveries; the count, and the position it stopped before when a
/// segment condition had to wait for the segments read model.
async fn enqueue_batch(transaction: &Transaction<'_>, events: &[StoredEvent]) -> anyhow::Result<(u64, Option<i64>)> {
    let relevant: Vec<&StoredEvent> =
        events.iter().filter(|event| EVENT_TYPES.contains(&event.event_type.as_str())).collect();
    if relevant.is_empty() {
        return Ok((0, None));
    }
    let decoded: Vec<LogEvent> = relevant.iter().map(|event| event.decode()).collect::<anyhow::Result<_>>()?;
    // The space is the payload's: events authored in the workspace file carry none in
    // their metadata.
    let spaces: Vec<String> = {
        let mut spaces: Vec<String> = decoded.iter().filter_map(space_of).map(str::to_owned).collect();
        spaces.sort();
        spaces.dedup();
        spaces
    };
    let mut endpoints = load_endpoints(transaction, &spaces).await?;
    // Personal data is opened only where a delivery can be made: in a space with a webhook
    // before the batch or one defined in it (an import into a space without webhooks opens
    // no key here).
    let hooked: HashSet<&str> = decoded
        .iter()
        .filter(|event| domain::webhooks::state::webhook_of(event).is_some())
        .filter_map(space_of)
        .chain(endpoints.keys().map(String::as_str))
        .collect();
    let subjects: Vec<String> = relevant
        .iter()
        .zip(&decoded)
        .filter(|(_, event)| space_of(event).is_some_and(|space| hooked.contains(space)))
        .filter_map(|(event, _)| event.subject_id.clone())
        .collect();
    let keys = platform::crypto::load_keys(transaction, &subjects).await?;
    let mut deliveries = Vec::new();
    let mut replayed = 0;
    let mut membership = Membership::default();
    let mut waiting_at = None;
    'events: for (event, decoded) in relevant.into_iter().zip(&decoded) {
        let Some(space_id) = space_of(decoded).map(str::to_owned) else { continue };
        match decoded {
            LogEvent::WebhookDeliveryReplayRequested(replay) => {
                replayed += requeue(transaction, replay).await?;
                continue;
            }
            LogEvent::WebhookTestRequested(test) => {
                let endpoint = endpoints.get(&space_id).and_then(|space| space.get(&test.webhook_id));
                if let Some(endpoint) = endpoint {
                    let body = json!({
                        "type": "webhook.test",
                        "timestamp": format_timestamp(event.recorded_at),
                        "data": {"webhookId": test.webhook_id, "message": "a test delivery, sent on request"},
                    });
                    deliveries.push(delivery(
                        event.position,
                        &space_id,
                        endpoint,
                        "webhook.test",
                        None,
                        serde_json::to_vec(&body)?,
                    ));
                }
                continue;
            }
            _ => {}
        }
        if fold_webhook(transaction, &mut endpoints, &space_id, event, decoded).await? {
            continue;
        }
        let Some(webhooks) = endpoints.get(&space_id) else { continue };
        if !may_be_wanted(webhooks, decoded) {
            continue;
        }
        let Some(occurrence) = occurrence(transaction, event, decoded, &keys).await? else { continue };
        let mut wanted = Vec::new();
        for endpoint in webhooks.values().filter(|endpoint| fits(endpoint, &occurrence)) {
            let Some(segment_id) = &endpoint.segment_id else {
                wanted.push(endpoint);
                continue;
            };
            let Some(contact_id) = occurrence.contact_id() else { continue };
            match membership.contains(transaction, segment_id, contact_id, event.position).await? {
                Some(true) => wanted.push(endpoint),
                Some(false) => {}
                None => {
                    waiting_at = Some(event.position);
                    break 'events;
                }
            }
        }
        for endpoint in wanted {
            let body = json!({
                "type": occurrence.kind(),
                "timestamp": format_timestamp(event.recorded_at),
                "data": occurrence.data,
            });
            let mut bytes = serde_json::to_vec(&body)?;
            let subject_id = match &occurrence.subject_id {
                Some(subject) => match keys.get(subject) {
                    Some(key) => {
                        bytes = key.encrypt(subject, &bytes)?;
                        Some(subject.clone())
                    }
                    // Erased before it could be enqueued: nothing may be sent about it.
                    None => continue,
                },
                None => None,
            };
            deliveries.push(delivery(event.position, &space_id, endpoint, &occurrence.kind(), subject_id, bytes));
        }
    }
    Ok((insert(transaction, &deliveries).await? + replayed, waiting_at))
}

/// The outbox row of the event at `position` for `endpoint`, with its URL and secret version
/// of now.
fn delivery(
    position: i64,
    space_id: &str,
    endpoint: &Endpoint,
    kind: &str,
    subject_id: Option<String>,
    body: Vec<u8>,
) -> Delivery {
    Delivery {
        delivery_id: domain::webhooks::delivery_id(position, &endpoint.webhook_id),
        webhook_id: endpoint.webhook_id.clone(),
        space_id: space_id.to_owned(),
        position,
        kind: kind.to_owned(),
        url: endpoint.url.clone(),
        secret_version: endpoint.secret_version,
        subject_id,
        body,
    }
}

/// Puts a delivery that is over back in the outbox, due now, its retry schedule restarted. A
/// replay is a new enqueue of the same delivery (id and body): it captures the webhook's URL
/// and secret version of now.
async fn requeue(transaction: &Transaction<'_>, replay: &proto::WebhookDeliveryReplayRequested) -> anyhow::Result<u64> {
    let statement = transaction
        .prepare_cached(
            "UPDATE webhook_deliveries d
             SET state = 'pending', next_attempt_at = now(), attempt_base = d.attempts, finished_at = NULL,
                 leased_until = NULL, lease_token = NULL, url = e.url, secret_version = e.secret_version
             FROM webhook_endpoints e
             WHERE d.delivery_id = $1 AND d.webhook_id = $2 AND d.state <> 'pending' AND e.webhook_id = d.webhook_id",
        )
        .await?;
    Ok(transaction.execute(&statement, &[&replay.delivery_id, &replay.webhook_id]).await?)
}

/// The space an event of interest belongs to, from its payload.
fn space_of(event: &LogEvent) -> Option<&str> {
    let space: &String = match event {
        LogEvent::WebhookCreated(e) => &e.space_id,
        LogEvent::WebhookUpdated(e) => &e.space_id,
        LogEvent::WebhookPaused(e) => &e.space_id,
        LogEvent::WebhookSecretRotated(e) => &e.space_id,
        LogEvent::WebhookDeleted(e) => &e.space_id,
        LogEvent::WebhookDeliveryReplayRequested(e) => &e.space_id,
        LogEvent::WebhookTestRequested(e) => &e.space_id,
        LogEvent::RecordCreated(e) => &e.space_id,
        LogEvent::RecordUpdated(e) => &e.space_id,
        LogEvent::RecordDeletionRequested(e) => &e.space_id,
        LogEvent::EventAccepted(e) => &e.space_id,
        LogEvent::EventReadinessChanged(e) => &e.space_id,
        LogEvent::EmailScheduled(e) => &e.space_id,
        LogEvent::EmailSent(e) => &e.space_id,
        LogEvent::EmailFailed(e) => &e.space_id,
        LogEvent::EmailBounced(e) => &e.space_id,
        LogEvent::EmailComplained(e) => &e.space_id,
        LogEvent::EmailUnsubscribed(e) => &e.space_id,
        LogEvent::EmailOpened(e) => &e.space_id,
        LogEvent::EmailClicked(e) => &e.space_id,
        _ => return None,
    };
    Some(space.as_str()).filter(|space| !space.is_empty())
}

/// The `email event` type (one of `EMAIL_EVENT_TYPES`) that `event` is, if it is one.
fn email_event_type(event: &LogEvent) -> Option<&'static str> {
    Some(match event {
        LogEvent::EmailScheduled(_) => "scheduled",
        LogEvent::EmailSent(_) => "sent",
        LogEvent::EmailFailed(_) => "failed",
        LogEvent::EmailBounced(_) => "bounced",
        LogEvent::EmailComplained(_) => "complained",
        LogEvent::EmailUnsubscribed(_) => "unsubscribed",
        LogEvent::EmailOpened(_) => "opened",
        LogEvent::EmailClicked(_) => "clicked",
        _ => return None,
    })
}

/// Whether a live webhook of the space could want `event`, judged on its trigger and an
/// email event's type alone, so the occurrence (which may read the email's template or the
/// event's acceptance, and opens sealed data) is built only when one could. Events that make
/// no occurrence pass; `fits` has the last word.
fn may_be_wanted(webhooks: &HashMap<String, Endpoint>, event: &LogEvent) -> bool {
    let email_type = email_event_type(event);
    let trigger = match event {
        LogEvent::RecordCreated(created) => upserted(&created.schema_type),
        LogEvent::RecordUpdated(updated) => upserted(&updated.schema_type),
        LogEvent::RecordDeletionRequested(requested) => deleted(&requested.schema_type),
        LogEvent::EventAccepted(_) | LogEvent::EventReadinessChanged(_) => Trigger::EventFired,
        _ if email_type.is_some() => Trigger::EmailEvent,
        _ => return true,
    };
    webhooks.values().any(|endpoint| {
        endpoint.live
            && endpoint.trigger == trigger.as_str()
            && email_type.is_none_or(|kind| endpoint.email_event_types.iter().any(|wanted| wanted == kind))
    })
}

/// The trigger of a record write of `schema_type`.
fn upserted(schema_type: &str) -> Trigger {
    if schema_type == "contact" { Trigger::ContactUpserted } else { Trigger::ObjectUpserted }
}

/// The trigger of a record deletion of `schema_type`.
fn deleted(schema_type: &str) -> Trigger {
    if schema_type == "contact" { Trigger::ContactDeleted } else { Trigger::ObjectDeleted }
}

/// Whether a live webhook wants an occurrence: its trigger and schema, and its filter over
/// the body's `data`.
fn fits(endpoint: &Endpoint, occurrence: &Occurrence) -> bool {
    endpoint.live
        && endpoint.trigger == occurrence.trigger.as_str()
        && endpoint.schema_id == occurrence.schema_id
        && occurrence.email_type.as_ref().is_none_or(|kind| endpoint.email_event_types.contains(kind))
        && endpoint
            .filter
            .as_ref()
            .is_none_or(|filter| filter::matches(filter, occurrence.filter_view.as_ref().unwrap_or(&occurrence.data)))
}

/// The endpoints of `spaces` as the last batch left them, by space and webhook id.
async fn load_endpoints(
    transaction: &Transaction<'_>,
    spaces: &[String],
) -> anyhow::Result<HashMap<String, HashMap<String, Endpoint>>> {
    let statement = transaction
        .prepare_cached(
            "SELECT space_id, webhook_id, trigger, schema_id, email_event_types, url, filter, status, secret_version,
                    segment_id
             FROM webhook_endpoints WHERE space_id = ANY($1) AND status <> 'deleted'",
        )
        .await?;
    let mut endpoints: HashMap<String, HashMap<String, Endpoint>> = HashMap::new();
    for row in transaction.query(&statement, &[&spaces]).await? {
        let filter: Option<Value> = row.get(6);
        let endpoint = Endpoint {
            webhook_id: row.get(1),
            trigger: row.get(2),
            schema_id: row.get(3),
            email_event_types: row.get(4),
            url: row.get(5),
            filter: filter.and_then(|filter| filter::from_json(&filter).ok()),
            live: row.get::<_, String>(7) == "live",
            secret_version: row.get(8),
            segment_id: row.get(9),
        };
        endpoints.entry(row.get(0)).or_default().insert(endpoint.webhook_id.clone(), endpoint);
    }
    Ok(endpoints)
}

/// The filter a condition stores, if it is a custom filter.
fn filter_of(condition: Option<&proto::WebhookCondition>) -> Option<Filter> {
    let condition = condition.filter(|condition| condition.r#type == "custom filter")?;
    let expression: Value = serde_json::from_str(&condition.expression).ok()?;
    filter::from_json(&expression).ok()
}

/// Folds a webhook event into the endpoint tables and the batch's view of them; `false` for
/// events of other kinds. The endpoint is the webhook's one fold
/// (`domain::webhooks::state`) as of the event's position; the event itself brings only the
/// secrets it carries.
async fn fold_webhook(
    transaction: &Transaction<'_>,
    endpoints: &mut HashMap<String, HashMap<String, Endpoint>>,
    space_id: &str,
    stored: &StoredEvent,
    event: &LogEvent,
) -> anyhow::Result<bool> {
    if !matches!(
        event,
        LogEvent::WebhookCreated(_)
            | LogEvent::WebhookUpdated(_)
            | LogEvent::WebhookPaused(_)
            | LogEvent::WebhookSecretRotated(_)
            | LogEvent::WebhookDeleted(_)
    ) {
        return Ok(false);
    }
    let Some(webhook_id) = domain::webhooks::state::webhook_of(event) else { return Ok(false) };
    let (_, state) = reads::webhooks::load_at(transaction, webhook_id, stored.position).await?;
    let Some(state) = state else { return Ok(true) };
    match event {
        LogEvent::WebhookCreated(created) => {
            save_secret(transaction, webhook_id, 1, created.secret.as_ref(), None).await?;
            transaction
                .execute("INSERT INTO webhook_counters (webhook_id) VALUES ($1) ON CONFLICT DO NOTHING", &[&webhook_id])
                .await?;
        }
        LogEvent::WebhookSecretRotated(rotated) => {
            let until = platform::time::from_millis(rotated.previous_valid_until_ms);
            save_secret(transaction, webhook_id, state.secret_version, rotated.secret.as_ref(), Some(until)).await?;
        }
        LogEvent::WebhookDeleted(_) => {
            transaction.execute("DELETE FROM webhook_secrets WHERE webhook_id = $1", &[&webhook_id]).await?;
        }
        _ => {}
    }
    let endpoint = Endpoint {
        webhook_id: state.webhook_id.clone(),
        trigger: state.trigger.as_str().to_owned(),
        schema_id: state.schema_id.clone(),
        email_event_types: state.email_event_types.clone(),
        url: state.url.clone(),
        filter: filter_of(Some(&state.condition)),
        segment_id: Some(state.condition.segment_id.clone())
            .filter(|id| state.condition.r#type == "segment" && !id.is_empty()),
        live: state.live && !state.deleted,
        secret_version: state.secret_version,
    };
    let status = if state.deleted { "deleted" } else { state.status() };
    save(transaction, space_id, &endpoint, status).await?;
    let space = endpoints.entry(space_id.to_owned()).or_default();
    if state.deleted {
        space.remove(webhook_id);
    } else {
        space.insert(endpoint.webhook_id.clone(), endpoint);
    }
    Ok(true)
}

async fn save(transaction: &Transaction<'_>, space_id: &str, endpoint: &Endpoint, status: &str) -> anyhow::Result<()> {
    let filter = endpoint.filter.as_ref().map(serde_json::to_value).transpose()?;
    let statement = transaction
        .prepare_cached(
            "INSERT INTO webhook_endpoints
                 (webhook_id, space_id, trigger, schema_id, email_event_types, url, filter, status, secret_version,
                  segment_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (webhook_id) DO UPDATE SET email_event_types = EXCLUDED.email_event_types,
                 url = EXCLUDED.url, filter = EXCLUDED.filter, status = EXCLUDED.status,
                 secret_version = EXCLUDED.secret_version, segment_id = EXCLUDED.segment_id",
        )
        .await?;
    transaction
        .execute(
            &statement,
            &[
                &endpoint.webhook_id,
                &space_id,
                &endpoint.trigger,
                &endpoint.schema_id,
                &endpoint.email_event_types,
                &endpoint.url,
                &filter,
                &status,
                &endpoint.secret_version,
                &endpoint.segment_id,
            ],
        )
        .await?;
    Ok(())
}

async fn save_secret(
    transaction: &Transaction<'_>,
    webhook_id: &str,
    version: i32,
    sealed: Option<&proto::Sealed>,
    previous_valid_until: Option<chrono::DateTime<chrono::Utc>>,
) -> anyhow::Result<()> {
    let Some(sealed) = sealed else { return Ok(()) };
    transaction
        .execute(
            "INSERT INTO webhook_secrets (webhook_id, version, sealed, previous_valid_until) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING",
            &[&webhook_id, &version, &sealed.encode_to_vec(), &previous_valid_until],
        )
        .await?;
    Ok(())
}

/// The occurrence a log event is for webhooks, if any (decision D8).
async fn occurrence(
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

async fn insert(transaction: &Transaction<'_>, deliveries: &[Delivery]) -> anyhow::Result<u64> {
    if deliveries.is_empty() {
        return Ok(0);
    }
    let column = |get: fn(&Delivery) -> String| deliveries.iter().map(get).collect::<Vec<String>>();
    let ids = column(|d| d.delivery_id.clone());
    let webhooks = column(|d| d.webhook_id.clone());
    let spaces = column(|d| d.space_id.clone());
    let kinds = column(|d| d.kind.clone());
    let urls = column(|d| d.url.clone());
    let positions: Vec<i64> = deliveries.iter().map(|d| d.position).collect();
    let versions: Vec<i32> = deliveries.iter().map(|d| d.secret_version).collect();
    let subjects: Vec<Option<String>> = deliveries.iter().map(|d| d.subject_id.clone()).collect();
    let bodies: Vec<&[u8]> = deliveries.iter().map(|d| d.body.as_slice()).collect();
    let statement = transaction
        .prepare_cached(
            "INSERT INTO webhook_deliveries
                 (delivery_id, webhook_id, space_id, position, type, url, secret_version, subject_id, body)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[],
                                  $7::int[], $8::text[], $9::bytea[])
             ON CONFLICT (delivery_id) DO NOTHING",
        )
        .await?;
    Ok(transaction
        .execute(&statement, &[&ids, &webhooks, &spaces, &positions, &kinds, &urls, &versions, &subjects, &bodies])
        .await?)
}

impl Worker for Enqueue {
    fn name(&self) -> String {
        "webhook_enqueue".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[platform::log::LOG_CHANNEL]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(500)
    }

    fn step(&self) -> futures_util::future::BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(self.run())
    }

    fn lag(&self) -> futures_util::future::BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(crate::runtime::lag_behind(
            &self.pool,
            "SELECT position FROM worker_checkpoints WHERE name = $1",
            "webhook_enqueue",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(filter: Option<Filter>) -> Endpoint {
        Endpoint {
            webhook_id: "wh_1".into(),
            trigger: "contact upserted".into(),
            schema_id: Some("sch_1".into()),
            email_event_types: Vec::new(),
            url: "https://example.com".into(),
            filter,
            segment_id: None,
            live: true,
            secret_version: 1,
        }
    }

    fn contact(plan: &str) -> Occurrence {
        Occurrence {
            trigger: Trigger::ContactUpserted,
            schema_id: Some("sch_1".into()),
            email_type: None,
            subject_id: None,
            data: json!({"id": "con_1", "plan": plan}),
            filter_view: None,
        }
    }

    #[test]
    fn an_email_event_delivery_is_typed_by_its_email_event_type() {
        let mut bounced = contact("pro");
        (bounced.trigger, bounced.schema_id, bounced.email_type) = (Trigger::EmailEvent, None, Some("bounced".into()));
        assert_eq!(bounced.kind(), "email.bounced");
        assert_eq!(contact("pro").kind(), "contact.upserted");
        let mut email_hook = endpoint(None);
        (email_hook.trigger, email_hook.schema_id) = ("email event".into(), None);
        email_hook.email_event_types = vec!["sent".into()];
        assert!(!fits(&email_hook, &bounced), "only the email event types the webhook asked for");
        email_hook.email_event_types.push("bounced".into());
        assert!(fits(&email_hook, &bounced));
    }

    #[test]
    fn an_event_is_looked_at_only_when_a_live_webhook_listens_for_its_trigger() {
        let sent = LogEvent::EmailSent(proto::EmailSent::default());
        let contact_created =
            LogEvent::RecordCreated(proto::RecordCreated { schema_type: "contact".into(), ..Default::default() });
        let contacts = HashMap::from([("wh_1".to_owned(), endpoint(None))]);
        assert!(may_be_wanted(&contacts, &contact_created));
        assert!(!may_be_wanted(&contacts, &sent), "no email event webhook: the email's template is not read");
        let mut email_hook = endpoint(None);
        (email_hook.trigger, email_hook.schema_id) = ("email event".into(), None);
        email_hook.email_event_types = vec!["bounced".into()];
        let mut hooks = HashMap::from([("wh_2".to_owned(), email_hook)]);
        assert!(!may_be_wanted(&hooks, &sent), "a webhook for other email event types");
        if let Some(hook) = hooks.get_mut("wh_2") {
            hook.email_event_types.push("sent".into());
        }
        assert!(may_be_wanted(&hooks, &sent));
        if let Some(hook) = hooks.get_mut("wh_2") {
            hook.live = false;
        }
        assert!(!may_be_wanted(&hooks, &sent), "a paused webhook");
        assert!(!may_be_wanted(&hooks, &contact_created));
    }

    #[test]
    fn every_email_event_is_a_type_a_webhook_can_name() {
        let events = [
            LogEvent::EmailScheduled(Default::default()),
            LogEvent::EmailSent(Default::default()),
            LogEvent::EmailFailed(Default::default()),
            LogEvent::EmailBounced(Default::default()),
            LogEvent::EmailComplained(Default::default()),
            LogEvent::EmailUnsubscribed(Default::default()),
            LogEvent::EmailOpened(Default::default()),
            LogEvent::EmailClicked(Default::default()),
        ];
        let types: Vec<_> = events.iter().filter_map(email_event_type).collect();
        assert_eq!(types, domain::webhooks::EMAIL_EVENT_TYPES, "each once, in the contract's order");
    }

    #[test]
    fn given_a_webhook_then_only_its_trigger_schema_and_filter_match() {
        assert!(fits(&endpoint(None), &contact("pro")));
        let mut paused = endpoint(None);
        paused.live = false;
        assert!(!fits(&paused, &contact("pro")), "a paused webhook enqueues nothing");
        let mut other_schema = contact("pro");
        other_schema.schema_id = Some("sch_2".into());
        assert!(!fits(&endpoint(None), &other_schema));
        let mut deleted = contact("pro");
        deleted.trigger = Trigger::ContactDeleted;
        assert!(!fits(&endpoint(None), &deleted));
        let filter = filter::parse_plain("plan is pro").expect("parses");
        assert!(fits(&endpoint(Some(filter.clone())), &contact("pro")));
        assert!(!fits(&endpoint(Some(filter)), &contact("free")), "the filter rejects: not enqueued");
    }
}
