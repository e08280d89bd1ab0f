//! `POST /event-identities`: binds an anonymous identity (an alias: a browser identity in a
//! contact track's source) to a contact, or removes the binding.
//!
//! Each alias is its own log stream (`alias/{space}/{digest}`) whose version is the alias
//! revision, so `expectedAliasRevision` is an optimistic concurrency check on that stream.
//! The anonymous id never reaches the database: the alias is named by a keyed digest. An
//! operation is recorded with its result in the same transaction as its event, so the same
//! `operationId` with the same body replays the result and a changed body is refused.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Map, Value, json};
use shared::auth::{Caller, Permission};
use shared::catalog::CATALOG;
use shared::error::Code;
use shared::error::{ApiError, Issue};
use shared::events::LogEvent;
use shared::log::{AppendError, AppendRequest, ExpectedVersion, Guard, NewEvent, StreamAppend};
use shared::proto;

use crate::State;
use shared::records::Loaded;

use crate::events::store::{SUBJECT_DELETING, load_subjects, subjects_guard};

const FIELDS: [&str; 6] =
    ["sourceId", "subjectSchemaId", "anonymousId", "contactId", "operationId", "expectedAliasRevision"];
const OPERATION_TAKEN: Code = Code::OperationTaken;
const REVISION_MOVED: Code = Code::AliasRevisionConflict;
const CAPACITY: Code = Code::IdentityCapacityExhausted;
const ATTEMPTS: usize = 3;

/// A validated identity change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub source_id: String,
    pub subject_schema_id: String,
    pub anonymous_id: String,
    pub contact_id: Option<String>,
    pub operation_id: String,
    pub expected_revision: i64,
}

/// Validates the body: exactly the six fields, with their types.
pub fn parse_change(body: Map<String, Value>) -> Result<Change, ApiError> {
    let mut issues = Vec::new();
    for key in body.keys().filter(|key| !FIELDS.contains(&key.as_str())) {
        issues.push(Issue::coded(key, Code::UnknownField, format!("{key} is not a field of an identity change")));
    }
    let text = |key: &str, issues: &mut Vec<Issue>| -> Option<String> {
        match body.get(key) {
            Some(Value::String(value)) if !value.trim().is_empty() && value.chars().count() <= 256 => {
                Some(value.clone())
            }
            Some(_) => {
                issues.push(Issue::coded(key, Code::InvalidField, format!("{key} must be a non-empty string")));
                None
            }
            None => {
                issues.push(Issue::coded(key, Code::MissingField, format!("{key} is required")));
                None
            }
        }
    };
    let source_id = text("sourceId", &mut issues);
    let subject_schema_id = text("subjectSchemaId", &mut issues);
    let anonymous_id = text("anonymousId", &mut issues);
    let contact_id = match body.get("contactId") {
        Some(Value::Null) => Some(None),
        Some(Value::String(id)) if !id.trim().is_empty() => Some(Some(id.clone())),
        Some(_) => {
            issues.push(Issue::coded("contactId", Code::InvalidField, "contactId must be a contact id or null"));
            None
        }
        None => {
            issues.push(Issue::coded(
                "contactId",
                Code::MissingField,
                "contactId is required (null removes the binding)",
            ));
            None
        }
    };
    let operation_id = text("operationId", &mut issues).and_then(|id| match uuid::Uuid::parse_str(&id) {
        Ok(parsed) => Some(parsed.hyphenated().to_string()),
        Err(_) => {
            issues.push(Issue::coded("operationId", Code::InvalidField, "operationId must be a UUID"));
            None
        }
    });
    let expected_revision = text("expectedAliasRevision", &mut issues).and_then(|raw| {
        match raw.parse::<i64>().ok().filter(|n| *n >= 0 && raw.chars().all(|c| c.is_ascii_digit())) {
            Some(revision) => Some(revision),
            None => {
                issues.push(Issue::coded(
                    "expectedAliasRevision",
                    Code::InvalidField,
                    "expectedAliasRevision must be a decimal string (\"0\" for a new alias)",
                ));
                None
            }
        }
    });
    match (source_id, subject_schema_id, anonymous_id, contact_id, operation_id, expected_revision) {
        (
            Some(source_id),
            Some(subject_schema_id),
            Some(anonymous_id),
            Some(contact_id),
            Some(operation_id),
            Some(expected_revision),
        ) if issues.is_empty() => {
            Ok(Change { source_id, subject_schema_id, anonymous_id, contact_id, operation_id, expected_revision })
        }
        _ => {
            let message = issues.first().map_or_else(|| "invalid identity change".to_owned(), |i| i.message.clone());
            Err(ApiError::bad_request(Code::InvalidIdentityChange, message).with_issues(issues))
        }
    }
}

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

