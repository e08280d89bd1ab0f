//! `POST /schemas/{schema}/records`: strict create.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use shared::auth::Permission;
use shared::catalog::{self, CATALOG};
use shared::error::ApiError;
use shared::ids::new_id;
use shared::log::{AppendRequest, ExpectedVersion, Guard, Metadata, NewEvent, StreamAppend};
use shared::records::record_document;

use crate::State;
use crate::domain::records::{WriteSchema, decide_create};

#[tracing::instrument(skip_all, fields(schema = %path.as_str()))]
pub async fn create(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let operation_id = new_id("op");
    let caller = state.authenticator.authorize(&req, Permission::Write).await?;
    let input = shared::http::read_json_object(&req, payload).await?;
    let models = state.read_models.wait_for(&[CATALOG], 0, state.settings.consistency_wait).await?;
    let catalog_schema = models.schema(CATALOG);
    let client = state.pool.get().await?;
    let (schema, attributes, credits) = catalog::write_context(&client, &catalog_schema, caller.space_id(), &path)
        .await?
        .filter(|(schema, _, _)| schema.schema_type != "event")
        .ok_or_else(|| {
            ApiError::not_found("schema_not_found", format!("no contact or object schema {:?}", path.as_str()))
        })?;
    drop(client);

    let prefix = if schema.schema_type == "contact" { "con" } else { "obj" };
    let record_id = new_id(prefix);
    let write_schema = WriteSchema {
        schema_id: &schema.schema_id,
        space_id: caller.space_id(),
        schema_type: &schema.schema_type,
        attributes: &attributes,
    };
    let decision = decide_create(&write_schema, credits, input, &record_id, shared::time::now_millis())?;
    let document = record_document(&decision.event).map_err(|error| ApiError::internal(&error))?;

    let guards = decision
        .identities
        .iter()
        .map(|identity| Guard {
            sql: "INSERT INTO record_identities (space_id, schema_id, kind, value, record_id) VALUES ($1, $2, $3, $4, $5)",
            params: vec![
                Box::new(caller.space_id().to_owned()),
                Box::new(schema.schema_id.clone()),
                Box::new(identity.key.to_owned()),
                Box::new(identity.value.clone()),
                Box::new(record_id.clone()),
            ],
            conflict: shared::log::AppendError::Conflict {
                code: "identifier_conflict",
                message: format!("a record with this {} already exists in the schema", identity.key),
            },
        })
        .collect();
    let occurred_at = shared::time::from_millis(decision.event.created_at_ms);
    let request = AppendRequest {
        metadata: Metadata {
            space_id: Some(caller.space_id().to_owned()),
            actor_key_id: Some(caller.key_id().to_owned()),
            actor_user_id: Some(caller.identity.user_id.clone()),
            request_id: Some(shared::http::request_id(&req)),
            idempotency_key: None,
        },
        streams: vec![StreamAppend {
            stream_id: format!("record/{record_id}"),
            expected: ExpectedVersion::NoStream,
            events: vec![NewEvent {
                event: shared::events::LogEvent::RecordCreated(decision.event),
                subject_id: Some(record_id.clone()),
                occurred_at,
            }],
        }],
        guards,
    };
    let appended = state
        .event_log
        .append(request)
        .await
        .map_err(|error| super::append_error(error).with_header("Operation-Id", operation_id.clone()))?;
    Ok(HttpResponse::build(StatusCode::CREATED)
        .insert_header(("Operation-Id", operation_id))
        .insert_header(("Consistency-Token", appended.last_position.to_string()))
        .json(shared::http::data_body(document, &[])))
}
