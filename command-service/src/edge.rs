//! What every write handler shares at the HTTP edge: the log metadata of a request and the
//! contract's answer to a failed append.

use actix_web::HttpRequest;
use api::auth::Caller;
use platform::error::ApiError;
use platform::error::{Code, Issue};
use platform::log::{AppendError, Metadata};

/// The log metadata of a write by `caller`.
pub fn metadata(req: &HttpRequest, caller: &Caller, idempotency_key: Option<String>) -> Metadata {
    Metadata {
        space_id: Some(caller.space_id().to_owned()),
        actor_key_id: Some(caller.key_id().to_owned()),
        actor_user_id: Some(caller.identity.user_id.clone()),
        request_id: Some(api::http::request_id(req)),
        idempotency_key,
    }
}

/// A refused suppression write as the contract answers it.
impl From<crate::suppressions::decide::Refusal> for ApiError {
    fn from(refusal: crate::suppressions::decide::Refusal) -> Self {
        use crate::suppressions::decide::Refusal;
        let message = refusal.to_string();
        match refusal {
            Refusal::Invalid { code, message, issues } => ApiError::bad_request(code, message).with_issues(issues),
            Refusal::NotFound(_) => ApiError::not_found(Code::SuppressionNotFound, message),
            Refusal::NotRemovable => ApiError::conflict(Code::SuppressionNotRemovable, message),
            Refusal::KeptChanging => ApiError::conflict(Code::ConcurrentModification, message),
            Refusal::Unreadable(message) => ApiError::internal(&anyhow::anyhow!(message)),
        }
    }
}

/// A refused webhook write as the contract answers it.
impl From<crate::webhooks::decide::Refusal> for ApiError {
    fn from(refusal: crate::webhooks::decide::Refusal) -> Self {
        use crate::webhooks::decide::Refusal;
        use actix_web::http::StatusCode;
        let message = refusal.to_string();
        match refusal {
            Refusal::Invalid { message, issues } => {
                ApiError::bad_request(Code::InvalidWebhook, message).with_issues(issues)
            }
            Refusal::NotFound(_) => ApiError::not_found(Code::WebhookNotFound, message),
            Refusal::IntegrationOwned { .. } => ApiError::conflict(Code::WebhookIntegrationOwned, message),
            Refusal::SchemaNotFound(_) => ApiError::not_found(Code::SchemaNotFound, message),
            Refusal::DeliveryNotFound(_) => ApiError::not_found(Code::WebhookDeliveryNotFound, message),
            Refusal::DeliveryPending(_) => ApiError::conflict(Code::WebhookDeliveryPending, message),
            Refusal::NoCredits => ApiError::new(StatusCode::PAYMENT_REQUIRED, Some(Code::InsufficientCredits), message),
            Refusal::FilterNotOnData | Refusal::FilterNotMade(_) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, Some(Code::AiGenerationFailed), message.clone())
                    .with_issues(vec![Issue::coded("condition.requirements", Code::AiGenerationFailed, message)])
            }
            Refusal::KeptChanging => ApiError::conflict(Code::ConcurrentModification, message),
            Refusal::Failed(message) => ApiError::internal(&anyhow::anyhow!(message)),
        }
    }
}

/// A refused fire as the contract answers it.
impl From<crate::events::decide::EventRefusal> for ApiError {
    fn from(refusal: crate::events::decide::EventRefusal) -> Self {
        use crate::events::decide::EventRefusal;
        let (code, message) = (refusal.code(), refusal.to_string());
        match refusal {
            EventRefusal::Invalid { code, message, issues } => ApiError::bad_request(code, message).with_issues(issues),
            EventRefusal::TooLarge(_) => ApiError::bad_request(code, message),
            EventRefusal::NoCredits => ApiError::insufficient_credits(),
            EventRefusal::SubjectNotFound { .. } => ApiError::not_found(code, message),
            EventRefusal::IdConflict(_)
            | EventRefusal::Erased(_)
            | EventRefusal::SubjectDeletionPending { .. }
            | EventRefusal::SubjectDeleting
            | EventRefusal::BatchSubjectDeleting
            | EventRefusal::Concurrent
            | EventRefusal::BatchConcurrent => ApiError::conflict(code, message),
            EventRefusal::NotAdmitted(refusal) => refusal.into(),
            EventRefusal::Unsealable(message) => ApiError::internal(&anyhow::anyhow!(message)),
        }
    }
}

