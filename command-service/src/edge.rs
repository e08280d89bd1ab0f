//! What every write handler shares at the HTTP edge: the log metadata of a request and the
//! contract's answer to a failed append.

use actix_web::HttpRequest;
use shared::auth::Caller;
use shared::error::ApiError;
use shared::error::Code;
use shared::log::{AppendError, Metadata};

/// The log metadata of a write by `caller`.
pub fn metadata(req: &HttpRequest, caller: &Caller, idempotency_key: Option<String>) -> Metadata {
    Metadata {
        space_id: Some(caller.space_id().to_owned()),
        actor_key_id: Some(caller.key_id().to_owned()),
        actor_user_id: Some(caller.identity.user_id.clone()),
        request_id: Some(shared::http::request_id(req)),
        idempotency_key,
    }
}

/// Turns a failed append into the contract's answer.
pub fn append_error(error: AppendError) -> ApiError {
    match error {
        // A guard's internal label must have been translated by its handler.
        AppendError::Conflict { code, message } if code.is_internal() => {
            ApiError::internal(&anyhow::anyhow!("an untranslated guard refusal {code}: {message}"))
        }
        AppendError::Conflict { code, message } => ApiError::conflict(code, message),
        AppendError::WrongVersion { stream_id } => ApiError::conflict(
            Code::ConcurrentModification,
            format!("{stream_id} was changed by another request at the same time; retry"),
        ),
        AppendError::Unavailable(message) => {
            tracing::error!(%message, "append failed");
            ApiError::unavailable("the write could not be stored; nothing was written, retry")
        }
        AppendError::Refused(message) => ApiError::value_not_storable(&message),
        AppendError::Failed(message) => ApiError::internal(&anyhow::anyhow!(message)),
        AppendError::OutcomeUnknown(message) => {
            tracing::error!(%message, "append outcome unknown");
            ApiError::new(
                actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
                Some(Code::OutcomeUnknown),
                "the write may or may not have been stored; inspect the resource before retrying",
            )
        }
    }
}
