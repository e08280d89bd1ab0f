//! The contract's error envelope `{error: {type, code, message, issues?}}`, used by every
//! service for every failure.

use http::StatusCode;
use serde::Serialize;
use serde_json::json;

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
            pub(crate) const PUBLIC: &'static [Code] = &[$(Code::$public,)*];

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
    /// An error with the status given here. Only this crate chooses a status apart from the
    /// code table: for codeless errors and the few documented exceptions (a guard's conflict).
    pub(crate) fn new(status: StatusCode, code: Option<Code>, message: impl Into<String>) -> Self {
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

    /// An error of `code`, answered with the status of its row in the code table
    /// ([`Code::status`]).
    pub fn of(code: Code, message: impl Into<String>) -> Self {
        Self::new(code.status(), Some(code), message)
    }

    /// An error of `code` answered with the second status the contract gives it
    /// ([`Code::SECOND_STATUSES`]; the table's own when it gives none).
    pub fn of_second(code: Code, message: impl Into<String>) -> Self {
        let second = Code::SECOND_STATUSES.iter().find(|(of, _, _)| *of == code);
        let status = second.and_then(|(_, status, _)| StatusCode::from_u16(*status).ok()).unwrap_or(code.status());
        Self::new(status, Some(code), message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, None, message)
    }

    /// 401 `invalid_api_key` for a key that is unknown, revoked or malformed, with the
    /// challenge of RFC 6750 (`WWW-Authenticate: Bearer realm="api", error="invalid_token"`).
    pub fn invalid_api_key(message: &str) -> Self {
        Self::of(Code::InvalidApiKey, message)
            .with_header("WWW-Authenticate", "Bearer realm=\"api\", error=\"invalid_token\"".to_owned())
    }

    /// 401 `invalid_api_key` without a key (`no key provided`, the contract's message), with
    /// the challenge naming the scheme (`WWW-Authenticate: Bearer realm="api"`).
    pub fn missing_api_key() -> Self {
        Self::of(Code::InvalidApiKey, "no key provided")
            .with_header("WWW-Authenticate", "Bearer realm=\"api\"".to_owned())
    }

    pub fn insufficient_credits() -> Self {
        Self::of(
            Code::InsufficientCredits,
            "the space has no AI credits left; add credits before writing to a schema with AI auto-fill",
        )
    }

    pub fn route_not_found() -> Self {
        Self::of(Code::RouteNotFound, "no such endpoint; see /v1/openapi.json")
    }

    pub fn method_not_allowed() -> Self {
        Self::of(Code::MethodNotAllowed, "this method is not allowed on this path")
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::of(Code::ServiceUnavailable, message)
    }

    /// A value of the request that the database refused to store (found past the edge's own
    /// checks, so it is logged: the edge should learn to refuse it).
    pub fn value_not_storable(cause: &str) -> Self {
        tracing::warn!(error = cause, "the database refused a value of a request");
        Self::of(
            Code::ValueNotStorable,
            "a value of this request cannot be stored (for example a NUL character or an over-long identifier); \
             change the input",
        )
    }

    /// A server failure. The cause is logged in full; the caller learns little.
    pub fn internal(cause: &anyhow::Error) -> Self {
        tracing::error!(error = format!("{cause:#}"), "internal error");
        Self::of(Code::InternalError, "internal server error")
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
        let error = ApiError::of(Code::RequiredAttributeMissing, "plan is required")
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

    /// The codes each response status of the document names (in its text, its examples or
    /// its enums), following the shared responses it refers to.
    fn documented_statuses() -> std::collections::BTreeMap<String, std::collections::BTreeSet<u16>> {
        use serde_json::Value;
        fn codes_in(value: &Value, responses: &Value, examples: &Value, found: &mut Vec<String>) {
            match value {
                Value::Object(object) => {
                    if let Some(Value::String(reference)) = object.get("$ref") {
                        let (shared, name) = match reference.rsplit_once('/') {
                            Some(("#/components/responses", name)) => (responses, name),
                            Some(("#/components/examples", name)) => (examples, name),
                            _ => return,
                        };
                        if let Some(target) = shared.get(name) {
                            codes_in(target, responses, examples, found);
                        }
                        return;
                    }
                    object.values().for_each(|value| codes_in(value, responses, examples, found));
                }
                Value::Array(values) => values.iter().for_each(|value| codes_in(value, responses, examples, found)),
                Value::String(text) => {
                    let ticked = text.split('`').skip(1).step_by(2);
                    found.extend(ticked.chain(std::iter::once(text.as_str())).map(str::to_owned));
                }
                _ => {}
            }
        }
        let document: Value = serde_json::from_str(include_str!("../../../docs/openapi.json")).expect("the document");
        let (responses, examples) = (&document["components"]["responses"], &document["components"]["examples"]);
        let mut statuses: std::collections::BTreeMap<String, std::collections::BTreeSet<u16>> = Default::default();
        for item in document["paths"].as_object().expect("paths").values() {
            for operation in item.as_object().expect("a path item").values() {
                let Some(answers) = operation.get("responses").and_then(Value::as_object) else { continue };
                for (status, answer) in answers {
                    let Ok(status) = status.parse::<u16>() else { continue };
                    let mut found = Vec::new();
                    codes_in(answer, responses, examples, &mut found);
                    for code in found {
                        statuses.entry(code).or_default().insert(status);
                    }
                }
            }
        }
        statuses
    }

    /// Codes that name a failed item or row inside a successful answer, never an answer's own
    /// status.
    const ITEM_CODES: &[Code] = &[Code::InvalidEventInput, Code::ConsentSourceRequired];

    #[test]
    fn every_codes_status_is_the_one_the_document_answers_it_with() {
        let documented = documented_statuses();
        assert!(documented.len() > 100, "the document's codes were read: {}", documented.len());
        let mut wrong = Vec::new();
        for code in Code::PUBLIC {
            if ITEM_CODES.contains(code) {
                continue;
            }
            let statuses = documented.get(code.as_str()).cloned().unwrap_or_default();
            if !statuses.contains(&code.status().as_u16()) {
                wrong.push(format!("{code}: the table says {}, the document {statuses:?}", code.status().as_u16()));
            }
        }
        for (code, second, _) in Code::SECOND_STATUSES {
            assert!(
                documented.get(code.as_str()).is_some_and(|statuses| statuses.contains(second)),
                "{code}'s second status {second} is documented"
            );
            assert_eq!(ApiError::of_second(*code, "x").status().as_u16(), *second);
        }
        assert!(wrong.is_empty(), "codes whose status the document does not give:\n{}", wrong.join("\n"));
        assert_eq!(
            ApiError::of(Code::FormDisabled, "x").status(),
            StatusCode::FORBIDDEN,
            "of answers the table's status"
        );
    }

    #[test]
    fn codeless_errors_have_null_code() {
        let error = ApiError::forbidden("Space is out of scope");
        assert_eq!(error.body()["error"]["code"], serde_json::Value::Null);
        assert_eq!(error.status(), StatusCode::FORBIDDEN);
    }
}
