//! `PATCH /broadcasts/{id}` and `POST /broadcasts/{id}/send`.
//!
//! Both decide against the broadcast as the `broadcasts` read model holds it (waiting for the
//! caller's last write). While a run is scheduled or sending, an update is refused, and so is
//! another send (409 `broadcast_run_active`): each append carries a guard that holds this even
//! against a concurrent request.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use deadpool_postgres::GenericClient;
use serde_json::{Value, json};
use shared::auth::{Caller, Permission};
use shared::catalog::CATALOG;
use shared::email::broadcasts::{apply_update, document, stream_id};
use shared::email::resources::{Audience, BroadcastDef};
use shared::error::{ApiError, Code};
use shared::events::LogEvent;
use shared::log::{AppendError, ExpectedVersion, Guard, StreamAppend};
use shared::proto;

use super::decide;
use crate::State;
use crate::edge::{append_error, respond};
use crate::idempotency;

const BROADCASTS: &str = "broadcasts";
/// The timer kind that starts a run (the projector's broadcast engine).
pub const RUN_TIMER: &str = "broadcast_runs";

fn active() -> ApiError {
    ApiError::conflict(
        Code::BroadcastRunActive,
        "a run of this broadcast is scheduled or sending; wait until it has completed",
    )
}

/// The broadcast of the caller's space, as the read model holds it; 404 otherwise.
async fn load(state: &State, caller: &Caller, broadcast_id: &str) -> Result<BroadcastDef, ApiError> {
    let models = state.read_models.wait_for(&[BROADCASTS, CATALOG], 0, state.settings.consistency_wait()).await?;
    let client = state.pool.get().await?;
    let statement = client
        .prepare_cached(&format!(
            "SELECT definition FROM {}.broadcasts WHERE space_id = $1 AND broadcast_id = $2",
            models.schema(BROADCASTS)
        ))
        .await?;
    let row = client.query_opt(&statement, &[&caller.space_id(), &broadcast_id]).await?;
    let Some(row) = row else {
        return Err(ApiError::not_found(
            Code::BroadcastNotFound,
            format!("no broadcast {broadcast_id:?} in this space"),
        ));
    };
    serde_json::from_value(row.get(0)).map_err(|error| ApiError::internal(&error.into()))
}

/// Whether a run of the broadcast is scheduled or sending.
async fn has_active_run(client: &impl GenericClient, broadcast_id: &str) -> Result<bool, ApiError> {
    let statement = client
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM broadcast_runs WHERE broadcast_id = $1 AND status IN ('scheduled', 'sending'))",
        )
        .await?;
    Ok(client.query_one(&statement, &[&broadcast_id]).await?.get(0))
}

/// 404 unless the audience names a segment or topic of the caller's space.
async fn check_audience(state: &State, caller: &Caller, audience: &Audience) -> Result<(), ApiError> {
    let client = state.pool.get().await?;
    match audience {
        Audience::Segment { segment_id } => {
            crate::segments::http::load_live(&client, caller.space_id(), segment_id).await?;
        }
        Audience::Topic { topic_id } => {
            let models = state.read_models.wait_for(&[CATALOG], 0, state.settings.consistency_wait()).await?;
            let found = shared::catalog::resource_by_id(&client, &models.schema(CATALOG), "topic", topic_id).await?;
            if found.is_none_or(|(space_id, _, _)| space_id != caller.space_id()) {
                return Err(ApiError::not_found(Code::TopicNotFound, format!("no topic {topic_id:?} in this space")));
            }
        }
    }
    Ok(())
}

/// Refuses the append while a run is scheduled or sending (a concurrent send included).
fn no_active_run(broadcast_id: &str) -> Guard {
    Guard::exactly_one(
        "SELECT 1 WHERE NOT EXISTS (
             SELECT 1 FROM broadcast_runs WHERE broadcast_id = $1 AND status IN ('scheduled', 'sending'))",
        vec![Box::new(broadcast_id.to_owned())],
        AppendError::Conflict { code: Code::BroadcastRunActive, message: "a run is scheduled or sending".to_owned() },
    )
}

fn one_event(broadcast_id: &str, event: LogEvent, now: i64) -> StreamAppend {
    StreamAppend::one(stream_id(broadcast_id), ExpectedVersion::Any, event, now)
}

fn conflict_or(error: AppendError) -> ApiError {
    match error {
        AppendError::Conflict { code: Code::BroadcastRunActive, .. } => active(),
        error => append_error(error),
    }
}

