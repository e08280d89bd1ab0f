//! `POST /segments` and `DELETE /segments/{id}`.
//!
//! A create reads the space's vocabulary (contact attributes, event schemas, topics) and its
//! credits from the catalog in one statement, has the AI provider turn the definition into a
//! filter once, resolves the filter's names to ids, and appends `SegmentCreated` with the
//! credit it spent. The filter is stored in the log and never returned; its description is.

use std::cell::OnceCell;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use ai_provider::AiError;
use api::auth::{Caller, Permission};
use api::ratelimit::Bucket;
use filter::Filter;
use platform::error::{ApiError, Code};
use platform::events::LogEvent;
use platform::ids::new_id;
use platform::log::{ExpectedVersion, StreamAppend};
use platform::proto;
use serde_json::{Value, json};

use super::decide::{self, NewSegment, Vocabulary};
use super::store::{load, not_found, stream_id, vocabulary};
use crate::State;
use crate::pipeline::{self, Actor, Ctx, Decided, Decision, Given, Legacy, Protection};

/// `POST /segments`: the filter is made once per request (kept across attempts).
struct CreateSegment<'a> {
    caller: &'a Caller,
    new: NewSegment,
    filter: OnceCell<Filter>,
}

impl Legacy for CreateSegment<'_> {
    type Loaded = (Vocabulary, Filter);

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        let catalog = ctx.catalog().await?;
        let (vocabulary, credits) = vocabulary(&ctx.db().await?, &catalog, self.caller.space_id())
            .await
            .map_err(|error| ApiError::internal(&error))?;
        if credits <= 0 {
            return Err(ApiError::new(
                StatusCode::PAYMENT_REQUIRED,
                Some(Code::InsufficientCredits),
                "the space has no AI credits left; defining a segment needs one",
            ));
        }
        if let Some(filter) = self.filter.get() {
            return Ok((vocabulary, filter.clone()));
        }
        let filter = match ctx.state.ai.filter(&self.new.definition).await {
            Ok(filter) => filter,
            Err(AiError::Refused(reason) | AiError::Unfit(reason)) => {
                return Err(decide::Refusal::Unusable(reason).into());
            }
            Err(error) => {
                return Err(ApiError::unavailable(format!("{error}; retry with the same Idempotency-Key")));
            }
        };
        Ok((vocabulary, self.filter.get_or_init(|| filter).clone()))
    }

    fn decide(&self, (vocabulary, filter): Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let space_id = self.caller.space_id();
        let description = filter::describe(&filter);
        let resolved = decide::resolve(filter, &vocabulary)?;
        let segment_id = new_id("seg");
        let event = LogEvent::SegmentCreated(proto::SegmentCreated {
            segment_id: segment_id.clone(),
            space_id: space_id.to_owned(),
            name: self.new.name.clone(),
            definition: self.new.definition.clone(),
            description: description.clone(),
            filter_json: resolved.to_json().to_string(),
            created_at_ms: given.now_ms,
        });
        // Membership is computed by the projector; a read with the Consistency-Token of
        // this answer shows it.
        let document = json!({
            "id": segment_id,
            "name": self.new.name,
            "definition": self.new.definition,
            "description": description,
            "createdAt": platform::time::format_millis(given.now_ms),
            "memberCount": null,
        });
        let body = api::http::data_body(document, &[]);
        let stream = StreamAppend::one(stream_id(&segment_id), ExpectedVersion::NoStream, event, given.now_ms);
        let guards = vec![domain::admission::spend_guard(space_id, 1)];
        Ok(Decided::Append(Decision::one(stream, guards, StatusCode::CREATED, body)))
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
    let command = CreateSegment { caller: &caller, new, filter: OnceCell::new() };
    let body = Value::Object(body);
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&body), command).await
}

/// `DELETE /segments/{id}`.
struct DeleteSegment<'a> {
    caller: &'a Caller,
    segment_id: String,
}

impl Legacy for DeleteSegment<'_> {
    type Loaded = Option<(i64, String)>;

    async fn load(&self, ctx: &Ctx<'_>) -> Result<Self::Loaded, ApiError> {
        load(&ctx.db().await?, &self.segment_id).await.map_err(|error| ApiError::internal(&error))
    }

    fn decide(&self, loaded: Self::Loaded, given: &Given<'_>) -> Result<Decided, ApiError> {
        let (space_id, segment_id) = (self.caller.space_id(), self.segment_id.as_str());
        // A concurrent delete that won leaves this one to find the segment gone: 404.
        let version = match loaded {
            Some((version, owner)) if owner == space_id => version,
            _ => return Err(not_found(segment_id)),
        };
        let body = api::http::data_body(json!({"id": segment_id, "deleted": true}), &[]);
        let event = LogEvent::SegmentDeleted(proto::SegmentDeleted {
            segment_id: segment_id.to_owned(),
            space_id: space_id.to_owned(),
            deleted_at_ms: given.now_ms,
        });
        let stream = StreamAppend::one(stream_id(segment_id), ExpectedVersion::Exactly(version), event, given.now_ms);
        Ok(Decided::Append(Decision::one(stream, Vec::new(), StatusCode::OK, body)))
    }
}

#[tracing::instrument(skip_all, fields(segment = %path.as_str()))]
pub async fn delete(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = pipeline::authorize(&req, &state, Permission::Write).await?;
    let command = DeleteSegment { caller: &caller, segment_id: path.into_inner() };
    pipeline::execute(&state, &req, Actor::Key(&caller), Protection::Keyed(&Value::Null), command).await
}