/// An occurrence not admitted: 429 with `Retry-After` in whole seconds (at least 1).
impl From<crate::events::decide::AdmissionRefusal> for ApiError {
    fn from(refusal: crate::events::decide::AdmissionRefusal) -> Self {
        metrics::counter!("event_admission_refusals_total", "code" => refusal.code().as_str()).increment(1);
        let seconds = refusal.retry_after_ms().div_ceil(1000).max(1);
        ApiError::new(actix_web::http::StatusCode::TOO_MANY_REQUESTS, Some(refusal.code()), refusal.message())
            .with_header("Retry-After", seconds.to_string())
    }
}

/// A refused broadcast update as the contract answers it.
impl From<crate::broadcasts::decide::Refusal> for ApiError {
    fn from(refusal: crate::broadcasts::decide::Refusal) -> Self {
        use crate::broadcasts::decide::Refusal;
        use domain::email::resources::Audience;
        let message = refusal.to_string();
        match refusal {
            Refusal::Invalid { message, issues } => {
                ApiError::bad_request(Code::InvalidBroadcast, message).with_issues(issues)
            }
            Refusal::NotFound(_) => ApiError::not_found(Code::BroadcastNotFound, message),
            Refusal::RunActive => ApiError::conflict(Code::BroadcastRunActive, message),
            Refusal::AudienceNotFound(Audience::Segment { .. }) => ApiError::not_found(Code::SegmentNotFound, message),
            Refusal::AudienceNotFound(Audience::Topic { .. }) => ApiError::not_found(Code::TopicNotFound, message),
            Refusal::Failed(message) => ApiError::internal(&anyhow::anyhow!(message)),
        }
    }
}

/// A refused workflow request as the contract answers it.
impl From<crate::workflows::decide::Refusal> for ApiError {
    fn from(refusal: crate::workflows::decide::Refusal) -> Self {
        use crate::workflows::decide::Refusal;
        let message = refusal.to_string();
        match refusal {
            Refusal::NotFound(_) => ApiError::not_found(Code::WorkflowNotFound, message),
            Refusal::NotPublished(_) => ApiError::conflict(Code::WorkflowNotPublished, message),
            Refusal::InvalidInput(_) => ApiError::bad_request(Code::InvalidWorkflowInput, message),
            Refusal::InvalidReplay(_) => ApiError::bad_request(Code::InvalidField, message),
            Refusal::UnknownField(_) => ApiError::bad_request(Code::UnknownField, message),
            Refusal::Record(refusal) => refusal.into(),
            Refusal::Failed(message) => ApiError::internal(&anyhow::anyhow!(message)),
        }
    }
}

/// A refused ingest request: 401 for its key (with the Basic challenge Segment's clients
/// expect), 400 for its body.
impl From<crate::ingest::decide::Intake> for ApiError {
    fn from(refusal: crate::ingest::decide::Intake) -> Self {
        use crate::ingest::decide::Intake;
        let (code, message) = (refusal.code(), refusal.to_string());
        match refusal {
            Intake::NoKey | Intake::UnknownKey => {
                ApiError::new(actix_web::http::StatusCode::UNAUTHORIZED, Some(code), message)
                    .with_header("WWW-Authenticate", "Basic realm=\"ingest\"".to_owned())
            }
            Intake::NoType(index) | Intake::MessageTooLarge { index, .. } => ApiError::bad_request(
                code,
                message.clone(),
            )
            .with_issues(vec![platform::error::Issue::coded(format!("batch[{index}]"), code, message)]),
            _ => ApiError::bad_request(code, message),
        }
    }
}

/// A message the ingest could not apply, as the pipeline answers it (the failures list keeps
/// its code and message).
impl From<crate::ingest::decide::Refusal> for ApiError {
    fn from(refusal: crate::ingest::decide::Refusal) -> Self {
        use crate::ingest::decide::Refusal;
        match refusal {
            Refusal::Record(refusal) => refusal.into(),
            Refusal::AliasErased => ApiError::conflict(Code::AliasErased, refusal.to_string()),
            Refusal::Unwritable(message) => ApiError::internal(&anyhow::anyhow!(message)),
        }
    }
}

