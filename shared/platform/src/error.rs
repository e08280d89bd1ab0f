//! The contract's error envelope `{error: {type, code, message, issues?}}`, used by every
//! service for every failure.

use http::StatusCode;
use serde::Serialize;
use serde_json::json;

/// Declares [`Code`]: every code the server uses, with its wire text.
macro_rules! codes {
    (public { $($public:ident = $public_text:literal,)* } internal { $($internal:ident = $internal_text:literal,)* }) => {
        /// Every error and issue code of the API (the contract's and our own), and the labels
        /// of write-side guard refusals that never leave the service (`internal`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code {
            $($public,)*
            $($internal,)*
        }

        impl Code {
            /// The codes a client can meet.
            pub(crate) const PUBLIC: &'static [Code] = &[$(Code::$public,)*];

            /// The text on the wire.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Code::$public => $public_text,)*
                    $(Code::$internal => $internal_text,)*
                }
            }

            /// Whether the code labels a guard refusal that handlers translate and that never
            /// reaches a client.
            pub fn is_internal(self) -> bool {
                !Self::PUBLIC.contains(&self)
            }
        }
    };
}

codes! {
    public {
    InvalidApiKey = "invalid_api_key",
    UnknownSpace = "unknown_space",
    RateLimitExceeded = "rate_limit_exceeded",
    OffsetTooLarge = "offset_too_large",
    MalformedJson = "malformed_json",
    InvalidTimeRange = "invalid_time_range",
    InvalidCursor = "invalid_cursor",
    RequiredAttributeMissing = "required_attribute_missing",
    SchemaNotFound = "schema_not_found",
    RecordNotFound = "record_not_found",
    SuppressionNotFound = "suppression_not_found",
    IdentifierConflict = "identifier_conflict",
    SuppressionAlreadyExists = "suppression_already_exists",
    EventIdConflict = "event_id_conflict",
    EventErased = "event_erased",
    IdempotencyConflict = "idempotency_conflict",
    IdempotencyOutcomeUnknown = "idempotency_outcome_unknown",
    IdempotencyKeyReused = "idempotency_key_reused",
    IdempotencyAdmissionBusy = "idempotency_admission_busy",
    InsufficientCredits = "insufficient_credits",
    EventRateLimited = "event_rate_limited",
    EventBacklogFull = "event_backlog_full",
    EventReceiptLimit = "event_receipt_limit",
    RouteNotFound = "route_not_found",
    MethodNotAllowed = "method_not_allowed",
    UnsupportedMediaType = "unsupported_media_type",
    BodyTooLarge = "body_too_large",
    InvalidBody = "invalid_body",
    InvalidQueryParameter = "invalid_query_parameter",
    InvalidConsistencyToken = "invalid_consistency_token",
    InvalidIdempotencyKey = "invalid_idempotency_key",
    InvalidCharacter = "invalid_character",
    ValueNotStorable = "value_not_storable",
    ServiceUnavailable = "service_unavailable",
    OutcomeUnknown = "outcome_unknown",
    InternalError = "internal_error",
    UnknownAttribute = "unknown_attribute",
    AttributeNotWritable = "attribute_not_writable",
    InvalidAttributeValue = "invalid_attribute_value",
    ValueTooLong = "value_too_long",
    ConcurrentModification = "concurrent_modification",
    RecordDeletionPending = "record_deletion_pending",
    RecordDeletionNotFound = "record_deletion_not_found",
    UnknownField = "unknown_field",
    InvalidIdentifier = "invalid_identifier",
    InvalidReason = "invalid_reason",
    InvalidId = "invalid_id",
    InvalidBatch = "invalid_batch",
    InvalidBatchSize = "invalid_batch_size",
    SuppressionNotRemovable = "suppression_not_removable",
    InvalidOccurredAt = "invalid_occurred_at",
    InvalidEventSubject = "invalid_event_subject",
    ReservedField = "reserved_field",
    EventInputTooLarge = "event_input_too_large",
    EventNotFound = "event_not_found",
    InvalidEventInput = "invalid_event_input",
    InvalidIdentityChange = "invalid_identity_change",
    IdentitySourceUnavailable = "identity_source_unavailable",
    AliasRevisionConflict = "alias_revision_conflict",
    AliasErased = "alias_erased",
    OperationIdConflict = "operation_id_conflict",
    IdentityCapacityExhausted = "identity_capacity_exhausted",
    MissingField = "missing_field",
    InvalidField = "invalid_field",
    InvalidWebhook = "invalid_webhook",
    WebhookNotFound = "webhook_not_found",
    WebhookIntegrationOwned = "webhook_integration_owned",
    AiGenerationFailed = "ai_generation_failed",
    WebhookDeliveryNotFound = "webhook_delivery_not_found",
    WebhookDeliveryPending = "webhook_delivery_pending",
    EmailLimitReached = "email_limit_reached",
    RecipientNotSubscribed = "recipient_not_subscribed",
    RecipientSuppressed = "recipient_suppressed",
    FrequencyCapped = "frequency_capped",
    QuietHours = "quiet_hours",
    TemplateNotFound = "template_not_found",
    DomainNotFound = "domain_not_found",
    SenderNotFound = "sender_not_found",
    TopicNotFound = "topic_not_found",
    EmailNotFound = "email_not_found",
    LinkNotFound = "link_not_found",
    InvalidPreferences = "invalid_preferences",
    InvalidTemplateData = "invalid_template_data",
    TemplateContentNotAccepted = "template_content_not_accepted",
    TemplateRenderFailed = "template_render_failed",
    RecipientMissing = "recipient_missing",
    FormNotFound = "form_not_found",
    FormDisabled = "form_disabled",
    InvalidFormSubmission = "invalid_form_submission",
    ConfirmationNotFound = "confirmation_not_found",
    ConfirmationExpired = "confirmation_expired",
    SegmentNotFound = "segment_not_found",
    InvalidSegment = "invalid_segment",
    BroadcastNotFound = "broadcast_not_found",
    BroadcastRunNotFound = "broadcast_run_not_found",
    BroadcastRunActive = "broadcast_run_active",
    InvalidBroadcast = "invalid_broadcast",
    WorkflowNotFound = "workflow_not_found",
    WorkflowNotPublished = "workflow_not_published",
    WorkflowRunNotFound = "workflow_run_not_found",
    WorkflowReplayNotFound = "workflow_replay_not_found",
    InvalidWorkflowInput = "invalid_workflow_input",
    ImportNotFound = "import_not_found",
    ImportConflict = "import_conflict",
    ConsentSourceRequired = "consent_source_required",
    InvalidWriteKey = "invalid_write_key",
    BatchTooLarge = "batch_too_large",
    MessageTooLarge = "message_too_large",
    }
    internal {
    OperationTaken = "operation_taken",
    EventIdTaken = "event_id_taken",
    EventAdmissionRefused = "event_admission_refused",
    DeletionMovedOn = "deletion_moved_on",
    EventAlreadyPrepared = "event_already_prepared",
    CreditSpend = "credit_spend",
    CatalogMoved = "catalog_moved",
    StreamMoved = "stream_moved",
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// A warning in a success body: `{code, message}`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Warning {
    pub code: &'static str,
    pub message: String,
}

/// One problem with the input, naming the key it concerns when there is one.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Issue {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<Code>,
    pub message: String,
}

