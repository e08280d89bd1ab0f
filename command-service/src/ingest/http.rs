//! The Segment HTTP Tracking API at the service's host: `POST /v1/batch` (what Segment's and
//! RudderStack's SDKs post) and the single-message paths `/v1/identify`, `/v1/track`,
//! `/v1/page`, `/v1/screen`, `/v1/group` and `/v1/alias`. The edge here: the write key, the
//! body (JSON, plain or gzip, at most 500 KB decoded, each message at most 32 KB), each
//! message read; then `run` applies them and the answer says what became of each.

use std::io::Read;

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use api::ratelimit::Bucket;
use domain::ingest::{Kind, MAX_BATCH_BYTES, MAX_MESSAGE_BYTES};
use futures_util::StreamExt;
use platform::error::ApiError;
use serde_json::{Value, json};

use super::decide::Intake;
use super::keys::basic_key;
use super::run;
use crate::State;

/// `POST /v1/batch`.
pub async fn batch(req: HttpRequest, payload: web::Payload, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    receive(req, payload, state, None).await
}

pub async fn identify(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    receive(req, payload, state, Some(Kind::Identify)).await
}

pub async fn track(req: HttpRequest, payload: web::Payload, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    receive(req, payload, state, Some(Kind::Track)).await
}

pub async fn page(req: HttpRequest, payload: web::Payload, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    receive(req, payload, state, Some(Kind::Page)).await
}

pub async fn screen(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    receive(req, payload, state, Some(Kind::Screen)).await
}

pub async fn group(req: HttpRequest, payload: web::Payload, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    receive(req, payload, state, Some(Kind::Group)).await
}

pub async fn alias(req: HttpRequest, payload: web::Payload, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    receive(req, payload, state, Some(Kind::Alias)).await
}

#[tracing::instrument(skip_all, fields(path = %req.path()))]
async fn receive(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
    path_kind: Option<Kind>,
) -> Result<HttpResponse, ApiError> {
    let presented = basic_key(req.headers().get(header::AUTHORIZATION).and_then(|value| value.to_str().ok()));
    // Counted before anything else is read, by the key's hash (or the client's address).
    let subject = match &presented {
        Some(key) => format!("ingest:{}", platform::ids::sha256_hex(key)),
        None => format!("ingest-ip:{}", req.peer_addr().map(|addr| addr.ip().to_string()).unwrap_or_default()),
    };
    state.authenticator.count(Bucket::Ingest, &subject).await?;
    let body = decoded_body(&req, payload).await?;
    let value: Value = serde_json::from_slice(&body).map_err(|error| Intake::NotJson(format!("JSON: {error}")))?;
    drop(body);
    platform::storable::reject(platform::storable::json_issues(&value))?;
    let presented =
        presented.or_else(|| value.get("writeKey").and_then(Value::as_str).map(str::to_owned)).ok_or(Intake::NoKey)?;
    let key = state.write_keys.find(&state, &presented).await?.ok_or(Intake::UnknownKey)?;
    let items = items_of(value, path_kind)?;
    let kinds: Vec<Option<Kind>> = items.iter().map(|item| domain::ingest::kind_of(item, path_kind)).collect();
    for (index, (item, kind)) in items.iter().zip(&kinds).enumerate() {
        if kind.is_none() {
            return Err(Intake::NoType(index).into());
        }
        if serde_json::to_vec(item).map_or(usize::MAX, |bytes| bytes.len()) > MAX_MESSAGE_BYTES {
            return Err(Intake::MessageTooLarge { index, limit: MAX_MESSAGE_BYTES }.into());
        }
    }
    let messages: Vec<_> = items
        .iter()
        .zip(&kinds)
        .map(|(item, kind)| {
            let kind = kind.unwrap_or(Kind::Track);
            domain::ingest::read(kind, item, || uuid::Uuid::new_v4().to_string())
        })
        .collect();
    // A single message that cannot be read is the request's own fault: refused whole. In a
    // batch it is one message among others: kept, and listed in the answer's failures.
    if path_kind.is_some()
        && let Some(Err(refused)) = messages.first()
    {
        return Err(Intake::Unreadable(refused.clone()).into());
    }
    let report = run::apply(&state, &req, key.clone(), messages).await?;
    run::record_refusals(&state, &req, &key, &report.refused, &items, &kinds).await?;
    if let Some(later) = report.later {
        // Some messages were not admitted now: the client sends the batch again, and what
        // was applied is not applied twice (a track's eventId is its messageId).
        return Err(later);
    }
    let body = json!({
        "success": true,
        "data": {
            "messages": items.len(),
            "applied": report.applied,
            "failed": report.refused.len(),
            "failures": run::failures_json(&report.refused, &items),
        }
    });
    Ok(HttpResponse::Ok().json(body))
}

