//! The one conversion of any refusal (the trait is `kernel::refusal`'s, re-exported here) and
//! of a failed append into the envelope. Beside `error` (the envelope) and `log` (the
//! append's failures), which it joins.

use http::StatusCode;

pub use kernel::refusal::*;

use crate::error::{ApiError, Code};
use crate::log::AppendError;

/// `refusal` as the contract answers it.
pub fn answered<R: Refusal>(refusal: R) -> ApiError {
    let refusal = match refusal.into_failure() {
        Ok(Failure::Append(error)) => return error.into(),
        Ok(Failure::Database(error)) => return error.into(),
        Err(refusal) => refusal,
    };
    let code = refusal.code();
    metrics::counter!("refusals_total", "code" => code.as_str()).increment(1);
    if refusal.is_defect() {
        return ApiError::internal(&anyhow::anyhow!("{refusal}"));
    }
    let mut error = ApiError::of(code, refusal.to_string()).with_issues(refusal.issues());
    for (name, value) in refusal.headers() {
        error = error.with_header(name, value);
    }
    for (name, value) in refusal.fields() {
        error = error.with_field(name, value);
    }
    error
}

/// A refusal a service answers with `?` or `.into()`: implemented, with no body, by each of
/// a service's refusal types beside its [`Refusal`]. (The kernel's trait cannot carry the
/// `From` itself: this crate could not tell it apart from `ApiError`'s other conversions.) A
/// `domain` refusal, which cannot name this crate, is answered through [`answered`].
pub trait Answered: Refusal {}

impl<R: Answered> From<R> for ApiError {
    fn from(refusal: R) -> Self {
        answered(refusal)
    }
}

/// A failed append as the contract answers it.
impl From<AppendError> for ApiError {
    fn from(error: AppendError) -> Self {
        match error {
            // Decided on authored state that changed meanwhile; the caller may simply retry.
            AppendError::Conflict { code: Code::CatalogMoved | Code::StreamMoved, message } => {
                Self::of(Code::ConcurrentModification, message)
            }
            // A guard's internal label must have been translated by its handler.
            AppendError::Conflict { code, message } if code.is_internal() => {
                Self::internal(&anyhow::anyhow!("an untranslated guard refusal {code}: {message}"))
            }
            // A guard's refusal is a conflict with what is stored, whatever its code's row says.
            AppendError::Conflict { code, message } => Self::new(StatusCode::CONFLICT, Some(code), message),
            AppendError::WrongVersion { stream_id } => Self::of(
                Code::ConcurrentModification,
                format!("{stream_id} was changed by another request at the same time; retry"),
            ),
            AppendError::Unavailable(message) => {
                // Nothing was written and the caller retries: the database is away for a moment.
                tracing::warn!(%message, "append failed");
                Self::unavailable("the write could not be stored; nothing was written, retry")
            }
            AppendError::Refused(message) => Self::value_not_storable(&message),
            AppendError::Failed(message) => Self::internal(&anyhow::anyhow!(message)),
            AppendError::OutcomeUnknown(message) => {
                tracing::error!(%message, "append outcome unknown");
                Self::of(
                    Code::OutcomeUnknown,
                    "the write may or may not have been stored; inspect the resource before retrying",
                )
                .unconfirmed()
            }
        }
    }
}
