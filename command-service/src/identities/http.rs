//! `POST /event-identities`: binds an anonymous identity (an alias: a browser identity in a
//! contact track's source) to a contact, or removes the binding.
//!
//! Each alias is its own log stream (`alias/{space}/{digest}`) whose version is the alias
//! revision, so `expectedAliasRevision` is an optimistic concurrency check on that stream.
//! The anonymous id never reaches the database: the alias is named by a keyed digest. An
//! operation is recorded with its result in the same transaction as its event, so the same
//! `operationId` with the same body replays the result and a changed body is refused.

use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::{Caller, Permission};
use platform::error::{ApiError, Code};
use platform::events::LogEvent;
use platform::log::{AppendError, ExpectedVersion, NewEvent, StreamAppend};
use serde_json::json;

use super::decide::{Alias, Change, Contact, Decision as Outcome, Given as Facts, Recorded, decide, parse_change};
use super::store::{self, CAPACITY, OPERATION_TAKEN, REVISION_MOVED};
use crate::State;
use crate::events::store::SUBJECT_DELETING;
use crate::pipeline::{self, Actor, Answer, Ctx, Decided, Decision, Given, Legacy, Protection, Refusal};

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

struct ChangeIdentity<'a> {
    caller: &'a Caller,
    change: Change,
    /// The keyed digest of the change's body (a replay of the operationId has the same).
    body_digest: String,
    /// The keyed digest naming the alias.
    alias: String,
    capacity: platform::settings::IdentityCapacity,
}

impl Legacy for ChangeIdentity<'_> {
    type Loaded = (Option<Recorded>, Alias, Option<Contact>);

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let (space_id, change) = (self.caller.space_id(), &self.change);
        // 403 unless an enabled contact track of the space has the source and uses the schema.
        let catalog = ctx.catalog().await?;
        let client = ctx.db().await?;
        let schemas = store::track_schemas(&client, &catalog, space_id, &change.source_id).await?;
        if !schemas.contains(&change.subject_schema_id) {
            return Err(source_unavailable(&change.source_id));
        }
        let recorded = store::load_operation(&client, space_id, &change.operation_id).await?;
        let alias = store::load_alias(&client, space_id, &self.alias).await?;
        let contact = match &change.contact_id {
            Some(contact_id) if recorded.is_none() => Some(store::load_contact(&client, contact_id).await?),
            _ => None,
        };
        Ok((recorded, alias, contact))
    }

    fn decide(&self, (recorded, alias, contact): Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let (space_id, change) = (self.caller.space_id(), &self.change);
        let previous = alias.contact_id.clone();
        let facts = Facts {
            space_id,
            alias_digest: &self.alias,
            body_digest: &self.body_digest,
            recorded,
            alias,
            contact,
            now_ms: given.now_ms,
        };
        let (event, result, revision) = match decide(change, facts)? {
            Outcome::Replay(result) => {
                return Ok(Decided::Answer(Answer::json(actix_web::http::StatusCode::OK, json!({ "data": result }))));
            }
            Outcome::Change { event, result, expected_revision } => (event, result, expected_revision),
        };
        let guards = store::guards(self.capacity, space_id, change, &self.alias, &self.body_digest, &result, revision);
        let stream = StreamAppend {
            stream_id: format!("alias/{space_id}/{}", self.alias),
            expected: if revision == 0 { ExpectedVersion::NoStream } else { ExpectedVersion::Exactly(revision) },
            events: vec![NewEvent {
                subject_id: change.contact_id.clone().or(previous),
                occurred_at: platform::time::from_millis(event.changed_at_ms),
                event: LogEvent::EventIdentityChanged(event),
            }],
        };
        let answer = Answer::json(actix_web::http::StatusCode::OK, json!({ "data": result }));
        Ok(Decided::Append(Decision::new(vec![stream], guards, answer)))
    }

    fn refused(&self, error: AppendError) -> Refusal {
        match error {
            // Another request under this operationId won, or the alias moved on: decide again.
            AppendError::Conflict { code: OPERATION_TAKEN | REVISION_MOVED, .. } => Refusal::Again,
            AppendError::Conflict { code: CAPACITY, .. } => Refusal::Fail(ApiError::new(
                actix_web::http::StatusCode::TOO_MANY_REQUESTS,
                Some(CAPACITY),
                format!(
                    "the space's identity capacity is exhausted ({} aliases, {} identity changes)",
                    self.capacity.aliases, self.capacity.changes
                ),
            )),
            AppendError::Conflict { code: SUBJECT_DELETING, .. } => {
                Refusal::Fail(ApiError::conflict(Code::RecordDeletionPending, "the contact is being deleted"))
            }
            error => Refusal::default_for(error),
        }
    }

    fn lost_too_often(&self) -> ApiError {
        ApiError::conflict(Code::ConcurrentModification, "the alias kept changing while this change was applied; retry")
    }
}

#[tracing::instrument(skip_all)]
pub async fn change(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let change = parse_change(api::http::read_json_object(&req, payload).await?)?;
    let body_digest = platform::crypto::keyed_digest(
        "identity-change",
        &crate::canonical::canonical_json(&json!([
            change.source_id,
            change.subject_schema_id,
            change.anonymous_id,
            change.contact_id,
            change.expected_revision
        ])),
    )?;
    let alias = platform::crypto::keyed_digest("alias", &format!("{}\0{}", change.source_id, change.anonymous_id))?;
    let command = ChangeIdentity { caller: &caller, change, body_digest, alias, capacity: state.settings.identity };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}
