//! The contract's error envelope `{error: {type, code, message, issues?}}`, used by every
//! service for every failure. The codes, issues and warnings are `kernel::error`'s,
//! re-exported here.

use http::StatusCode;
use serde_json::json;

pub use kernel::error::{Code, Issue, Warning};

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
