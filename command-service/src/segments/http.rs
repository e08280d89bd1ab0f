//! `POST /segments` and `DELETE /segments/{id}`.
//!
//! A create reads the space's vocabulary (contact attributes, event schemas, topics) and its
//! credits from the catalog in one statement, has the AI provider turn the definition into a
//! filter once, resolves the filter's names to ids, and appends `SegmentCreated` with the
//! credit it spent. The filter is stored in the log and never returned; its description is.

use std::cell::OnceCell;

use actix_web::{HttpRequest, HttpResponse, web};
use ai_provider::AiError;
use api::auth::Permission;
use api::ratelimit::Bucket;
use platform::error::ApiError;
use serde_json::Value;

use super::decide::{self, CreateSegment, DeleteSegment, Refusal};
use super::store::{load, vocabulary};
use crate::State;
use crate::decision::Outcome;
use crate::pipeline::{self, Actor, Command, Ctx, Decided, Protection, Shell};

impl Command for CreateSegment {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let catalog = ctx.catalog().await?;
        let (vocabulary, credits) =
            vocabulary(&ctx.db().await?, &catalog, &self.space_id).await.map_err(ApiError::from)?;
        if credits <= 0 {
            return Err(Refusal::NoCredits.into());
        }
        if let Some(filter) = self.filter.get() {
            return Ok((vocabulary, filter.clone()));
        }
        let filter = match ctx.state.ai.filter(&self.new.definition).await {
            Ok(filter) => filter,
            Err(AiError::Refused(reason) | AiError::Unfit(reason)) => {
                return Err(Refusal::Unusable(reason).into());
            }
            Err(error) => {
                return Err(ApiError::unavailable(format!("{error}; retry with the same Idempotency-Key")));
            }
        };
        Ok((vocabulary, self.filter.get_or_init(|| filter).clone()))
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }
}

#[tracing::instrument(skip_all)]
pub async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (caller, body) =
        pipeline::authorize_with_body(&req, payload, &state, Permission::Write, |_| Bucket::Ai).await?;
    let new = decide::parse_create(&body)?;
    let command = CreateSegment { space_id: caller.space_id().into(), new, filter: OnceCell::new() };
    let body = Value::Object(body);
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

impl Command for DeleteSegment {
    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        load(&ctx.db().await?, &self.segment_id).await.map_err(ApiError::from)
    }

    fn answer(&self, outcome: Outcome, _: &Shell<'_>) -> Result<Decided, ApiError> {
        Ok(outcome.into())
    }
}

#[tracing::instrument(skip_all, fields(segment = %path.as_str()))]
pub async fn delete(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let command = DeleteSegment { space_id: caller.space_id().into(), segment_id: path.into_inner() };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&Value::Null), command).await
}
