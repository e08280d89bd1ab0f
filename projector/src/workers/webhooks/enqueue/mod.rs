//! Enqueue: follows the log under the lease `webhook_enqueue` and turns each (log event,
//! matching webhook) pair into one row of the `webhook_deliveries` outbox.
//!
//! In one transaction per batch it folds the webhook events themselves into
//! `webhook_endpoints` and `webhook_secrets` (so an event is matched against exactly the
//! webhooks live at its position, with the URL, filter and secret version of that moment),
//! inserts the deliveries, and advances its checkpoint. The delivery id is derived from the
//! log position and the webhook id, so a batch that runs twice inserts nothing new. A custom
//! filter is evaluated here: a delivery it rejects is never enqueued, sent or counted.
//!
//! Here, the worker's step: the log followed, each batch's events taken in turn and the
//! deliveries written; `matching.rs`, which webhooks want an event; `endpoints.rs`, the
//! webhooks as the log leaves them; `payload.rs`, the occurrence an event is for them.

mod endpoints;
mod matching;
mod payload;

use std::collections::HashSet;
use std::time::Duration;

use deadpool_postgres::{Pool, Transaction};
use platform::events::LogEvent;
use platform::log::StoredEvent;
use platform::proto;
use platform::time::format_timestamp;
use serde_json::json;

use endpoints::{fold_webhook, load_endpoints};
use matching::{Endpoint, Membership, fits, may_be_wanted};
use payload::occurrence;

use crate::runtime::{self, Lease, LeaseName, Looked, Outcome, Worker};

/// The channel notified when deliveries are enqueued.
pub(crate) const DELIVERIES_CHANNEL: &str = "webhook_deliveries";
/// Log events read per step.
const BATCH: i64 = 500;

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
        let looked = match self.look(&client).await? {
            Looked::Done(outcome) => return Ok(outcome),
            Looked::Lease(look) => look,
        };
        let Some(lease) = Lease::acquire(&mut client, &self.lease).await? else {
            return Ok(Outcome::Idle);
        };
        let followed = runtime::followed(&lease, looked, BATCH, EVENT_TYPES).await?;
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
        // A webhook's definition, replay or test writes rows of this worker even when it
        // enqueues nothing.
        let wrote = enqueued > 0 || followed.events.iter().any(|event| event.event_type.starts_with("Webhook"));
        if wrote {
            lease.commit(last).await?
        } else {
            lease.pass_over(last).await?
        }
        metrics::counter!("webhook_deliveries_enqueued_total").increment(enqueued);
        Ok(if i64::try_from(followed.read).unwrap_or(0) < BATCH { Outcome::Idle } else { Outcome::Progressed })
    }
}

impl Enqueue {
    /// Looks at the next span without the lease ([`runtime::look`]) and passes over one that
    /// can enqueue nothing and writes nothing: no webhook event, and no event that a live
    /// webhook of its space may want by its trigger (`may_be_wanted`: most spaces have none).
    /// A space's endpoints change only by its webhook events, which this worker folds, so the
    /// endpoints read now are those at the span. A span with anything else takes the lease.
    async fn look(&self, client: &deadpool_postgres::Client) -> anyhow::Result<Looked> {
        let Some(look) = runtime::look(client, &self.lease, BATCH, EVENT_TYPES).await? else {
            return Ok(Looked::Lease(None));
        };
        if look.followed.events.iter().any(|event| event.event_type.starts_with("Webhook")) {
            return Ok(Looked::Lease(Some(look)));
        }
        let mut decoded = Vec::new();
        for event in &look.followed.events {
            // An event this worker cannot read is the lease's to dead-letter.
            let Ok(event) = event.decode() else { return Ok(Looked::Lease(Some(look))) };
            decoded.push(event);
        }
        let mut spaces: Vec<String> = decoded.iter().filter_map(space_of).map(str::to_owned).collect();
        spaces.sort();
        spaces.dedup();
        if !spaces.is_empty() {
            let endpoints = load_endpoints(client, &spaces).await?;
            let wanted = decoded.iter().any(|event| {
                space_of(event).and_then(|space| endpoints.get(space)).is_some_and(|hooks| may_be_wanted(hooks, event))
            });
            if wanted {
                return Ok(Looked::Lease(Some(look)));
            }
        }
        look.pass_over(client, &self.lease, BATCH).await
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

    fn idle_ceiling(&self) -> Duration {
        crate::runtime::FOLLOWER_IDLE_CEILING
    }

    fn spacing(&self) -> Duration {
        crate::runtime::FOLLOWER_SPACING
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
