//! A refusal as the contract answers it: the trait every decision's refusal type implements,
//! and the one conversion of any of them (and of a failed append) into the envelope. Beside
//! `error` (the codes and the envelope) and `log` (the append's failures), which it joins.

use http::StatusCode;

use crate::error::{ApiError, Code, Issue};
use crate::log::AppendError;

/// A refusal as the contract answers it, whatever refused it: its code (whose status the code
/// table gives, [`Code::status`]), its message (`Display`), and what the answer carries beside
/// them. Every decision's refusal type implements it, and the one `From` below turns any of
/// them into the envelope, so no service maps refusals case by case.
pub trait Refusal: std::fmt::Display {
    /// The error's code.
    fn code(&self) -> Code;

    /// The problems with the input, each naming the key it concerns.
    fn issues(&self) -> Vec<Issue> {
        Vec::new()
    }

    /// Headers of the answer (`Retry-After`, an authentication challenge).
    fn headers(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// Fields of the error object beside the contract's, each documented in `ErrorDetail`.
    fn fields(&self) -> Vec<(&'static str, serde_json::Value)> {
        Vec::new()
    }

    /// A defect of ours rather than a refusal of the request: answered 500 `internal_error`,
    /// its message logged and not shown.
    fn is_defect(&self) -> bool {
        false
    }

    /// A refusal that is a failure of the write itself (an append refused or unavailable, the
    /// database away): answered as that failure is. `Err` gives the refusal back.
    fn into_failure(self) -> Result<Failure, Self>
    where
        Self: Sized,
    {
        Err(self)
    }
}

/// A failure of a write that a refusal may carry ([`Refusal::into_failure`]).
#[derive(Debug)]
pub enum Failure {
    /// The append failed: refused, unavailable, or its outcome unknown.
    Append(AppendError),
    /// The database failed a statement of the write.
    Database(tokio_postgres::Error),
}

impl<R: Refusal> From<R> for ApiError {
    fn from(refusal: R) -> Self {
        let refusal = match refusal.into_failure() {
            Ok(Failure::Append(error)) => return error.into(),
            Ok(Failure::Database(error)) => return error.into(),
            Err(refusal) => refusal,
        };
        let code = refusal.code();
        metrics::counter!("refusals_total", "code" => code.as_str()).increment(1);
        if refusal.is_defect() {
            return Self::internal(&anyhow::anyhow!("{refusal}"));
        }
        let mut error = Self::of(code, refusal.to_string()).with_issues(refusal.issues());
        for (name, value) in refusal.headers() {
            error = error.with_header(name, value);
        }
        for (name, value) in refusal.fields() {
            error = error.with_field(name, value);
        }
        error
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
