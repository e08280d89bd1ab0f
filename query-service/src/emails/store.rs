//! Reads of the `emails` read model.

use std::collections::BTreeMap;

use deadpool_postgres::Client;
use platform::error::ApiError;
use platform::events::LogEvent;
use platform::proto;
use serde_json::Value;
use tokio_postgres::types::ToSql;

/// A page of a contact's emails of the space, newest first, each as its story without the
/// timeline, with the total.
pub(crate) async fn of_contact(
    client: &Client,
    m: &str,
    space_id: &str,
    contact_id: &str,
    (limit, offset): (i64, i64),
) -> Result<(i64, Vec<Value>), ApiError> {
    let count_sql = format!("SELECT total FROM {m}.contact_email_counts WHERE space_id = $1 AND contact_id = $2");
    let rows_sql = format!(
        "SELECT doc - 'timeline' FROM {m}.emails WHERE space_id = $1 AND contact_id = $2
         ORDER BY scheduled_at DESC, email_id DESC LIMIT $3 OFFSET $4"
    );
    let params: [&(dyn ToSql + Sync); 2] = [&space_id, &contact_id];
    crate::consistency::page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await
}

/// The story of an email of the space, its clicks with their links' targets.
pub(crate) async fn email(client: &Client, m: &str, space_id: &str, email_id: &str) -> Result<Option<Value>, ApiError> {
    let statement =
        client.prepare_cached(&format!("SELECT doc FROM {m}.emails WHERE space_id = $1 AND email_id = $2")).await?;
    let Some(mut story) =
        client.query_opt(&statement, &[&space_id, &email_id]).await?.map(|row| row.get::<_, Value>(0))
    else {
        return Ok(None);
    };
    let clicked = |entry: &Value| entry["type"] == "clicked";
    if story["timeline"].as_array().is_some_and(|timeline| timeline.iter().any(clicked)) {
        let targets = targets(client, email_id, story["contactId"].as_str().unwrap_or_default()).await?;
        for entry in story["timeline"].as_array_mut().into_iter().flatten().filter(|entry| clicked(entry)) {
            let url = entry["linkId"].as_str().and_then(|link_id| targets.get(link_id)).cloned();
            entry["url"] = url.map_or(Value::Null, Value::String);
        }
    }
    Ok(Some(story))
}

/// The targets of the email's clicked links by link id, opened from the log with the
/// contact's key: the read model keeps only the link ids, so no target is in the clear at
/// rest. None once the contact is erased.
async fn targets(client: &Client, email_id: &str, contact_id: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let keys = platform::crypto::load_keys(client, &[contact_id.to_owned()]).await?;
    let mut targets = BTreeMap::new();
    for stored in platform::log::read_streams(client, &[domain::email::stream_id(email_id)]).await? {
        if let LogEvent::EmailClicked(clicked) = stored.decode()?
            && let Some(link) = platform::events::open::<proto::ClickedLink>(clicked.link.as_ref(), &keys)?
        {
            targets.entry(clicked.link_id).or_insert(link.url);
        }
    }
    Ok(targets)
}
