//! Reads of the `emails` read model.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::Client;
use platform::error::ApiError;
use platform::events::LogEvent;
use platform::proto;
use serde_json::Value;
use tokio_postgres::types::ToSql;

use super::log::Request;

/// A page of the delivery log: the space's emails of `request`'s filters and statuses, newest
/// first (`scheduledAt`, then id, descending), after `after` when given, each as
/// [`super::log::row`] with its time and id. One statement, on a filter's index.
pub(crate) async fn log_page(
    client: &impl deadpool_postgres::GenericClient,
    m: &str,
    space_id: &str,
    request: &Request,
    after: Option<&(DateTime<Utc>, String)>,
    (limit, offset): (i64, i64),
) -> Result<Vec<(Value, DateTime<Utc>, String)>, ApiError> {
    let mut params: Vec<Box<dyn ToSql + Sync + Send>> = vec![Box::new(space_id.to_owned())];
    let next = |value: Box<dyn ToSql + Sync + Send>, params: &mut Vec<Box<dyn ToSql + Sync + Send>>| {
        params.push(value);
        params.len()
    };
    let mut sql = format!("SELECT doc, address, scheduled_at, email_id FROM {m}.emails WHERE space_id = $1");
    let filters = [
        ("contact_id", &request.scope.contact_id),
        ("broadcast_run_id", &request.scope.broadcast_run_id),
        ("workflow_id", &request.scope.workflow_id),
        ("step_id", &request.scope.step_id),
    ];
    for (column, value) in filters {
        if let Some(value) = value {
            sql.push_str(&format!(" AND {column} = ${}", next(Box::new(value.clone()), &mut params)));
        }
    }
    if !request.statuses.is_empty() {
        let statuses: Vec<String> = request.email_statuses().into_iter().map(str::to_owned).collect();
        let (opened, clicked, unsubscribed) = request.engaged();
        sql.push_str(&format!(
            " AND (status = ANY(${}) OR (${} AND opened) OR (${} AND clicked) OR (${} AND unsubscribed))",
            next(Box::new(statuses), &mut params),
            next(Box::new(opened), &mut params),
            next(Box::new(clicked), &mut params),
            next(Box::new(unsubscribed), &mut params)
        ));
    }
    if let Some((at, id)) = after {
        sql.push_str(&format!(
            " AND (scheduled_at, email_id) < (${}, ${})",
            next(Box::new(*at), &mut params),
            next(Box::new(id.clone()), &mut params)
        ));
    }
    sql.push_str(&format!(
        " ORDER BY scheduled_at DESC, email_id DESC LIMIT ${} OFFSET ${}",
        next(Box::new(limit), &mut params),
        next(Box::new(offset), &mut params)
    ));
    let statement = client.prepare_cached(&sql).await?;
    let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|param| param.as_ref() as &(dyn ToSql + Sync)).collect();
    Ok(client
        .query(&statement, &refs)
        .await?
        .into_iter()
        .map(|row| (super::log::row(row.get(0), row.get(1)), row.get(2), row.get(3)))
        .collect())
}

/// The number of a contact's emails, as kept beside them.
pub(crate) async fn contact_total(
    client: &impl deadpool_postgres::GenericClient,
    m: &str,
    space_id: &str,
    contact_id: &str,
) -> Result<i64, ApiError> {
    let statement = client
        .prepare_cached(&format!("SELECT total FROM {m}.contact_email_counts WHERE space_id = $1 AND contact_id = $2"))
        .await?;
    Ok(client.query_opt(&statement, &[&space_id, &contact_id]).await?.map_or(0, |row| row.get(0)))
}

/// The story of an email of the space, its clicks with their links' targets.
pub(crate) async fn email(client: &Client, m: &str, space_id: &str, email_id: &str) -> Result<Option<Value>, ApiError> {
    let statement =
        client.prepare_cached(&format!("SELECT doc FROM {m}.emails WHERE space_id = $1 AND email_id = $2")).await?;
    let Some(mut story) =
        client.query_opt(&statement, &[&space_id, &email_id]).await?.map(|row| row.get::<_, Value>(0))
    else {
        return test_email(client, space_id, email_id).await;
    };
    super::log::with_content_fields(&mut story);
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

/// The story of a test send of the space, folded from its stream (test sends are no
/// contact's email, so the read model keeps none); `contactId` is null when given data
/// rendered it.
async fn test_email(client: &Client, space_id: &str, email_id: &str) -> Result<Option<Value>, ApiError> {
    let stream = domain::email::stream_id(email_id);
    let events = platform::log::read_streams(client, &[stream]).await?;
    let events: Vec<LogEvent> = events
        .iter()
        .map(|stored| stored.decode())
        .collect::<Result<_, _>>()
        .map_err(|error| ApiError::internal(&error))?;
    let of_space = events.iter().any(|event| match event {
        LogEvent::EmailTestRequested(requested) => requested.space_id == space_id,
        _ => false,
    });
    let Some(story) = domain::email::story::test_story(&events).filter(|_| of_space) else { return Ok(None) };
    let mut story = serde_json::to_value(story).map_err(|error| ApiError::internal(&error.into()))?;
    if story["contactId"] == "" {
        story["contactId"] = Value::Null;
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
