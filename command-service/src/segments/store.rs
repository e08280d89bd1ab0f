//! The segment's reads: its stream, the space's vocabulary (from the catalog), and whether a
//! segment is live.

use std::collections::BTreeSet;

use deadpool_postgres::GenericClient;
use platform::error::ApiError;
use platform::events::LogEvent;
use serde_json::Value;

pub use super::decide::stream_id;
use super::decide::{ContactSchema, Refusal, Vocabulary};

/// The space's vocabulary and remaining credits, from catalog version `catalog`, in one
/// statement.
pub(crate) async fn vocabulary(
    client: &impl GenericClient,
    catalog: &str,
    space_id: &str,
) -> anyhow::Result<(Vocabulary, i64)> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT
                 COALESCE((SELECT jsonb_agg(jsonb_build_object(
                         'attributes', (SELECT COALESCE(jsonb_agg(a.key), '[]') FROM {catalog}.attributes a
                                        WHERE a.schema_id = s.schema_id),
                         'consent', (SELECT COALESCE(jsonb_agg(a.key), '[]') FROM {catalog}.attributes a
                                     WHERE a.schema_id = s.schema_id AND a.definition #>> '{{consent,channel}}' = 'email')))
                           FROM {catalog}.schemas s WHERE s.space_id = $1 AND s.schema_type = 'contact'), '[]'),
                 COALESCE((SELECT jsonb_agg(jsonb_build_array(s.slug, s.schema_id))
                           FROM {catalog}.schemas s WHERE s.space_id = $1 AND s.schema_type = 'event'), '[]'),
                 COALESCE((SELECT jsonb_agg(jsonb_build_array(r.definition ->> 'slug', r.resource_id))
                           FROM {catalog}.resources r WHERE r.space_id = $1 AND r.kind = 'topic'), '[]'),
                 COALESCE((SELECT jsonb_agg(jsonb_build_array(r.kind, r.definition ->> 'slug', r.resource_id,
                                   COALESCE((SELECT jsonb_agg(step ->> 'id') FROM jsonb_array_elements(
                                       CASE WHEN jsonb_typeof(r.definition -> 'steps') = 'array'
                                            THEN r.definition -> 'steps' ELSE '[]' END) step), '[]')))
                           FROM {catalog}.resources r WHERE r.space_id = $1
                             AND r.kind IN ('template', 'broadcast', 'workflow')), '[]'),
                 COALESCE((SELECT balance FROM {catalog}.ai_credits WHERE space_id = $1), 0)
                   - COALESCE((SELECT spent FROM public.ai_credit_spend WHERE space_id = $1), 0)"
        ))
        .await?;
    let row = client.query_one(&statement, &[&space_id]).await?;
    let strings = |value: &Value| -> BTreeSet<String> {
        value.as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
    };
    let contact_schemas = row
        .get::<_, Value>(0)
        .as_array()
        .into_iter()
        .flatten()
        .map(|schema| ContactSchema {
            attributes: strings(&schema["attributes"]),
            consent_keys: strings(&schema["consent"]).into_iter().collect(),
        })
        .collect();
    // Slugs and ids both name a schema or topic.
    let names = |value: Value| {
        value
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|pair| Some((pair.get(0)?.as_str()?.to_owned(), pair.get(1)?.as_str()?.to_owned())))
            .flat_map(|(slug, id)| [(slug, id.clone()), (id.clone(), id)])
            .collect()
    };
    let mut vocabulary =
        Vocabulary { contact_schemas, events: names(row.get(1)), topics: names(row.get(2)), ..Vocabulary::default() };
    for resource in row.get::<_, Value>(3).as_array().into_iter().flatten() {
        let (Some(kind), Some(slug), Some(id)) = (resource[0].as_str(), resource[1].as_str(), resource[2].as_str())
        else {
            continue;
        };
        let names = match kind {
            "template" => &mut vocabulary.templates,
            "broadcast" => &mut vocabulary.broadcasts,
            _ => {
                vocabulary.workflow_steps.insert(id.to_owned(), strings(&resource[3]));
                &mut vocabulary.workflows
            }
        };
        names.insert(slug.to_owned(), id.to_owned());
        names.insert(id.to_owned(), id.to_owned());
    }
    Ok((vocabulary, row.get(4)))
}

/// The segment's stream version and space, when it exists and is not deleted.
pub async fn load(client: &impl GenericClient, segment_id: &str) -> anyhow::Result<Option<(i64, String)>> {
    let statement = client
        .prepare_cached(
            "SELECT stream_version, event_type, payload FROM events WHERE stream_id = $1 ORDER BY stream_version",
        )
        .await?;
    let mut current = None;
    for row in client.query(&statement, &[&stream_id(segment_id)]).await? {
        current = match LogEvent::decode(row.get(1), row.get(2))? {
            LogEvent::SegmentCreated(created) => Some((row.get(0), created.space_id)),
            LogEvent::SegmentDeleted(_) => None,
            _ => current,
        };
    }
    Ok(current)
}

/// A live segment of the caller's space: its stream version; 404 otherwise (also for another
/// space's).
pub(crate) async fn load_live(client: &impl GenericClient, space_id: &str, segment_id: &str) -> Result<i64, ApiError> {
    match load(client, segment_id).await.map_err(ApiError::from)? {
        Some((version, owner)) if owner == space_id => Ok(version),
        _ => Err(not_found(segment_id)),
    }
}

pub(crate) fn not_found(segment_id: &str) -> ApiError {
    Refusal::NotFound(segment_id.to_owned()).into()
}
