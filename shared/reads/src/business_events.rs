//! A business event's acceptance, from its stream.

use deadpool_postgres::GenericClient;
use domain::business_events::stream_id;
use platform::events::LogEvent;
use platform::proto;

/// The acceptance of event `id`, from its stream.
pub async fn accepted(client: &impl GenericClient, id: &str) -> anyhow::Result<Option<proto::EventAccepted>> {
    let statement = client
        .prepare_cached(
            "SELECT event_type, payload FROM events WHERE stream_id = $1 AND event_type = 'EventAccepted.v1'",
        )
        .await?;
    let Some(row) = client.query_opt(&statement, &[&stream_id(id)]).await? else { return Ok(None) };
    Ok(match LogEvent::decode(row.get(0), row.get(1))? {
        LogEvent::EventAccepted(accepted) => Some(accepted),
        _ => None,
    })
}