/// A refused template send as the contract answers it.
impl From<crate::templates::decide::Refusal> for ApiError {
    fn from(refusal: crate::templates::decide::Refusal) -> Self {
        use crate::templates::decide::Refusal;
        use actix_web::http::StatusCode;
        let (code, message) = (refusal.code(), refusal.to_string());
        match refusal {
            Refusal::NotFound(_) => ApiError::not_found(code, message),
            Refusal::ContentNotAccepted(_) | Refusal::UnknownField(_) => ApiError::bad_request(code, message),
            Refusal::InvalidField { field, message } => ApiError::bad_request(code, message.clone())
                .with_issues(vec![platform::error::Issue::for_key(field, message)]),
            Refusal::ContactNotFound(_) => ApiError::not_found(code, message),
            Refusal::InvalidData { message, issues } => ApiError::bad_request(code, message).with_issues(issues),
            Refusal::Gate(mail::send::Gate::NoAddress) => ApiError::bad_request(code, message),
            Refusal::Gate(_) => ApiError::unprocessable(code, message),
            Refusal::Policy { reason, .. } => {
                let detail = format!(
                    "{}; a send is allowed from {}",
                    reason.description,
                    platform::time::format_millis(reason.allowed_at_ms)
                );
                ApiError::unprocessable(code, message)
                    .with_issues(vec![platform::error::Issue::coded(reason.rule, code, detail)])
                    .with_field("notBefore", serde_json::json!(platform::time::format_millis(reason.allowed_at_ms)))
            }
            Refusal::RenderFailed(_) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, Some(code), message),
            Refusal::EmailLimitReached => ApiError::new(StatusCode::PAYMENT_REQUIRED, Some(code), message),
            Refusal::KeptChanging => ApiError::conflict(code, message),
            Refusal::Record(refusal) => refusal.into(),
            Refusal::Failed(message) => ApiError::internal(&anyhow::anyhow!(message)),
        }
    }
}

/// A refused segment as the contract answers it.
impl From<crate::segments::decide::Refusal> for ApiError {
    fn from(refusal: crate::segments::decide::Refusal) -> Self {
        use crate::segments::decide::Refusal;
        let message = refusal.to_string();
        match refusal {
            Refusal::Invalid { message, issues } => {
                ApiError::bad_request(Code::InvalidSegment, message).with_issues(issues)
            }
            Refusal::Unusable(_) => ApiError::unprocessable(Code::AiGenerationFailed, message.clone())
                .with_issues(vec![Issue::coded("definition", Code::AiGenerationFailed, message)]),
            Refusal::NoCredits => {
                ApiError::new(actix_web::http::StatusCode::PAYMENT_REQUIRED, Some(Code::InsufficientCredits), message)
            }
            Refusal::NotFound(_) => ApiError::not_found(Code::SegmentNotFound, message),
        }
    }
}

/// A refused identity change as the contract answers it.
impl From<crate::identities::decide::Refusal> for ApiError {
    fn from(refusal: crate::identities::decide::Refusal) -> Self {
        use crate::identities::decide::Refusal;
        let (code, message) = (refusal.code(), refusal.to_string());
        match refusal {
            Refusal::Invalid { message, issues } => ApiError::bad_request(code, message).with_issues(issues),
            Refusal::ContactNotFound { .. } => ApiError::not_found(code, message),
            Refusal::OperationIdConflict
            | Refusal::AliasErased
            | Refusal::RevisionConflict { .. }
            | Refusal::ContactDeletionPending(_)
            | Refusal::ContactBeingDeleted
            | Refusal::KeptChanging => ApiError::conflict(code, message),
            Refusal::SourceUnavailable(_) => ApiError::new(actix_web::http::StatusCode::FORBIDDEN, Some(code), message),
            Refusal::CapacityExhausted { .. } => {
                ApiError::new(actix_web::http::StatusCode::TOO_MANY_REQUESTS, Some(code), message)
            }
        }
    }
}

/// A refused record write as the contract answers it: a record rule's refusal as the domain
/// answers it (`RecordRefusal`, which the import worker shares).
impl From<crate::records::decide::Refusal> for ApiError {
    fn from(refusal: crate::records::decide::Refusal) -> Self {
        use crate::records::decide::Refusal;
        let message = refusal.to_string();
        match refusal {
            Refusal::Record(refusal) => ApiError::from(refusal),
            Refusal::KeptChanging => ApiError::conflict(Code::ConcurrentModification, message),
            Refusal::Unreadable(message) => ApiError::internal(&anyhow::anyhow!(message)),
            Refusal::Unwritable(error) => append_error(error),
        }
    }
}

/// A tracking link this service did not issue, or one changed: 404 `link_not_found`.
impl From<crate::engagement::decide::Forged> for ApiError {
    fn from(forged: crate::engagement::decide::Forged) -> Self {
        ApiError::not_found(Code::LinkNotFound, forged.to_string())
    }
}

