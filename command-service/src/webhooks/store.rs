//! What webhook decisions load, and the guards their appends carry.

use deadpool_postgres::GenericClient;
use domain::catalog::SchemaEntry;
pub use domain::webhooks::state::{Counters, WebhookState, secret_subject, stream_id};
use platform::crypto::DataKey;
use platform::error::Code;
use platform::log::{AppendError, Guard};
pub use reads::webhooks::load;

/// The schema `reference` (id or slug) of the space, from catalog version schema `catalog`.
pub async fn schema(
    client: &impl GenericClient,
    catalog: &str,
    space_id: &str,
    reference: &str,
) -> Result<Option<SchemaEntry>, tokio_postgres::Error> {
    reads::catalog::find_schema(client, catalog, space_id, reference).await
}

/// The data key of a webhook's secrets, if it still has one.
pub(crate) async fn secret_key(client: &impl GenericClient, webhook_id: &str) -> anyhow::Result<Option<DataKey>> {
    let subject = secret_subject(webhook_id);
    let keys = platform::crypto::load_keys(client, std::slice::from_ref(&subject)).await?;
    Ok(keys.get(&subject).cloned())
}

/// Stores the data key of a new webhook's secrets with its creation.
pub(crate) fn store_secret_key(webhook_id: &str, space_id: &str, wrapped: Vec<u8>) -> Guard {
    Guard::exactly_one(
        "INSERT INTO subject_keys (subject_id, space_id, wrapped_key) VALUES ($1, $2, $3)
         ON CONFLICT (subject_id) DO NOTHING",
        vec![Box::new(secret_subject(webhook_id)), Box::new(space_id.to_owned()), Box::new(wrapped)],
        AppendError::Conflict {
            code: Code::IdempotencyConflict,
            message: "the webhook id is already taken".to_owned(),
        },
    )
}

/// Shreds a deleted webhook's secrets (and the ones queued deliveries captured) with the
/// deletion.
pub(crate) fn shred_secret_key(webhook_id: &str) -> Guard {
    Guard::unique(
        "DELETE FROM subject_keys WHERE subject_id = $1",
        vec![Box::new(secret_subject(webhook_id))],
        AppendError::Failed("could not shred the webhook's key".to_owned()),
    )
}

/// Removes the secret from the create and rotate answers recorded for idempotent replay,
/// with the webhook's deletion: a replay after it answers without the secret.
pub(crate) fn blank_recorded_secrets(webhook_id: &str) -> Guard {
    Guard::unique(
        "UPDATE idempotency_records SET response = jsonb_set(response, '{data}',
                (response -> 'data') - 'signatureVerificationSecret')
         WHERE response -> 'data' ->> 'id' = $1::text AND response -> 'data' ? 'signatureVerificationSecret'",
        vec![Box::new(webhook_id.to_owned())],
        AppendError::Failed("could not blank the webhook's recorded secrets".to_owned()),
    )
}

/// Clears the consecutive-failure count (the circuit breaker's) when the owner sets the
/// webhook live, in the transaction of that change.
pub(crate) fn clear_failures(webhook_id: &str) -> Guard {
    Guard::unique(
        "UPDATE webhook_counters SET failed_calls_in_a_row = 0, failing_since = NULL WHERE webhook_id = $1",
        vec![Box::new(webhook_id.to_owned())],
        AppendError::Failed("could not clear the webhook's failure count".to_owned()),
    )
}

/// The delivery counters of a webhook (zero before its first attempt).
pub async fn counters(client: &impl GenericClient, webhook_id: &str) -> Result<Counters, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!("SELECT {} FROM webhook_counters WHERE webhook_id = $1", Counters::COLUMNS))
        .await?;
    Ok(client
        .query_opt(&statement, &[&webhook_id])
        .await?
        .map(|row| reads::webhooks::counters(&row, 0))
        .unwrap_or_default())
}

/// The state of one delivery of the webhook (`pending`, `delivered`, `failed`, `dropped`).
pub(crate) async fn delivery_state(
    client: &impl GenericClient,
    webhook_id: &str,
    delivery_id: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached("SELECT state FROM webhook_deliveries WHERE delivery_id = $1 AND webhook_id = $2")
        .await?;
    Ok(client.query_opt(&statement, &[&delivery_id, &webhook_id]).await?.map(|row| row.get(0)))
}
