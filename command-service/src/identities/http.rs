//! `POST /event-identities`: binds an anonymous identity (an alias: a browser identity in a
//! contact track's source) to a contact, or removes the binding.
//!
//! Each alias is its own log stream (`alias/{space}/{digest}`) whose version is the alias
//! revision, so `expectedAliasRevision` is an optimistic concurrency check on that stream.
//! The anonymous id never reaches the database: the alias is named by a keyed digest. An
//! operation is recorded with its result in the same transaction as its event, so the same
//! `operationId` with the same body replays the result and a changed body is refused.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::json;
use shared::auth::Permission;
use shared::catalog::CATALOG;
use shared::error::{ApiError, Code};
use shared::events::LogEvent;
use shared::log::{AppendError, AppendRequest, ExpectedVersion, NewEvent, StreamAppend};

use super::decide::{Decision, Given, decide, parse_change};
use super::store::{self, CAPACITY, OPERATION_TAKEN, REVISION_MOVED};
use crate::State;
use crate::events::store::SUBJECT_DELETING;

/// How often a change that lost a race is decided again.
const ATTEMPTS: usize = 3;

fn source_unavailable(source_id: &str) -> ApiError {
    ApiError::new(
        actix_web::http::StatusCode::FORBIDDEN,
        Some(Code::IdentitySourceUnavailable),
        format!(
            "identity source {source_id:?} is unavailable: no enabled contact track with this sourceId uses that \
             contact schema"
        ),
    )
}

#[tracing::instrument(skip_all)]
pub async fn change(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Write).await?;
    let change = parse_change(shared::http::read_json_object(&req, payload).await?)?;
    let space_id = caller.space_id().to_owned();
    // 403 unless an enabled contact track of the space has the source and uses the schema.
    let models = state.read_models.wait_for(&[CATALOG], 0, state.settings.consistency_wait()).await?;
    let client = state.pool.get().await?;
    let schemas = store::track_schemas(&client, &models.schema(CATALOG), &space_id, &change.source_id).await?;
    drop(client);
    if !schemas.contains(&change.subject_schema_id) {
        return Err(source_unavailable(&change.source_id));
    }
    let body_digest = shared::crypto::keyed_digest(
        "identity-change",
        &shared::canonical::canonical_json(&json!([
            change.source_id,
            change.subject_schema_id,
            change.anonymous_id,
            change.contact_id,
            change.expected_revision
        ])),
    )?;
    let alias = shared::crypto::keyed_digest("alias", &format!("{}\0{}", change.source_id, change.anonymous_id))?;
    for _ in 0..ATTEMPTS {
        let client = state.pool.get().await?;
        let recorded = store::load_operation(&client, &space_id, &change.operation_id).await?;
        let alias_state = store::load_alias(&client, &space_id, &alias).await?;
        let contact = match &change.contact_id {
            Some(contact_id) if recorded.is_none() => Some(store::load_contact(&client, contact_id).await?),
            _ => None,
        };
        drop(client);
        let previous = alias_state.contact_id.clone();
        let given = Given {
            space_id: &space_id,
            alias_digest: &alias,
            body_digest: &body_digest,
            recorded,
            alias: alias_state,
            contact,
            now_ms: shared::time::now_millis(),
        };
        let (event, result, revision) = match decide(&change, given)? {
            Decision::Replay(result) => return Ok(HttpResponse::Ok().json(json!({ "data": result }))),
            Decision::Change { event, result, expected_revision } => (event, result, expected_revision),
        };
        let capacity = state.settings.identity;
        let guards = store::guards(capacity, &space_id, &change, &alias, &body_digest, &result, revision);
        let appended = state
            .event_log
            .append(AppendRequest {
                metadata: crate::edge::metadata(&req, &caller, None),
                streams: vec![StreamAppend {
                    stream_id: format!("alias/{space_id}/{alias}"),
                    expected: if revision == 0 {
                        ExpectedVersion::NoStream
                    } else {
                        ExpectedVersion::Exactly(revision)
                    },
                    events: vec![NewEvent {
                        subject_id: change.contact_id.clone().or(previous),
                        occurred_at: shared::time::from_millis(event.changed_at_ms),
                        event: LogEvent::EventIdentityChanged(event),
                    }],
                }],
                guards,
            })
            .await;
        match appended {
            Ok(appended) => {
                let mut response = HttpResponse::Ok();
                response.insert_header(("Consistency-Token", appended.last_position.to_string()));
                return Ok(response.json(json!({ "data": result })));
            }
            // Another request under this operationId won, or the alias moved on: decide again.
            Err(
                AppendError::Conflict { code: OPERATION_TAKEN | REVISION_MOVED, .. } | AppendError::WrongVersion { .. },
            ) => {
                continue;
            }
            Err(AppendError::Conflict { code: CAPACITY, .. }) => {
                return Err(ApiError::new(
                    actix_web::http::StatusCode::TOO_MANY_REQUESTS,
                    Some(CAPACITY),
                    format!(
                        "the space's identity capacity is exhausted ({} aliases, {} identity changes)",
                        capacity.aliases, capacity.changes
                    ),
                ));
            }
            Err(AppendError::Conflict { code: SUBJECT_DELETING, .. }) => {
                return Err(ApiError::conflict(Code::RecordDeletionPending, "the contact is being deleted"));
            }
            Err(error) => return Err(crate::edge::append_error(error)),
        }
    }
    Err(ApiError::conflict(
        Code::ConcurrentModification,
        "the alias kept changing while this change was applied; retry",
    ))
}