/// 403 unless an enabled contact track of the space has `source_id` and uses the contact
/// schema `subject_schema_id` (by id).
async fn check_source(state: &State, caller: &Caller, change: &Change) -> Result<(), ApiError> {
    let models = state.read_models.wait_for(&[CATALOG], 0, state.settings.consistency_wait).await?;
    let c = models.schema(CATALOG);
    let client = state.pool.get().await?;
    let statement = client
        .prepare_cached(&format!(
            "SELECT s.schema_id FROM {c}.resources r
             JOIN {c}.schemas s ON s.space_id = r.space_id
                 AND (s.schema_id = r.definition ->> 'subjectSchema' OR s.slug = r.definition ->> 'subjectSchema')
             WHERE r.kind = 'contact_track' AND r.space_id = $1 AND r.definition ->> 'sourceId' = $2
               AND COALESCE(r.definition ->> 'enabled', 'true') <> 'false' AND s.schema_type = 'contact'"
        ))
        .await?;
    let rows = client.query(&statement, &[&caller.space_id(), &change.source_id]).await?;
    if rows.iter().any(|row| row.get::<_, &str>(0) == change.subject_schema_id) {
        Ok(())
    } else {
        Err(source_unavailable(&change.source_id))
    }
}

/// The alias as the write side holds it: `(contact, revision, erased)`.
async fn load_alias(
    client: &deadpool_postgres::Client,
    space_id: &str,
    digest: &str,
) -> Result<(Option<String>, i64, bool), ApiError> {
    let statement = client
        .prepare_cached(
            "SELECT contact_id, revision, erased FROM identity_aliases WHERE space_id = $1 AND alias_digest = $2",
        )
        .await?;
    Ok(client
        .query_opt(&statement, &[&space_id, &digest])
        .await?
        .map_or((None, 0, false), |row| (row.get(0), row.get(1), row.get(2))))
}

/// The recorded result of an operation already applied: `(body digest, result)`.
async fn load_operation(
    client: &deadpool_postgres::Client,
    space_id: &str,
    operation_id: &str,
) -> Result<Option<(String, Value)>, ApiError> {
    let statement = client
        .prepare_cached("SELECT body_digest, result FROM identity_operations WHERE space_id = $1 AND operation_id = $2")
        .await?;
    Ok(client.query_opt(&statement, &[&space_id, &operation_id]).await?.map(|row| (row.get(0), row.get(1))))
}

fn replay(recorded: (String, Value), digest: &str) -> Result<HttpResponse, ApiError> {
    let (recorded_digest, mut result) = recorded;
    if recorded_digest != digest {
        return Err(ApiError::conflict(
            Code::OperationIdConflict,
            "this operationId was used for a different identity change; use a new operationId",
        ));
    }
    result["isDuplicate"] = Value::Bool(true);
    Ok(HttpResponse::Ok().json(json!({ "data": result })))
}