impl Issue {
    /// The message of an error holding `issues` about `what` (`this webhook`): the one issue's
    /// message, or how many there are.
    pub fn summary(issues: &[Issue], what: &str) -> String {
        match issues {
            [only] => only.message.clone(),
            _ => format!("{} problems with {what}; see issues", issues.len()),
        }
    }

    pub fn for_key(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self { key: Some(key.into()), code: None, message: message.into() }
    }

    pub fn coded(key: impl Into<String>, code: Code, message: impl Into<String>) -> Self {
        Self { key: Some(key.into()), code: Some(code), message: message.into() }
    }
}

#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    code: Option<Code>,
    message: String,
    issues: Vec<Issue>,
    headers: Vec<(&'static str, String)>,
    /// Fields of the error object beside the contract's (`notBefore` of a send the send
    /// policy refused), each documented in `ErrorDetail`.
    fields: Vec<(&'static str, serde_json::Value)>,
    /// The contract lets an unconfirmed idempotent outcome (503) omit `type`.
    omit_type: bool,
    /// A write whose persistence could not be confirmed (its commit broke off): under an
    /// `Idempotency-Key` the claim must stay unresolved rather than record this error.
    unconfirmed: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, code: Option<Code>, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            issues: Vec::new(),
            headers: Vec::new(),
            fields: Vec::new(),
            omit_type: false,
            unconfirmed: false,
        }
    }

    /// Marks the error as the answer to a write whose persistence is unconfirmed.
    pub fn unconfirmed(mut self) -> Self {
        self.unconfirmed = true;
        self
    }

    pub fn is_unconfirmed(&self) -> bool {
        self.unconfirmed
    }

    pub fn bad_request(code: Code, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, Some(code), message)
    }

    pub fn not_found(code: Code, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, Some(code), message)
    }

    pub fn unprocessable(code: Code, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, Some(code), message)
    }

    pub fn conflict(code: Code, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, Some(code), message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, None, message)
    }

    /// 401 `invalid_api_key` for a key that is unknown, revoked or malformed, with the
    /// challenge of RFC 6750 (`WWW-Authenticate: Bearer realm="api", error="invalid_token"`).
    pub fn invalid_api_key(message: &str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, Some(Code::InvalidApiKey), message)
            .with_header("WWW-Authenticate", "Bearer realm=\"api\", error=\"invalid_token\"".to_owned())
    }

    /// 401 `invalid_api_key` without a key (`no key provided`, the contract's message), with
    /// the challenge naming the scheme (`WWW-Authenticate: Bearer realm="api"`).
    pub fn missing_api_key() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, Some(Code::InvalidApiKey), "no key provided")
            .with_header("WWW-Authenticate", "Bearer realm=\"api\"".to_owned())
    }

    pub fn insufficient_credits() -> Self {
        Self::new(
            StatusCode::PAYMENT_REQUIRED,
            Some(Code::InsufficientCredits),
            "the space has no AI credits left; add credits before writing to a schema with AI auto-fill",
        )
    }

    pub fn route_not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, Some(Code::RouteNotFound), "no such endpoint; see /v1/openapi.json")
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            Some(Code::MethodNotAllowed),
            "this method is not allowed on this path",
        )
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, Some(Code::ServiceUnavailable), message)
    }

    /// A value of the request that the database refused to store (found past the edge's own
    /// checks, so it is logged: the edge should learn to refuse it).
    pub fn value_not_storable(cause: &str) -> Self {
        tracing::warn!(error = cause, "the database refused a value of a request");
        Self::new(
            StatusCode::BAD_REQUEST,
            Some(Code::ValueNotStorable),
            "a value of this request cannot be stored (for example a NUL character or an over-long identifier); \
             change the input",
        )
    }

    /// A server failure. The cause is logged in full; the caller learns little.
    pub fn internal(cause: &anyhow::Error) -> Self {
        tracing::error!(error = format!("{cause:#}"), "internal error");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, Some(Code::InternalError), "internal server error")
    }

    pub fn with_issues(mut self, issues: Vec<Issue>) -> Self {
        self.issues = issues;
        self
    }

    pub fn without_type(mut self) -> Self {
        self.omit_type = true;
        self
    }

    /// Adds field `name` to the error object (documented in `ErrorDetail`).
    pub fn with_field(mut self, name: &'static str, value: serde_json::Value) -> Self {
        self.fields.push((name, value));
        self
    }

    pub fn with_header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn code(&self) -> Option<Code> {
        self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn issues(&self) -> &[Issue] {
        &self.issues
    }

    /// The headers the answer carries beside the body (`Retry-After`, `Allow`).
    pub fn headers(&self) -> &[(&'static str, String)] {
        &self.headers
    }

    pub fn body(&self) -> serde_json::Value {
        let kind = if self.status.is_server_error() { "api_error" } else { "invalid_request_error" };
        let mut error = json!({ "type": kind, "code": self.code, "message": self.message });
        if self.omit_type
            && let Some(object) = error.as_object_mut()
        {
            object.remove("type");
        }
        if !self.issues.is_empty() {
            error["issues"] = json!(self.issues);
        }
        for (name, value) in &self.fields {
            error[*name] = value.clone();
        }
        json!({ "error": error })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:?}: {}", self.status.as_u16(), self.code, self.message)
    }
}

