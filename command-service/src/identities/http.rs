//! `POST /event-identities`: binds an anonymous identity (an alias: a browser identity in a
//! contact track's source) to a contact, or removes the binding.
//!
//! Each alias is its own log stream (`alias/{space}/{digest}`) whose version is the alias
//! revision, so `expectedAliasRevision` is an optimistic concurrency check on that stream.
//! The anonymous id never reaches the database: the alias is named by a keyed digest. An
//! operation is recorded with its result in the same transaction as its event, so the same
//! `operationId` with the same body replays the result and a changed body is refused. The
//! decision is in [`super::decide`].

use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::Permission;
use platform::error::ApiError;
use platform::log::AppendError;
use serde_json::json;

use super::decide::{Alias, ChangeIdentity, Contact, Recorded, Refusal, parse_change};
use super::store::{self, CAPACITY, OPERATION_TAKEN, REVISION_MOVED};
use crate::State;
use crate::decision::Outcome;
use crate::events::store::SUBJECT_DELETING;
use crate::pipeline::{self, Actor, Command, Ctx, Decided, Protection, Refusal as Lost, Shell};

impl Command for ChangeIdentity {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<(Option<Recorded>, Alias, Option<Contact>), ApiError> {
        let (space_id, change) = (self.space_id.as_str(), &self.change);
        // 403 unless an enabled contact track of the space has the source and uses the schema.
        let catalog = ctx.catalog().await?;
        let client = ctx.db().await?;
        let schemas = store::track_schemas(&client, &catalog, space_id, &change.source_id).await?;
        if !schemas.contains(&change.subject_schema_id) {
            return Err(Refusal::SourceUnavailable(change.source_id.clone()).into());
        }
        let recorded = store::load_operation(&client, space_id, &change.operation_id).await?;
        let alias = store::load_alias(&client, space_id, &self.alias).await?;
        let contact = match &change.contact_id {
            Some(contact_id) if recorded.is_none() => Some(store::load_contact(&client, contact_id).await?),
            _ => None,
        };
        Ok((recorded, alias, contact))
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }

    fn refused(&self, error: AppendError) -> Lost {
        match error {
            // Another request under this operationId won, or the alias moved on: decide again.
            AppendError::Conflict { code: OPERATION_TAKEN | REVISION_MOVED, .. } => Lost::Again,
            AppendError::Conflict { code: CAPACITY, .. } => Lost::Fail(
                Refusal::CapacityExhausted { aliases: self.capacity.aliases, changes: self.capacity.changes }.into(),
            ),
            AppendError::Conflict { code: SUBJECT_DELETING, .. } => Lost::Fail(Refusal::ContactBeingDeleted.into()),
            error => Lost::default_for(error),
        }
    }

    fn lost_too_often(&self) -> ApiError {
        Refusal::KeptChanging.into()
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
    let command = ChangeIdentity {
        space_id: caller.space_id().into(),
        change,
        body_digest,
        alias,
        capacity: state.settings.identity,
    };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}