#[tracing::instrument(skip_all)]
pub async fn change(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Write).await?;
    let change = parse_change(shared::http::read_json_object(&req, payload).await?)?;
    check_source(&state, &caller, &change).await?;
    let space_id = caller.space_id().to_owned();
    let internal = |error: anyhow::Error| ApiError::internal(&error);
    let body_digest = shared::crypto::keyed_digest(
        "identity-change",
        &shared::canonical::canonical_json(&json!([
            change.source_id,
            change.subject_schema_id,
            change.anonymous_id,
            change.contact_id,
            change.expected_revision
        ])),
    )
    .map_err(internal)?;
    let alias = shared::crypto::keyed_digest("alias", &format!("{}\0{}", change.source_id, change.anonymous_id))
        .map_err(internal)?;
    for _ in 0..ATTEMPTS {
        let client = state.pool.get().await?;
        if let Some(recorded) = load_operation(&client, &space_id, &change.operation_id).await? {
            return replay(recorded, &body_digest);
        }
        let (previous, revision, erased) = load_alias(&client, &space_id, &alias).await?;
        if erased {
            return Err(ApiError::conflict(Code::AliasErased, "the contact this alias was bound to was erased"));
        }
        if revision != change.expected_revision {
            return Err(revision_conflict(revision));
        }
        if let Some(contact_id) = &change.contact_id {
            let subjects = load_subjects(&client, std::slice::from_ref(contact_id)).await.map_err(internal)?;
            match subjects.get(contact_id) {
                Some(Loaded::Live { state, .. })
                    if state.space_id == space_id && state.schema_id == change.subject_schema_id => {}
                Some(Loaded::Deleting { .. }) => {
                    return Err(ApiError::conflict(
                        Code::RecordDeletionPending,
                        format!("contact {contact_id:?} is being deleted"),
                    ));
                }
                _ => {
                    return Err(ApiError::not_found(
                        Code::RecordNotFound,
                        format!("no contact {contact_id:?} in schema {:?}", change.subject_schema_id),
                    ));
                }
            }
        }
        drop(client);
        let new_revision = revision + 1;
        let mut affected: Vec<String> = previous.iter().chain(change.contact_id.iter()).cloned().collect();
        affected.dedup();
        let result = json!({
            "identityRevision": new_revision.to_string(),
            "affectedSubjectIds": affected,
            "isDuplicate": false,
        });
        let event = proto::EventIdentityChanged {
            space_id: space_id.clone(),
            source_id: change.source_id.clone(),
            subject_schema_id: change.subject_schema_id.clone(),
            alias_digest: alias.clone(),
            operation_id: change.operation_id.clone(),
            contact_id: change.contact_id.clone().unwrap_or_default(),
            previous_contact_id: previous.clone().unwrap_or_default(),
            revision: new_revision,
            changed_at_ms: shared::time::now_millis(),
        };
        let guards = guards(&state, &space_id, &change, &alias, &body_digest, &result, revision);
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
            Err(AppendError::Conflict { code: OPERATION_TAKEN, .. } | AppendError::WrongVersion { .. }) => continue,
            Err(AppendError::Conflict { code: REVISION_MOVED, .. }) => continue,
            Err(AppendError::Conflict { code: CAPACITY, .. }) => {
                return Err(ApiError::new(
                    actix_web::http::StatusCode::TOO_MANY_REQUESTS,
                    Some(CAPACITY),
                    format!(
                        "the space's identity capacity is exhausted ({} aliases, {} identity changes)",
                        state.settings.identity_capacity.aliases, state.settings.identity_capacity.changes
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

fn revision_conflict(current: i64) -> ApiError {
    ApiError::conflict(
        Code::AliasRevisionConflict,
        format!("expectedAliasRevision does not match: the alias is at revision {current}"),
    )
}

/// The write-side claims of one change: the operation, the alias row, the capacity counts
/// and (when binding) that the contact's deletion has not started.
fn guards(
    state: &State,
    space_id: &str,
    change: &Change,
    alias: &str,
    body_digest: &str,
    result: &Value,
    revision: i64,
) -> Vec<Guard> {
    let capacity = state.settings.identity_capacity;
    let new_alias = i64::from(revision == 0);
    let mut guards = vec![
        Guard::unique(
            "INSERT INTO identity_operations (space_id, operation_id, body_digest, result) VALUES ($1, $2, $3, $4)",
            vec![
                Box::new(space_id.to_owned()),
                Box::new(change.operation_id.clone()),
                Box::new(body_digest.to_owned()),
                Box::new(result.clone()),
            ],
            AppendError::Conflict { code: OPERATION_TAKEN, message: String::new() },
        ),
        Guard::exactly_one(
            "INSERT INTO identity_aliases (space_id, alias_digest, contact_id, revision)
             VALUES ($1, $2, $3, $4::bigint + 1)
             ON CONFLICT (space_id, alias_digest) DO UPDATE SET contact_id = EXCLUDED.contact_id,
                 revision = EXCLUDED.revision
             WHERE identity_aliases.revision = $4::bigint AND NOT identity_aliases.erased",
            vec![
                Box::new(space_id.to_owned()),
                Box::new(alias.to_owned()),
                Box::new(change.contact_id.clone()),
                Box::new(revision),
            ],
            AppendError::Conflict { code: REVISION_MOVED, message: String::new() },
        ),
        Guard::exactly_one(
            "INSERT INTO identity_capacity AS c (space_id, aliases, changes)
             SELECT $1::text, $2::bigint, 1 WHERE $2::bigint <= $3::bigint AND 1 <= $4::bigint
             ON CONFLICT (space_id) DO UPDATE SET aliases = c.aliases + $2::bigint, changes = c.changes + 1
             WHERE c.aliases + $2::bigint <= $3::bigint AND c.changes + 1 <= $4::bigint",
            vec![
                Box::new(space_id.to_owned()),
                Box::new(new_alias),
                Box::new(capacity.aliases),
                Box::new(capacity.changes),
            ],
            AppendError::Conflict { code: CAPACITY, message: String::new() },
        ),
    ];
    if let Some(contact_id) = &change.contact_id {
        guards.push(subjects_guard(vec![contact_id.clone()]));
    }
    guards
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    fn valid() -> Value {
        json!({
            "sourceId": "src_web", "subjectSchemaId": "sch_1", "anonymousId": "anon-1", "contactId": "con_1",
            "operationId": "0192f3a4-1111-7000-8000-000000000001", "expectedAliasRevision": "0"
        })
    }

    #[test]
    fn exactly_the_six_fields_are_accepted() {
        let change = parse_change(body(valid())).expect("valid");
        assert_eq!(change.expected_revision, 0);
        assert_eq!(change.contact_id.as_deref(), Some("con_1"));
        let mut removal = valid();
        removal["contactId"] = Value::Null;
        assert_eq!(parse_change(body(removal)).expect("null removes").contact_id, None);
        let mut extra = valid();
        extra["note"] = json!("x");
        let error = parse_change(body(extra)).expect_err("unknown field");
        assert_eq!(error.code(), Some(Code::InvalidIdentityChange));
        for key in FIELDS {
            let mut missing = valid();
            missing.as_object_mut().map(|o| o.remove(key));
            assert!(parse_change(body(missing)).is_err(), "{key} is required");
        }
    }

    #[test]
    fn revisions_are_decimal_strings_and_operation_ids_uuids() {
        for (key, value) in [
            ("expectedAliasRevision", json!(0)),
            ("expectedAliasRevision", json!("-1")),
            ("expectedAliasRevision", json!("1.5")),
            ("expectedAliasRevision", json!("+1")),
            ("operationId", json!("op-1")),
            ("contactId", json!(5)),
            ("anonymousId", json!("")),
        ] {
            let mut changed = valid();
            changed[key] = value.clone();
            assert!(parse_change(body(changed)).is_err(), "{key} = {value}");
        }
        let mut later = valid();
        later["expectedAliasRevision"] = json!("12");
        assert_eq!(parse_change(body(later)).expect("valid").expected_revision, 12);
    }
}
