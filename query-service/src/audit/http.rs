//! `GET /schemas/{schema}/records/{id}/audit-trail`: a contact's consent and communication
//! history, read straight from the event log (through the index on the subject), not from a
//! projection. `trail` folds the events into entries (pure); `store` reads them.

use std::collections::BTreeMap;

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{page_body, query_pairs};
use api::pagination::PageRequest;
use domain::catalog::CATALOG;
use domain::records::CHANNELS;
use platform::error::{ApiError, Code};
use serde_json::Value;

use super::store;
use super::trail::{email_entries, ingest_entries, record_history, suppression_entries, workflow_entries};
use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};
use crate::schemas::http::schema_not_found;

pub async fn get(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let query = query_pairs(&req);
    let page = PageRequest::parse(&query)?;
    // The communication channels, `workflow` for the journeys a contact went through, and
    // `ingest` for what the Segment-compatible ingest kept of its messages.
    let channels: Vec<&str> = CHANNELS.iter().copied().chain(["workflow", "ingest"]).collect();
    let channel = match api::http::query_value(&query, "channel") {
        Some(channel) if channels.contains(&channel) => Some(channel.to_owned()),
        Some(other) => {
            return Err(ApiError::of(
                Code::InvalidQueryParameter,
                format!("channel must be one of {}; got {other:?}", channels.join(", ")),
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
        Box::pin(async move { Ok(reads::catalog::write_context(client, &c, &space_id, &schema_ref).await?) })
    })
    .await?;
    let domain::catalog::WriteContext { schema, attributes, .. } =
        context.ok_or_else(|| schema_not_found(&schema_ref))?;
    if schema.schema_type != "contact" {
        return Err(ApiError::of(
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
    let (record_events, keys) = store::record_events(&client, &record_id).await?;
    let history = record_history(&record_events, &keys, &space_id, &schema.schema_id, &consent)?
        .ok_or_else(|| ApiError::of(Code::RecordNotFound, format!("no record {record_id:?} in this schema")))?;
    let subjects = history
        .emails
        .iter()
        .map(|email| platform::crypto::email_subject(email))
        .collect::<anyhow::Result<Vec<String>>>()?;
    let suppression_events = store::suppression_events(&client, &subjects).await?;
    drop(client);
    let mut entries = history.entries;
    entries.extend(email_entries(&record_events, &keys, &space_id)?);
    entries.extend(workflow_entries(&record_events, &space_id)?);
    entries.extend(ingest_entries(&record_events, &keys, &space_id)?);
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