/// The request's messages: a batch's `batch`, or a single message's body.
fn items_of(value: Value, path_kind: Option<Kind>) -> Result<Vec<Value>, Intake> {
    let Value::Object(mut body) = value else {
        return Err(Intake::Shape("the request body must be a JSON object".to_owned()));
    };
    // The request's own fields are held to their types (a message's are read per message).
    if body.get("writeKey").is_some_and(|key| !key.is_string()) {
        return Err(Intake::Shape("writeKey must be a string: the write key".to_owned()));
    }
    // The key is never kept with a message (a message that is not applied is listed as sent,
    // to anyone who may read the space): browsers send it in each message's body.
    body.remove("writeKey");
    if path_kind.is_some() {
        return Ok(vec![Value::Object(body)]);
    }
    if body.get("sentAt").is_some_and(|sent| !sent.is_string()) {
        return Err(Intake::Shape("sentAt must be a string: when the batch was sent (ISO 8601)".to_owned()));
    }
    if body.get("context").is_some_and(|context| !context.is_object()) {
        return Err(Intake::Shape("context must be an object".to_owned()));
    }
    match body.remove("batch") {
        Some(Value::Array(mut items)) => {
            for item in &mut items {
                if let Value::Object(message) = item {
                    message.remove("writeKey");
                }
            }
            Ok(items)
        }
        Some(_) => Err(Intake::Shape("batch must be an array of messages".to_owned())),
        None => Err(Intake::Shape("batch is required: an array of messages (identify, track, page, ...)".to_owned())),
    }
}

/// The body, read up to [`MAX_BATCH_BYTES`] and decoded when it is gzip (up to the same
/// bound decoded: a small compressed body that would unfold to gigabytes is refused at the
/// bound).
async fn decoded_body(req: &HttpRequest, mut payload: web::Payload) -> Result<Vec<u8>, ApiError> {
    let too_large = || Intake::TooLarge { limit: MAX_BATCH_BYTES };
    let mut wire = Vec::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|error| Intake::Shape(format!("the request body could not be read: {error}")))?;
        if wire.len() + chunk.len() > MAX_BATCH_BYTES {
            return Err(too_large().into());
        }
        wire.extend_from_slice(&chunk);
    }
    let encoding = req.headers().get(header::CONTENT_ENCODING).and_then(|value| value.to_str().ok()).unwrap_or("");
    match encoding.trim().to_ascii_lowercase().as_str() {
        "" | "identity" => Ok(wire),
        "gzip" | "x-gzip" => {
            let mut decoded = Vec::new();
            let limit = u64::try_from(MAX_BATCH_BYTES).unwrap_or(u64::MAX) + 1;
            flate2::read::GzDecoder::new(wire.as_slice())
                .take(limit)
                .read_to_end(&mut decoded)
                .map_err(|error| Intake::Shape(format!("the gzip body could not be decoded: {error}")))?;
            if decoded.len() > MAX_BATCH_BYTES {
                return Err(too_large().into());
            }
            Ok(decoded)
        }
        other => Err(Intake::Encoding(other.to_owned()).into()),
    }
}