/// A write to a schema the space does not have: 404 `schema_not_found`.
impl From<crate::decision::UnknownSchema> for ApiError {
    fn from(unknown: crate::decision::UnknownSchema) -> Self {
        ApiError::not_found(Code::SchemaNotFound, unknown.to_string())
    }
}

/// A refused import request as the contract answers it.
impl From<crate::imports::decide::Refusal> for ApiError {
    fn from(refusal: crate::imports::decide::Refusal) -> Self {
        use crate::imports::decide::Refusal;
        let message = refusal.to_string();
        match refusal {
            Refusal::NotFound(_) => ApiError::not_found(Code::ImportNotFound, message),
            Refusal::InvalidId | Refusal::InvalidPart => ApiError::bad_request(Code::InvalidId, message),
            Refusal::WrongMediaType { .. } => ApiError::new(
                actix_web::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Some(Code::UnsupportedMediaType),
                message,
            ),
            Refusal::Unreadable(_) => ApiError::bad_request(Code::InvalidBody, message),
            Refusal::UnknownField(_) => ApiError::bad_request(Code::UnknownField, message),
            Refusal::MissingParts => ApiError::bad_request(Code::MissingField, message),
            Refusal::InvalidParts => ApiError::bad_request(Code::InvalidField, message),
            Refusal::OtherSettings(_)
            | Refusal::OtherBody { .. }
            | Refusal::Closed(_)
            | Refusal::Completed(_)
            | Refusal::SentTwice { .. }
            | Refusal::CompletedWith { .. }
            | Refusal::PartsMissing { .. } => ApiError::conflict(Code::ImportConflict, message),
        }
    }
}

/// An import write that failed: the database's answer, or the refusal.
impl From<crate::imports::store::Failed> for ApiError {
    fn from(failed: crate::imports::store::Failed) -> Self {
        use crate::imports::store::Failed;
        match failed {
            Failed::Database(error) => error.into(),
            Failed::Refusal(refusal) => refusal.into(),
        }
    }
}

/// A refused recipient action on an email (unsubscribe, preferences) as the contract answers it.
impl From<crate::emails::decide::Refusal> for ApiError {
    fn from(refusal: crate::emails::decide::Refusal) -> Self {
        use crate::emails::decide::Refusal;
        let (code, message) = (refusal.code(), refusal.to_string());
        match refusal {
            Refusal::EmailNotFound(_) => ApiError::not_found(code, message),
            Refusal::Invalid { message, issues } => ApiError::bad_request(code, message).with_issues(issues),
            Refusal::PreferencesKeptChanging | Refusal::RecipientKeptChanging => ApiError::conflict(code, message),
        }
    }
}

/// A refused form submission or confirmation as the contract answers it.
impl From<crate::forms::decide::Refusal> for ApiError {
    fn from(refusal: crate::forms::decide::Refusal) -> Self {
        use crate::forms::decide::Refusal;
        use actix_web::http::StatusCode;
        let (code, message) = (refusal.code(), refusal.to_string());
        match refusal {
            Refusal::Invalid { message, issues } => ApiError::bad_request(code, message).with_issues(issues),
            Refusal::FormNotFound(_) | Refusal::LinkNotFound => ApiError::not_found(code, message),
            Refusal::Disabled => ApiError::new(StatusCode::FORBIDDEN, Some(code), message),
            Refusal::RateLimited { retry_after, .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, Some(code), message)
                    .with_header("Retry-After", retry_after)
            }
            Refusal::LinkExpired => ApiError::new(StatusCode::GONE, Some(code), message),
            Refusal::SubmissionKeptChanging | Refusal::ConfirmationKeptChanging => ApiError::conflict(code, message),
            Refusal::Internal(message) => ApiError::internal(&anyhow::anyhow!(message)),
        }
    }
}

/// Turns a failed append into the contract's answer.
pub(crate) fn append_error(error: AppendError) -> ApiError {
    match error {
        // Decided on authored state that changed meanwhile; the caller may simply retry.
        AppendError::Conflict { code: Code::CatalogMoved | Code::StreamMoved, message } => {
            ApiError::conflict(Code::ConcurrentModification, message)
        }
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
            // Nothing was written and the caller retries: the database is away for a moment.
            tracing::warn!(%message, "append failed");
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
            .unconfirmed()
        }
    }
}

/// Adds `Consistency-Token` (the last position written) when something was appended.
pub fn consistency_token(response: &mut actix_web::HttpResponseBuilder, appended: Option<platform::log::Appended>) {
    if let Some(appended) = appended.filter(|a| a.last_position > 0) {
        response.insert_header(("Consistency-Token", appended.last_position.to_string()));
    }
}
