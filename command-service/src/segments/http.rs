//! `POST /segments` and `DELETE /segments/{id}`.
//!
//! A create reads the space's vocabulary (contact attributes, event schemas, topics) and its
//! credits from the catalog in one statement, has the AI provider turn the definition into a
//! filter once, resolves the filter's names to ids, and appends `SegmentCreated` with the
//! credit it spent. The filter is stored in the log and never returned; its description is.

use std::collections::BTreeSet;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use deadpool_postgres::GenericClient;
use serde_json::{Value, json};
use shared::ai::AiError;
use shared::auth::Permission;
use shared::catalog::CATALOG;
use shared::error::{ApiError, Code};
use shared::events::LogEvent;
use shared::ids::new_id;
use shared::log::{AppendError, ExpectedVersion, StreamAppend};
use shared::proto;
use shared::ratelimit::Bucket;

use super::decide::{self, ContactSchema, Vocabulary};
use crate::State;
use crate::edge::{append_error, respond};
use crate::idempotency;

/// The log stream of a segment.
pub fn stream_id(segment_id: &str) -> String {
    format!("segment-{segment_id}")
}

/// The space's vocabulary and remaining credits, from catalog version `catalog`, in one
/// statement.
async fn vocabulary(client: &impl GenericClient, catalog: &str, space_id: &str) -> anyhow::Result<(Vocabulary, i64)> {
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
    let vocabulary = Vocabulary { contact_schemas, events: names(row.get(1)), topics: names(row.get(2)) };
    Ok((vocabulary, row.get(3)))
}

#[tracing::instrument(skip_all)]
pub async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let body = shared::http::read_json_object(&req, payload).await;
    let caller = state.authenticator.authorize_in(&req, Permission::Write, Bucket::Ai).await?;
    let body = body?;
    let new = decide::parse_create(&body)?;
    let (req, state, caller, new) = (&req, &**state, &caller, &new);
    idempotency::protect(state, req, caller, &Value::Object(body), |claim, operation_id| async move {
        let space_id = caller.space_id();
        let models = state.read_models.wait_for(&[CATALOG], 0, state.settings.consistency_wait()).await?;
        let (vocabulary, credits) = vocabulary(&state.pool.get().await?, &models.schema(CATALOG), space_id)
            .await
            .map_err(|error| ApiError::internal(&error))?;
        if credits <= 0 {
            return Err(ApiError::new(
                StatusCode::PAYMENT_REQUIRED,
                Some(Code::InsufficientCredits),
                "the space has no AI credits left; defining a segment needs one",
            ));
        }
        let filter = match state.ai.filter(&new.definition).await {
            Ok(filter) => filter,
            Err(AiError::Refused(reason) | AiError::Unfit(reason)) => {
                return Err(decide::Refusal::Unusable(reason).into());
            }
            Err(error) => {
                return Err(ApiError::unavailable(format!("{error}; retry with the same Idempotency-Key")));
            }
        };
        let description = shared::filter::describe(&filter);
        let resolved = decide::resolve(filter, &vocabulary)?;
        let segment_id = new_id("seg");
        let now = shared::time::now_millis();
        let event = LogEvent::SegmentCreated(proto::SegmentCreated {
            segment_id: segment_id.clone(),
            space_id: space_id.to_owned(),
            name: new.name.clone(),
            definition: new.definition.clone(),
            description: description.clone(),
            filter_json: resolved.to_json().to_string(),
            created_at_ms: now,
        });
        // Membership is computed by the projector; a read with the Consistency-Token of
        // this answer shows it.
        let document = json!({
            "id": segment_id,
            "name": new.name,
            "definition": new.definition,
            "description": description,
            "createdAt": shared::time::format_millis(now),
            "memberCount": null,
        });
        let body = shared::http::data_body(document, &[]);
        let guards = std::iter::once(shared::admission::spend_guard(space_id, 1))
            .chain(claim.as_ref().map(|claim| claim.completion(StatusCode::CREATED, &body)))
            .collect();
        let stream = StreamAppend::one(stream_id(&segment_id), ExpectedVersion::NoStream, event, now);
        let appended = crate::edge::append(state, req, caller, claim.as_ref(), vec![stream], guards)
            .await
            .map_err(append_error)?;
        Ok(respond(StatusCode::CREATED, &body, &operation_id, Some(appended)))
    })
    .await
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
pub async fn load_live(client: &impl GenericClient, space_id: &str, segment_id: &str) -> Result<i64, ApiError> {
    match load(client, segment_id).await.map_err(|error| ApiError::internal(&error))? {
        Some((version, owner)) if owner == space_id => Ok(version),
        _ => Err(ApiError::not_found(Code::SegmentNotFound, format!("no segment {segment_id:?} in this space"))),
    }
}

#[tracing::instrument(skip_all, fields(segment = %path.as_str()))]
pub async fn delete(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Write).await?;
    let (req, state, caller, segment_id) = (&req, &**state, &caller, path.as_str());
    idempotency::protect(state, req, caller, &Value::Null, |claim, operation_id| async move {
        let version = load_live(&state.pool.get().await?, caller.space_id(), segment_id).await?;
        let now = shared::time::now_millis();
        let body = shared::http::data_body(json!({"id": segment_id, "deleted": true}), &[]);
        let event = LogEvent::SegmentDeleted(proto::SegmentDeleted {
            segment_id: segment_id.to_owned(),
            space_id: caller.space_id().to_owned(),
            deleted_at_ms: now,
        });
        let stream = StreamAppend::one(stream_id(segment_id), ExpectedVersion::Exactly(version), event, now);
        let guards = claim.as_ref().map(|claim| claim.completion(StatusCode::OK, &body)).into_iter().collect();
        match crate::edge::append(state, req, caller, claim.as_ref(), vec![stream], guards).await {
            Ok(appended) => Ok(respond(StatusCode::OK, &body, &operation_id, Some(appended))),
            // A concurrent delete won: this one finds it gone.
            Err(AppendError::WrongVersion { .. }) => {
                Err(ApiError::not_found(Code::SegmentNotFound, format!("no segment {segment_id:?} in this space")))
            }
            Err(error) => Err(append_error(error)),
        }
    })
    .await
}
