//! The contract's error codes, each with the HTTP status it answers with, and the issues and
//! warnings a body carries. The envelope itself (`platform::error::ApiError`) is built from
//! them above the kernel.

use http::StatusCode;
use serde::Serialize;

/// Declares [`Code`]: every code the server uses, with its wire text and, for the public
/// ones, the HTTP status it answers with.
macro_rules! codes {
    (public { $($public:ident = $public_text:literal => $status:literal,)* } internal { $($internal:ident = $internal_text:literal,)* }) => {
        /// Every error and issue code of the API (the contract's and our own), and the labels
        /// of write-side guard refusals that never leave the service (`internal`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code {
            $($public,)*
            $($internal,)*
        }

        impl Code {
            /// The codes a client can meet.
            pub const PUBLIC: &'static [Code] = &[$(Code::$public,)*];

            /// The code whose wire text is `text` (as an answer that was rendered carries it).
            pub fn parse(text: &str) -> Option<Code> {
                match text {
                    $($public_text => Some(Code::$public),)*
                    $($internal_text => Some(Code::$internal),)*
                    _ => None,
                }
            }

            /// The text on the wire.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Code::$public => $public_text,)*
                    $(Code::$internal => $internal_text,)*
                }
            }

            /// The HTTP status an error of this code answers with: the contract's, or ours where
            /// it gives none. A code the contract gives two statuses has its second in
            /// [`Code::SECOND_STATUSES`], used only where that case is built. An internal code
            /// never reaches a client: 500 if one ever did.
            pub fn status(self) -> StatusCode {
                let status: u16 = match self {
                    $(Code::$public => $status,)*
                    $(Code::$internal => 500,)*
                };
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
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
    InvalidApiKey = "invalid_api_key" => 401,
    UnknownSpace = "unknown_space" => 400,
    RateLimitExceeded = "rate_limit_exceeded" => 429,
    OffsetTooLarge = "offset_too_large" => 400,
    MalformedJson = "malformed_json" => 400,
    InvalidTimeRange = "invalid_time_range" => 400,
    InvalidCursor = "invalid_cursor" => 400,
    RequiredAttributeMissing = "required_attribute_missing" => 400,
    SchemaNotFound = "schema_not_found" => 404,
    RecordNotFound = "record_not_found" => 404,
    SuppressionNotFound = "suppression_not_found" => 404,
    IdentifierConflict = "identifier_conflict" => 409,
    SuppressionAlreadyExists = "suppression_already_exists" => 409,
    EventIdConflict = "event_id_conflict" => 409,
    EventErased = "event_erased" => 409,
    IdempotencyConflict = "idempotency_conflict" => 409,
    IdempotencyOutcomeUnknown = "idempotency_outcome_unknown" => 409,
    IdempotencyKeyReused = "idempotency_key_reused" => 422,
    IdempotencyAdmissionBusy = "idempotency_admission_busy" => 429,
    InsufficientCredits = "insufficient_credits" => 402,
    EventRateLimited = "event_rate_limited" => 429,
    EventBacklogFull = "event_backlog_full" => 429,
    EventReceiptLimit = "event_receipt_limit" => 429,
    RouteNotFound = "route_not_found" => 404,
    MethodNotAllowed = "method_not_allowed" => 405,
    UnsupportedMediaType = "unsupported_media_type" => 415,
    BodyTooLarge = "body_too_large" => 413,
    InvalidBody = "invalid_body" => 400,
    InvalidQueryParameter = "invalid_query_parameter" => 400,
    InvalidConsistencyToken = "invalid_consistency_token" => 400,
    InvalidIdempotencyKey = "invalid_idempotency_key" => 400,
    InvalidCharacter = "invalid_character" => 400,
    ValueNotStorable = "value_not_storable" => 400,
    ServiceUnavailable = "service_unavailable" => 503,
    OutcomeUnknown = "outcome_unknown" => 503,
    InternalError = "internal_error" => 500,
    UnknownAttribute = "unknown_attribute" => 400,
    AttributeNotWritable = "attribute_not_writable" => 400,
    InvalidAttributeValue = "invalid_attribute_value" => 400,
    ValueTooLong = "value_too_long" => 400,
    ConcurrentModification = "concurrent_modification" => 409,
    RecordDeletionPending = "record_deletion_pending" => 409,
    RecordDeletionNotFound = "record_deletion_not_found" => 404,
    UnknownField = "unknown_field" => 400,
    InvalidIdentifier = "invalid_identifier" => 400,
    InvalidReason = "invalid_reason" => 400,
    InvalidId = "invalid_id" => 400,
    InvalidBatch = "invalid_batch" => 400,
    InvalidBatchSize = "invalid_batch_size" => 400,
    SuppressionNotRemovable = "suppression_not_removable" => 409,
    InvalidOccurredAt = "invalid_occurred_at" => 400,
    InvalidEventSubject = "invalid_event_subject" => 400,
    ReservedField = "reserved_field" => 400,
    EventInputTooLarge = "event_input_too_large" => 400,
    EventNotFound = "event_not_found" => 404,
    InvalidEventInput = "invalid_event_input" => 400,
    InvalidIdentityChange = "invalid_identity_change" => 400,
    IdentitySourceUnavailable = "identity_source_unavailable" => 403,
    AliasRevisionConflict = "alias_revision_conflict" => 409,
    AliasErased = "alias_erased" => 409,
    OperationIdConflict = "operation_id_conflict" => 409,
    IdentityCapacityExhausted = "identity_capacity_exhausted" => 429,
    MissingField = "missing_field" => 400,
    InvalidField = "invalid_field" => 400,
    InvalidWebhook = "invalid_webhook" => 400,
    WebhookNotFound = "webhook_not_found" => 404,
    WebhookIntegrationOwned = "webhook_integration_owned" => 409,
    AiGenerationFailed = "ai_generation_failed" => 422,
    WebhookDeliveryNotFound = "webhook_delivery_not_found" => 404,
    WebhookDeliveryPending = "webhook_delivery_pending" => 409,
    EmailLimitReached = "email_limit_reached" => 402,
    RecipientNotSubscribed = "recipient_not_subscribed" => 422,
    RecipientSuppressed = "recipient_suppressed" => 422,
    FrequencyCapped = "frequency_capped" => 422,
    QuietHours = "quiet_hours" => 422,
    TemplateNotFound = "template_not_found" => 404,
    DomainNotFound = "domain_not_found" => 404,
    SenderNotFound = "sender_not_found" => 404,
    TopicNotFound = "topic_not_found" => 404,
    EmailNotFound = "email_not_found" => 404,
    LinkNotFound = "link_not_found" => 404,
    InvalidPreferences = "invalid_preferences" => 400,
    InvalidTemplateData = "invalid_template_data" => 400,
    TemplateContentNotAccepted = "template_content_not_accepted" => 400,
    TemplateRenderFailed = "template_render_failed" => 422,
    RecipientMissing = "recipient_missing" => 400,
    FormNotFound = "form_not_found" => 404,
    FormDisabled = "form_disabled" => 403,
    InvalidFormSubmission = "invalid_form_submission" => 400,
    ConfirmationNotFound = "confirmation_not_found" => 404,
    ConfirmationExpired = "confirmation_expired" => 410,
    SegmentNotFound = "segment_not_found" => 404,
    InvalidSegment = "invalid_segment" => 400,
    BroadcastNotFound = "broadcast_not_found" => 404,
    BroadcastRunNotFound = "broadcast_run_not_found" => 404,
    BroadcastRunActive = "broadcast_run_active" => 409,
    InvalidBroadcast = "invalid_broadcast" => 400,
    WorkflowNotFound = "workflow_not_found" => 404,
    WorkflowNotPublished = "workflow_not_published" => 409,
    WorkflowRunNotFound = "workflow_run_not_found" => 404,
    WorkflowReplayNotFound = "workflow_replay_not_found" => 404,
    InvalidWorkflowInput = "invalid_workflow_input" => 400,
    ImportNotFound = "import_not_found" => 404,
    ImportConflict = "import_conflict" => 409,
    ConsentSourceRequired = "consent_source_required" => 400,
    InvalidWriteKey = "invalid_write_key" => 401,
    BatchTooLarge = "batch_too_large" => 400,
    MessageTooLarge = "message_too_large" => 400,
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

impl Code {
    /// The codes the contract gives a second status, with it and when it is answered.
    pub const SECOND_STATUSES: &'static [(Code, u16, &'static str)] = &[(
        Code::IdempotencyOutcomeUnknown,
        503,
        "a write under an Idempotency-Key whose commit broke off: its persistence is unconfirmed",
    )];
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_back_from_its_wire_text_and_nothing_else_does() {
        for code in Code::PUBLIC.iter().chain(&[Code::StreamMoved, Code::CreditSpend]) {
            assert_eq!(Code::parse(code.as_str()), Some(*code));
        }
        assert_eq!(Code::parse("no_such_code"), None);
        assert_eq!(Code::parse(""), None);
    }
}