impl From<anyhow::Error> for ApiError {
    /// Classifies a database failure inside `cause` (see `From<tokio_postgres::Error>`);
    /// anything else is a 500.
    fn from(cause: anyhow::Error) -> Self {
        match cause.downcast::<tokio_postgres::Error>() {
            Ok(database) => database.into(),
            Err(cause) => match cause.downcast::<deadpool_postgres::PoolError>() {
                Ok(pool) => pool.into(),
                Err(cause) => Self::internal(&cause),
            },
        }
    }
}

impl From<tokio_postgres::Error> for ApiError {
    /// A transient failure is a 503 (retry); a value the database refuses is a 400, since the
    /// same request can never succeed (the edge should have refused it: logged); anything else
    /// is ours, a 500.
    fn from(cause: tokio_postgres::Error) -> Self {
        match crate::db::classify(&cause) {
            crate::db::Failure::Transient => {
                tracing::warn!(error = %cause, "database unavailable");
                Self::unavailable("the database is unavailable; nothing was written, retry shortly")
            }
            crate::db::Failure::Refused => Self::value_not_storable(&cause.to_string()),
            crate::db::Failure::Defect => Self::internal(&anyhow::Error::new(cause)),
        }
    }
}

impl From<deadpool_postgres::PoolError> for ApiError {
    fn from(cause: deadpool_postgres::PoolError) -> Self {
        tracing::warn!(error = %cause, "database pool unavailable");
        Self::unavailable("the database is unavailable; retry shortly")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_are_invalid_request_errors_with_issues() {
        let error = ApiError::bad_request(Code::RequiredAttributeMissing, "plan is required")
            .with_issues(vec![Issue::for_key("plan", "required")]);
        assert_eq!(
            error.body(),
            json!({"error": {"type": "invalid_request_error", "code": "required_attribute_missing",
                "message": "plan is required", "issues": [{"key": "plan", "message": "required"}]}})
        );
    }

    #[test]
    fn server_errors_are_api_errors_without_issues() {
        let error = ApiError::internal(&anyhow::anyhow!("boom"));
        assert_eq!(
            error.body(),
            json!({"error": {"type": "api_error", "code": "internal_error", "message": "internal server error"}})
        );
    }

    #[test]
    fn every_public_code_is_documented_and_no_internal_one_is() {
        let document = include_str!("../../../docs/openapi.json");
        for code in Code::PUBLIC {
            let quoted = format!("\"{code}\"");
            let ticked = format!("`{code}`");
            assert!(document.contains(&quoted) || document.contains(&ticked), "{code} is not in docs/openapi.json");
        }
        for code in [Code::OperationTaken, Code::EventIdTaken, Code::DeletionMovedOn, Code::CreditSpend] {
            assert!(code.is_internal());
            assert!(!document.contains(&format!("\"{code}\"")), "{code} is internal");
        }
    }

    #[test]
    fn codeless_errors_have_null_code() {
        let error = ApiError::forbidden("Space is out of scope");
        assert_eq!(error.body()["error"]["code"], serde_json::Value::Null);
        assert_eq!(error.status(), StatusCode::FORBIDDEN);
    }
}
