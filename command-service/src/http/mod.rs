//! The HTTP surface of the command service. Only this module knows actix-web.

pub mod records;
pub mod routes;
pub mod suppressions;

use shared::error::ApiError;
use shared::log::AppendError;

/// Turns a failed append into the contract's answer.
pub fn append_error(error: AppendError) -> ApiError {
    match error {
        AppendError::Conflict { code, message } => ApiError::conflict(code, message),
        AppendError::WrongVersion { stream_id } => ApiError::conflict(
            "concurrent_modification",
            format!("{stream_id} was changed by another request at the same time; retry"),
        ),
        AppendError::Unavailable(message) => {
            tracing::error!(%message, "append failed");
            ApiError::unavailable("the write could not be stored; nothing was written, retry")
        }
        AppendError::OutcomeUnknown(message) => {
            tracing::error!(%message, "append outcome unknown");
            ApiError::new(
                actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
                Some("outcome_unknown"),
                "the write may or may not have been stored; inspect the resource before retrying",
            )
        }
    }
}
