//! Suppression writes (admin permission), on the command pipeline: create, batch create,
//! batch remove, delete. The decisions are in [`super::decide`].

use std::collections::HashMap;

use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::Permission;
use domain::suppressions::scope;
use platform::error::ApiError;
use platform::error::Code;
use platform::log::AppendError;
use platform::proto::SuppressionAdded;
use serde_json::{Value, json};

use crate::State;
use crate::decision::{Outcome, Reply};
use crate::pipeline::{self, Actor, Command, Ctx, Decided, Protection, Refusal as Lost, Shell};
use crate::suppressions::decide::{
    Batch, BatchCreate, BatchRemove, CreateSuppression, Current, DeleteSuppression, Existing, Item, NewSuppression,
    Refusal, batch_items, parse_new,
};
use crate::suppressions::store::{existing_keys, load, load_many};

/// The subject of an identifier (a keyed digest, so the same address is one subject).
fn subject(identifier: &str) -> Result<String, ApiError> {
    platform::crypto::email_subject(identifier).map_err(ApiError::from)
}

/// A batch's answer: per-item results and the summary counting items by the given statuses,
/// every other status counted as failed.
fn batch_answer(Batch { streams, guards, items }: Batch, counted: &[&str]) -> Decided {
    let results: Vec<Value> = items
        .into_iter()
        .enumerate()
        .map(|(index, item)| match item {
            Item::Created(document) => json!({"index": index, "status": "created", "suppression": document}),
            Item::Exists => json!({"index": index, "status": "exists"}),
            Item::Removed(id) => json!({"index": index, "id": id, "status": "removed"}),
            Item::Refused { id: None, refusal } => {
                json!({"index": index, "status": "invalid", "error": ApiError::from(refusal).body()["error"]})
            }
            Item::Refused { id: Some(id), refusal } => {
                let status = match refusal {
                    Refusal::NotFound(_) => "not_found",
                    Refusal::NotRemovable => "not_removable",
                    _ => "failed",
                };
                json!({"index": index, "id": id, "status": status, "error": ApiError::from(refusal).body()["error"]})
            }
        })
        .collect();
    let mut summary = serde_json::Map::new();
    for status in counted {
        let count = results.iter().filter(|result| result["status"] == *status).count();
        summary.insert((*status).to_owned(), json!(count));
    }
    let failed = results.iter().filter(|result| !counted.iter().any(|s| result["status"] == *s)).count();
    summary.insert("failed".to_owned(), json!(failed));
    let reply = Reply::ok(json!({ "results": results, "summary": summary }));
    Outcome::batch(streams, guards, reply).into()
}

/// A batch whose decision lost a race (a concurrent add or removal) is decided again.
fn batch_refused(error: AppendError) -> Lost {
    match error {
        AppendError::Conflict { code: Code::SuppressionAlreadyExists | Code::SuppressionNotFound, .. } => Lost::Again,
        error => Lost::default_for(error),
    }
}

fn lost_too_often() -> ApiError {
    Refusal::KeptChanging.into()
}

impl Command for CreateSuppression {
    async fn load(&self, _: &Ctx<'_>) -> Result<String, ApiError> {
        subject(&self.new.identifier)
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }
}

/// `POST /contacts/suppressions`: no idempotency; 409 `suppression_already_exists` from the
/// append's guard.
pub async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Admin).await?;
    let body = api::http::read_json(&req, payload).await?;
    let command = CreateSuppression { space_id: caller.space_id().into(), new: parse_new(&body)? };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Unkeyed, command).await
}

impl Command for BatchCreate {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Existing, ApiError> {
        let wanted: Vec<&NewSuppression> = self.parsed.iter().filter_map(|item| item.as_ref().ok()).collect();
        let keys = existing_keys(&ctx.db().await?, scope(&self.space_id), &wanted).await?;
        let mut subjects = HashMap::new();
        for new in wanted {
            subjects.insert(new.identifier.clone(), subject(&new.identifier)?);
        }
        Ok(Existing { keys, subjects })
    }

    fn answer(&self, batch: Batch, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(batch_answer(batch, &["created", "exists"]))
    }

    fn refused(&self, error: AppendError) -> Lost {
        batch_refused(error)
    }

    fn lost_too_often(&self) -> ApiError {
        lost_too_often()
    }
}

/// `POST /contacts/suppressions/batch`: per-item results, always 200, appended in one
/// transaction (with the idempotency outcome, when keyed).
pub(crate) async fn batch_create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Admin).await?;
    let body = api::http::read_json(&req, payload).await?;
    let items = batch_items(&body, "suppressions")?;
    let parsed = items.iter().map(parse_new).collect();
    let command = BatchCreate { space_id: caller.space_id().into(), parsed };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

/// A loaded suppression with its identifier's subject.
fn current((version, added): (i64, SuppressionAdded)) -> Result<Current, ApiError> {
    let subject_id = super::subject_of(&added).map_err(ApiError::from)?;
    Ok(Current { version, added, subject_id })
}

impl Command for BatchRemove {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let loaded = load_many(&ctx.db().await?, &self.ids()).await.map_err(ApiError::from)?;
        loaded.into_iter().map(|(id, loaded)| Ok((id, current(loaded)?))).collect()
    }

    fn answer(&self, batch: Batch, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(batch_answer(batch, &["removed"]))
    }

    fn refused(&self, error: AppendError) -> Lost {
        batch_refused(error)
    }

    fn lost_too_often(&self) -> ApiError {
        lost_too_often()
    }
}

/// `POST /contacts/suppressions/batch-remove`: per-id results, always 200, appended in one
/// transaction (with the idempotency outcome, when keyed).
pub(crate) async fn batch_remove(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Admin).await?;
    let body = api::http::read_json(&req, payload).await?;
    let items = batch_items(&body, "ids")?;
    let command = BatchRemove { space_id: caller.space_id().into(), items };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

impl Command for DeleteSuppression {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let loaded = load(&ctx.db().await?, &self.suppression_id).await.map_err(ApiError::from)?;
        loaded.map(current).transpose()
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }
}

/// `DELETE /contacts/suppressions/{id}` (honours `Idempotency-Key`): 404 when gone.
pub async fn delete(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Admin).await?;
    // The path is the whole input: the body identity of a DELETE is empty.
    let command = DeleteSuppression { space_id: caller.space_id().into(), suppression_id: path.into_inner() };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&Value::Null), command).await
}