#[tracing::instrument(skip_all, fields(broadcast = %path.as_str()))]
pub async fn update(
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let body = shared::http::read_json_object(&req, payload).await;
    let caller = state.authenticator.authorize(&req, Permission::Write).await?;
    let body = body?;
    let update = decide::parse_update(&body)?;
    let (req, state, caller, broadcast_id, update) = (&req, &**state, &caller, path.as_str(), &update);
    idempotency::protect(state, req, caller, &Value::Object(body), |claim, operation_id| async move {
        let current = load(state, caller, broadcast_id).await?;
        if has_active_run(&state.pool.get().await?, broadcast_id).await? {
            return Err(active());
        }
        if let Some(audience) = &update.audience {
            check_audience(state, caller, audience).await?;
        }
        let now = shared::time::now_millis();
        let event = proto::BroadcastUpdated {
            broadcast_id: broadcast_id.to_owned(),
            space_id: caller.space_id().to_owned(),
            name: update.name.clone(),
            audience: update.audience.as_ref().map(Audience::to_proto),
            scheduled_at_set: update.scheduled_at_ms.is_some(),
            scheduled_at_ms: update.scheduled_at_ms.flatten().unwrap_or(0),
            updated_at_ms: now,
        };
        let next = apply_update(current, &event);
        let body = shared::http::data_body(document(broadcast_id, &next, now), &[]);
        let guards = std::iter::once(no_active_run(broadcast_id))
            .chain(claim.as_ref().map(|claim| claim.completion(StatusCode::OK, &body)))
            .collect();
        let stream = one_event(broadcast_id, LogEvent::BroadcastUpdated(event), now);
        let appended =
            crate::edge::append(state, req, caller, claim.as_ref(), vec![stream], guards).await.map_err(conflict_or)?;
        Ok(respond(StatusCode::OK, &body, &operation_id, Some(appended)))
    })
    .await
}

/// A run as the API shows it when it was just requested.
fn requested_run(run: &proto::BroadcastRunRequested, audience: &Audience) -> Value {
    json!({
        "id": run.run_id,
        "broadcastId": run.broadcast_id,
        "status": "scheduled",
        "templateId": run.template_id,
        "senderId": Some(&run.sender_id).filter(|id| !id.is_empty()),
        "audience": audience,
        "startAt": shared::time::format_millis(run.start_at_ms),
        "requestedAt": shared::time::format_millis(run.requested_at_ms),
        "startedAt": null,
        "finishedAt": null,
        "error": null,
        "counts": {"audience": null, "pending": 0, "queued": 0, "sent": 0, "failed": 0, "outcomeUnknown": 0,
                   "skipped": {"notSubscribed": 0, "suppressed": 0, "allowance": 0, "noAddress": 0, "gone": 0}},
    })
}

#[tracing::instrument(skip_all, fields(broadcast = %path.as_str()))]
pub async fn send(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let caller = state.authenticator.authorize(&req, Permission::Write).await?;
    let (req, state, caller, broadcast_id) = (&req, &**state, &caller, path.as_str());
    idempotency::protect(state, req, caller, &Value::Null, |claim, operation_id| async move {
        let broadcast = load(state, caller, broadcast_id).await?;
        if has_active_run(&state.pool.get().await?, broadcast_id).await? {
            return Err(active());
        }
        check_audience(state, caller, &broadcast.audience).await?;
        let now = shared::time::now_millis();
        let run = proto::BroadcastRunRequested {
            run_id: shared::ids::new_id("run"),
            broadcast_id: broadcast_id.to_owned(),
            space_id: caller.space_id().to_owned(),
            template_id: broadcast.template_id.clone(),
            sender_id: broadcast.sender_id.clone().unwrap_or_default(),
            audience: Some(broadcast.audience.to_proto()),
            start_at_ms: decide::start_at(broadcast.scheduled_at_ms, now),
            requested_at_ms: now,
        };
        let body = shared::http::data_body(requested_run(&run, &broadcast.audience), &[]);
        let audience = serde_json::to_value(&broadcast.audience).map_err(|error| ApiError::internal(&error.into()))?;
        let start_at = shared::time::from_millis(run.start_at_ms);
        let guards = vec![
            Guard::unique(
                "INSERT INTO broadcast_runs
                     (run_id, broadcast_id, space_id, template_id, sender_id, audience, start_at, requested_at)
                 VALUES ($1, $2, $3, $4, NULLIF($5, ''), $6, $7, $8)",
                vec![
                    Box::new(run.run_id.clone()),
                    Box::new(run.broadcast_id.clone()),
                    Box::new(run.space_id.clone()),
                    Box::new(run.template_id.clone()),
                    Box::new(run.sender_id.clone()),
                    Box::new(audience),
                    Box::new(start_at),
                    Box::new(shared::time::from_millis(now)),
                ],
                AppendError::Conflict {
                    code: Code::BroadcastRunActive,
                    message: "a run is scheduled or sending".to_owned(),
                },
            ),
            Guard::exactly_one(
                "INSERT INTO timers (kind, key, due_at, payload) VALUES ($1, $2, $3, jsonb_build_object('runId', $2::text))",
                vec![Box::new(RUN_TIMER), Box::new(run.run_id.clone()), Box::new(start_at)],
                AppendError::Failed("could not schedule the run".to_owned()),
            ),
        ];
        let guards = guards
            .into_iter()
            .chain(claim.as_ref().map(|claim| claim.completion(StatusCode::ACCEPTED, &body)))
            .collect();
        let stream = one_event(broadcast_id, LogEvent::BroadcastRunRequested(run), now);
        let appended = crate::edge::append(state, req, caller, claim.as_ref(), vec![stream], guards)
            .await
            .map_err(conflict_or)?;
        Ok(respond(StatusCode::ACCEPTED, &body, &operation_id, Some(appended)))
    })
    .await
}
