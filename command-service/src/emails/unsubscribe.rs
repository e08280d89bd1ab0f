//! `POST /emails/{emailId}/unsubscribe`: one-click unsubscribe (RFC 8058, D6). Public: no API
//! key and no request limiter; the tenant is the email's. Mail clients post the form body
//! `List-Unsubscribe=One-Click`; any body (or none) is taken the same way.
//!
//! The recipient leaves the email's topic, or, for an email without a topic, withdraws the
//! marketing consent of the contact (its consent attributes for channel `email` set to
//! false, an ordinary record update that the audit trail shows). Idempotent: a second POST
//! answers the same and changes nothing. Afterwards marketing sends to the contact are
//! refused with `recipient_not_subscribed`. An unknown email is 404 `email_not_found`.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::json;
use shared::error::{ApiError, Code};
use shared::events::LogEvent;
use shared::log::{AppendError, ExpectedVersion, NewEvent, StreamAppend};
use shared::proto;

use super::consent::{Source, set_email_consent, subscription_changes};
use crate::State;

const ATTEMPTS: usize = 3;

/// What the email's stream says.
struct Email {
    version: i64,
    scheduled: proto::EmailScheduled,
    unsubscribed: bool,
}

async fn load(state: &State, email_id: &str) -> Result<Option<Email>, ApiError> {
    let client = state.pool.get().await?;
    let statement = client
        .prepare_cached(
            "SELECT stream_version, event_type, payload FROM events WHERE stream_id = $1 ORDER BY stream_version",
        )
        .await?;
    let rows = client.query(&statement, &[&shared::email::stream_id(email_id)]).await?;
    let mut found: Option<Email> = None;
    for row in rows {
        let event = LogEvent::decode(row.get(1), row.get(2)).map_err(|error| ApiError::internal(&error.into()))?;
        match (event, found.as_mut()) {
            (LogEvent::EmailScheduled(scheduled), _) => {
                found = Some(Email { version: row.get(0), scheduled, unsubscribed: false });
            }
            (LogEvent::EmailUnsubscribed(_), Some(email)) => {
                email.unsubscribed = true;
                email.version = row.get(0);
            }
            (_, Some(email)) => email.version = row.get(0),
            _ => {}
        }
    }
    Ok(found)
}

fn answer(email_id: &str, topic_id: &str, appended: Option<shared::log::Appended>) -> HttpResponse {
    let topic = (!topic_id.is_empty()).then_some(topic_id);
    let mut response = HttpResponse::build(StatusCode::OK);
    crate::edge::consistency_token(&mut response, appended);
    response.json(json!({ "data": {
        "emailId": email_id,
        "unsubscribed": true,
        "scope": if topic.is_some() { "topic" } else { "marketing" },
        "topicId": topic,
    }}))
}

#[tracing::instrument(skip_all, fields(email = %path.as_str()))]
pub async fn post(
    path: web::Path<String>,
    state: web::Data<State>,
    _req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let email_id = path.into_inner();
    if !shared::storable::is_storable(&email_id) || !email_id.starts_with("em_") {
        return Err(not_found(&email_id));
    }
    for _ in 0..ATTEMPTS {
        let Some(email) = load(&state, &email_id).await? else { return Err(not_found(&email_id)) };
        let scheduled = &email.scheduled;
        if email.unsubscribed {
            return Ok(answer(&email_id, &scheduled.topic_id, None));
        }
        let now = shared::time::now_millis();
        let mut streams = Vec::new();
        let mut guards = Vec::new();
        if scheduled.topic_id.is_empty() {
            if let Some(write) =
                set_email_consent(&state, &scheduled.space_id, &scheduled.contact_id, false, now).await?
            {
                streams.push(write.stream);
                guards.extend(write.guards);
            }
        } else {
            let topics = [&scheduled.topic_id];
            let source = Source { kind: "unsubscribe", id: &email_id };
            let parties = (scheduled.space_id.as_str(), scheduled.contact_id.as_str());
            streams.extend(subscription_changes(parties, &topics, "unsubscribed", source, now));
        }
        let unsubscribed = proto::EmailUnsubscribed {
            email_id: email_id.clone(),
            space_id: scheduled.space_id.clone(),
            contact_id: scheduled.contact_id.clone(),
            topic_id: scheduled.topic_id.clone(),
            at_ms: now,
        };
        streams.push(StreamAppend {
            stream_id: shared::email::stream_id(&email_id),
            expected: ExpectedVersion::Exactly(email.version),
            events: vec![NewEvent {
                event: LogEvent::EmailUnsubscribed(unsubscribed),
                subject_id: Some(scheduled.contact_id.clone()),
                occurred_at: shared::time::from_millis(now),
            }],
        });
        let appended = crate::edge::append_public(&state, &scheduled.space_id, streams, guards).await;
        match appended {
            Ok(appended) => return Ok(answer(&email_id, &scheduled.topic_id, Some(appended))),
            Err(AppendError::WrongVersion { .. }) => continue,
            Err(error) => return Err(crate::edge::append_error(error)),
        }
    }
    Err(ApiError::conflict(Code::ConcurrentModification, "the email's recipient kept changing; retry"))
}

fn not_found(email_id: &str) -> ApiError {
    ApiError::not_found(Code::EmailNotFound, format!("no email {email_id:?}"))
}
