//! What email decisions and pages read: a contact's subscriptions, the space's topics, and who
//! an email is from and to (whether an address is suppressed: `mail::facts`).

use domain::email::resources;
use domain::email::subscriptions_stream;

/// A contact's subscription status per topic, folded from its subscriptions stream.
pub async fn subscriptions(
    client: &impl deadpool_postgres::GenericClient,
    contact_id: &str,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    Ok(subscriptions_of(client, &[contact_id.to_owned()]).await?.remove(contact_id).unwrap_or_default())
}

/// [`subscriptions`] of many contacts, in one statement: contact -> topic -> status (a contact
/// that never changed a subscription is absent).
pub async fn subscriptions_of(
    client: &impl deadpool_postgres::GenericClient,
    contact_ids: &[String],
) -> anyhow::Result<std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>> {
    let streams: Vec<String> = contact_ids.iter().map(|contact_id| subscriptions_stream(contact_id)).collect();
    let mut status: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>> =
        std::collections::BTreeMap::new();
    for stored in platform::log::read_streams(client, &streams).await? {
        if let platform::events::LogEvent::SubscriptionChanged(changed) = stored.decode()? {
            status.entry(changed.contact_id).or_default().insert(changed.topic_id, changed.status);
        }
    }
    Ok(status)
}

/// The space's topics as catalog version `catalog` holds them, by name (then id).
pub async fn topics(
    client: &impl deadpool_postgres::GenericClient,
    catalog: &str,
    space_id: &str,
) -> anyhow::Result<Vec<(String, resources::TopicDef)>> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT resource_id, definition FROM {catalog}.resources WHERE space_id = $1 AND kind = $2
             ORDER BY definition->>'name', resource_id"
        ))
        .await?;
    let mut topics = Vec::new();
    for row in client.query(&statement, &[&space_id, &resources::TOPIC]).await? {
        let (topic_id, definition): (String, serde_json::Value) = (row.get(0), row.get(1));
        let topic = serde_json::from_value(definition).map_err(|error| anyhow::anyhow!("topic {topic_id}: {error}"))?;
        topics.push((topic_id, topic));
    }
    Ok(topics)
}

/// The space's page text and locale setting as catalog version `catalog` holds them (none:
/// the platform's English for everyone).
pub async fn page_text(
    client: &impl deadpool_postgres::GenericClient,
    catalog: &str,
    space_id: &str,
) -> anyhow::Result<resources::PageTextDef> {
    match crate::catalog::resource_by_id(client, catalog, resources::PAGE_TEXT, space_id).await? {
        Some((_, _, definition)) => serde_json::from_value(definition)
            .map_err(|error| anyhow::anyhow!("the page text of space {space_id}: {error}")),
        None => Ok(resources::PageTextDef::default()),
    }
}

/// Who an email is from and to, as its pages name them: the sender's name (from catalog
/// version `catalog`; `None` once the sender is gone) and the address it went to (opened from
/// the email with its contact's key; `None` once the contact is erased).
pub async fn parties(
    client: &impl deadpool_postgres::GenericClient,
    catalog: &str,
    scheduled: &platform::proto::EmailScheduled,
) -> anyhow::Result<(Option<String>, Option<String>)> {
    let sender = crate::catalog::resource_by_id(client, catalog, resources::SENDER, &scheduled.sender_id)
        .await?
        .and_then(|(_, _, definition)| definition.get("fromName").and_then(|name| name.as_str()).map(str::to_owned));
    let keys = platform::crypto::load_keys(client, std::slice::from_ref(&scheduled.contact_id)).await?;
    let content: Option<platform::proto::EmailContent> = platform::events::open(scheduled.content.as_ref(), &keys)?;
    Ok((sender, content.map(|content| content.to_address)))
}
