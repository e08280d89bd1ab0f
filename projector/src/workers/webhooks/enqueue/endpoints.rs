//! The webhooks as the log leaves them: the endpoints of a batch's spaces loaded, and the
//! webhook events folded into `webhook_endpoints` and `webhook_secrets`.

use std::collections::HashMap;

use deadpool_postgres::{GenericClient, Transaction};
use platform::events::LogEvent;
use platform::log::StoredEvent;
use platform::proto;
use prost::Message;
use serde_json::Value;

use super::matching::{Endpoint, filter_of};

/// The endpoints of `spaces` as the last batch left them, by space and webhook id.
pub(super) async fn load_endpoints(
    transaction: &impl GenericClient,
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

/// Folds a webhook event into the endpoint tables and the batch's view of them; `false` for
/// events of other kinds. The endpoint is the webhook's one fold
/// (`domain::webhooks::state`) as of the event's position; the event itself brings only the
/// secrets it carries.
pub(super) async fn fold_webhook(
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
