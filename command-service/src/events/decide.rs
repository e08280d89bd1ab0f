//! Business event decisions: normalising a fire input against the event schema, what makes
//! two fires the same occurrence, and which admission limit refuses an occurrence. Pure:
//! every fact comes in as an argument.

use domain::attributes::{default_value, has_auto_fill, is_required, is_writable, writable_value};
use domain::catalog::AttributeEntry;
use platform::error::Code;
use platform::error::Issue;
use platform::settings::ScopeLimits;
use serde_json::{Map, Value, json};

/// The normalised input of one event may not exceed this (the contract: 256 KiB).
pub const MAX_INPUT_BYTES: usize = 256 * 1024;
/// The longest caller-owned `eventId`.
pub(crate) const MAX_EVENT_ID_CHARS: usize = 256;
/// An explicit `occurredAt` may be at most this old...
pub(crate) const MAX_AGE_MS: i64 = 366 * 24 * 3600 * 1000;
/// ...and at most this far ahead of acceptance.
pub(crate) const MAX_AHEAD_MS: i64 = 5 * 60 * 1000;

/// Fields the platform sets on an event; an input that sets them is refused.
pub(crate) const RESERVED_FIELDS: &[&str] = &[
    "readinessState",
    "readinessAtAcceptance",
    "readyAt",
    "receivedAt",
    "createdAt",
    "definitionRevision",
    "isDuplicate",
    "schemaId",
    "schemaSlug",
];

/// What the decision needs of the event schema.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventSchema<'a> {
    pub attributes: &'a [AttributeEntry],
}

/// A validated fire input.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FireInput {
    /// The caller's occurrence id, or a generated UUID.
    pub event_id: String,
    /// Whether `event_id` was generated (a fire without one is always a new occurrence).
    pub generated_event_id: bool,
    /// The explicit `occurredAt` in milliseconds; `None` means "at acceptance".
    pub occurred_at_ms: Option<i64>,
    pub contact_id: Option<String>,
    pub object_id: Option<String>,
    /// Every writable attribute: given values normalised, defaults applied, absent ones null.
    pub values: Map<String, Value>,
    /// Auto-fill attributes without a value: prepared asynchronously, so the event is
    /// accepted `pending`.
    pub pending_keys: Vec<String>,
}

impl FireInput {
    /// The subject record the event names, if any.
    pub(crate) fn subject(&self) -> Option<&str> {
        self.contact_id.as_deref().or(self.object_id.as_deref())
    }

    /// The normalised payload that decides whether a retry is the same occurrence: values,
    /// subject and `occurredAt` as given (an omitted one matches an omitted one).
    pub(crate) fn normalized(&self) -> Value {
        json!({
            "values": self.values,
            "contactId": self.contact_id,
            "objectId": self.object_id,
            "occurredAt": self.occurred_at_ms,
        })
    }

    pub(crate) fn readiness(&self) -> &'static str {
        if self.pending_keys.is_empty() { "ready" } else { "pending" }
    }
}

fn optional_string(key: &str, value: Value) -> Result<Option<String>, Issue> {
    match value {
        Value::Null => Ok(None),
        Value::String(text) if !text.trim().is_empty() => Ok(Some(text)),
        _ => Err(Issue::coded(key, Code::InvalidAttributeValue, format!("{key} must be a non-empty string or null"))),
    }
}

fn parse_occurred_at(value: Value, now_ms: i64) -> Result<Option<i64>, Issue> {
    let text = match value {
        Value::Null => return Ok(None),
        Value::String(text) => text,
        _ => {
            return Err(Issue::coded(
                "occurredAt",
                Code::InvalidOccurredAt,
                "occurredAt must be an RFC 3339 date-time",
            ));
        }
    };
    let at = chrono::DateTime::parse_from_rfc3339(&text).map_err(|_| {
        Issue::coded("occurredAt", Code::InvalidOccurredAt, format!("occurredAt {text:?} is not an RFC 3339 date-time"))
    })?;
    let ms = at.timestamp_millis();
    if ms < now_ms - MAX_AGE_MS {
        return Err(Issue::coded(
            "occurredAt",
            Code::InvalidOccurredAt,
            "occurredAt is more than 366 days in the past",
        ));
    }
    if ms > now_ms + MAX_AHEAD_MS {
        return Err(Issue::coded(
            "occurredAt",
            Code::InvalidOccurredAt,
            "occurredAt is more than 5 minutes in the future",
        ));
    }
    Ok(Some(ms))
}

/// Why a fire is refused (admission aside: see [`AdmissionRefusal`]). The HTTP edge maps each to the
/// contract's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EventRefusal {
    /// The input does not fit the event schema; `issues` names every problem (400).
    #[error("{message}")]
    Invalid { code: Code, message: String, issues: Vec<Issue> },
    /// The normalised input is over 256 KiB (400).
    #[error("the normalised event input is {0} bytes; the limit is {MAX_INPUT_BYTES} (256 KiB)")]
    TooLarge(usize),
    /// Changed input under a used eventId (409).
    #[error("eventId {0:?} was already used for an occurrence with different input or occurredAt")]
    IdConflict(String),
    /// The occurrence's subject was erased (409).
    #[error("the occurrence {0:?} was erased; it cannot be accepted again")]
    Erased(String),
}

impl EventRefusal {
    pub(crate) fn code(&self) -> Code {
        match self {
            Self::Invalid { code, .. } => *code,
            Self::TooLarge(_) => Code::EventInputTooLarge,
            Self::IdConflict(_) => Code::EventIdConflict,
            Self::Erased(_) => Code::EventErased,
        }
    }
}

/// Validates and normalises a flat fire input. `generate_id` supplies the `eventId` when it
/// is omitted or null. A body `id` is ignored.
pub(crate) fn parse_fire(
    schema: EventSchema<'_>,
    input: Map<String, Value>,
    now_ms: i64,
    generate_id: impl FnOnce() -> String,
) -> Result<FireInput, EventRefusal> {
    let mut issues = Vec::new();
    let mut event_id = None;
    let mut occurred_at_ms = None;
    let (mut contact_id, mut object_id) = (None, None);
    let mut given = Map::new();
    for (key, value) in input {
        match key.as_str() {
            "id" => {}
            "eventId" => match optional_string("eventId", value) {
                Ok(Some(id)) if id.chars().count() > MAX_EVENT_ID_CHARS => issues.push(Issue::coded(
                    "eventId",
                    Code::InvalidAttributeValue,
                    format!("eventId must be at most {MAX_EVENT_ID_CHARS} characters"),
                )),
                Ok(id) => event_id = id,
                Err(issue) => issues.push(issue),
            },
            "occurredAt" => match parse_occurred_at(value, now_ms) {
                Ok(at) => occurred_at_ms = at,
                Err(issue) => issues.push(issue),
            },
            "contactId" => match optional_string("contactId", value) {
                Ok(id) => contact_id = id,
                Err(issue) => issues.push(issue),
            },
            "objectId" => match optional_string("objectId", value) {
                Ok(id) => object_id = id,
                Err(issue) => issues.push(issue),
            },
            reserved if RESERVED_FIELDS.contains(&reserved) => issues.push(Issue::coded(
                &key,
                Code::ReservedField,
                format!("{key} is set by the platform and cannot be given"),
            )),
            _ => {
                given.insert(key, value);
            }
        }
    }
    if contact_id.is_some() && object_id.is_some() {
        issues.push(Issue::coded(
            "objectId",
            Code::InvalidEventSubject,
            "contactId and objectId are mutually exclusive; name at most one subject",
        ));
    }
    let mut values = Map::new();
    // A given value that was refused is reported once, by its own issue: the attribute is
    // not also missing.
    let mut refused_keys = Vec::new();
    for (key, value) in given {
        match writable_value(schema.attributes, &key, value) {
            Ok(normalized) => {
                values.insert(key, normalized);
            }
            Err(issue) => {
                issues.push(issue);
                refused_keys.push(key);
            }
        }
    }
    let mut pending_keys = Vec::new();
    for attribute in schema.attributes.iter().filter(|a| is_writable(&a.definition)) {
        if values.get(&attribute.key).is_some_and(|value| !value.is_null()) || refused_keys.contains(&attribute.key) {
            continue;
        }
        if has_auto_fill(&attribute.definition) {
            pending_keys.push(attribute.key.clone());
            values.insert(attribute.key.clone(), Value::Null);
        } else if let Some(default) = default_value(&attribute.definition) {
            values.insert(attribute.key.clone(), default.clone());
        } else if is_required(&attribute.definition) {
            issues.push(Issue::coded(
                &attribute.key,
                Code::RequiredAttributeMissing,
                format!("{} is required", attribute.key),
            ));
        } else {
            values.insert(attribute.key.clone(), Value::Null);
        }
    }
    if let Some(first) = issues.first() {
        let (code, message) = (first.code.unwrap_or(Code::InvalidEventInput), first.message.clone());
        return Err(EventRefusal::Invalid { code, message, issues });
    }
    let (generated_event_id, event_id) = match event_id {
        Some(id) => (false, id),
        None => (true, generate_id()),
    };
    let parsed =
        FireInput { event_id, generated_event_id, occurred_at_ms, contact_id, object_id, values, pending_keys };
    let size = crate::canonical::canonical_json(&parsed.normalized()).len();
    if size > MAX_INPUT_BYTES {
        return Err(EventRefusal::TooLarge(size));
    }
    Ok(parsed)
}

/// What an earlier receipt under the same eventId means for a fire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Earlier {
    /// The same occurrence: answer the original receipt, admit nothing.
    Duplicate,
    /// Changed input under a used eventId: 409 `event_id_conflict`.
    Conflict,
    /// The occurrence's subject was erased (or is being erased): 409 `event_erased`.
    Erased,
}

/// Compares a fire with the receipt already held under its eventId.
pub(crate) fn compare_with_receipt(input_digest: Option<&str>, subject_erased: bool, digest: &str) -> Earlier {
    match input_digest {
        _ if subject_erased => Earlier::Erased,
        None => Earlier::Erased,
        Some(earlier) if earlier == digest => Earlier::Duplicate,
        Some(_) => Earlier::Conflict,
    }
}

/// A scope's admission state as the database holds it, refilled to now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ScopeState {
    pub limits: ScopeLimits,
    /// Tokens available now (after refill, capped at the burst).
    pub tokens: f64,
    pub pending: i64,
    pub receipts: i64,
}

/// Why an occurrence is not admitted, and when to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AdmissionRefusal {
    /// 429 `event_rate_limited`, after the computed delay.
    RateLimited { retry_after_ms: u64 },
    /// 429 `event_backlog_full`: retry in 30 s.
    BacklogFull,
    /// 429 `event_receipt_limit`: retry in an hour, once receipts have retired.
    ReceiptLimit,
}

impl AdmissionRefusal {
    pub(crate) const BACKLOG_RETRY_MS: u64 = 30_000;
    pub(crate) const RECEIPT_RETRY_MS: u64 = 3_600_000;

    pub(crate) fn retry_after_ms(self) -> u64 {
        match self {
            Self::RateLimited { retry_after_ms } => retry_after_ms,
            Self::BacklogFull => Self::BACKLOG_RETRY_MS,
            Self::ReceiptLimit => Self::RECEIPT_RETRY_MS,
        }
    }

    pub(crate) fn code(self) -> Code {
        match self {
            Self::RateLimited { .. } => Code::EventRateLimited,
            Self::BacklogFull => Code::EventBacklogFull,
            Self::ReceiptLimit => Code::EventReceiptLimit,
        }
    }

    pub(crate) fn message(self) -> String {
        match self {
            Self::RateLimited { retry_after_ms } => {
                format!("event admission rate exceeded; retry in {retry_after_ms} ms")
            }
            Self::BacklogFull => "too many events are pending preparation; retry in 30 seconds".to_owned(),
            Self::ReceiptLimit => {
                "the retained-receipt limit is reached; retry in an hour, once older receipts have retired".to_owned()
            }
        }
    }
}

/// Walks new occurrences in order (`true` for one that needs preparation) against the scopes'
/// state and returns the first that would be refused, with the reason. The receipt cap is
/// checked first, then the backlog, then the rate, in every scope.
pub(crate) fn first_refusal(scopes: &[ScopeState], occurrences: &[bool]) -> Option<(usize, AdmissionRefusal)> {
    let mut scopes = scopes.to_vec();
    for (index, needs_preparation) in occurrences.iter().enumerate() {
        if scopes.iter().any(|scope| scope.receipts + 1 > scope.limits.receipts) {
            return Some((index, AdmissionRefusal::ReceiptLimit));
        }
        if *needs_preparation && scopes.iter().any(|scope| scope.pending + 1 > scope.limits.pending) {
            return Some((index, AdmissionRefusal::BacklogFull));
        }
        let wait = scopes
            .iter()
            .filter(|scope| scope.tokens < 1.0)
            .map(|scope| if scope.limits.rate > 0.0 { (1.0 - scope.tokens) / scope.limits.rate } else { f64::INFINITY })
            .fold(0.0_f64, f64::max);
        if wait > 0.0 {
            let retry_after_ms = if wait.is_finite() { (wait * 1000.0).ceil() as u64 } else { u64::MAX / 2 };
            return Some((index, AdmissionRefusal::RateLimited { retry_after_ms: retry_after_ms.max(1) }));
        }
        for scope in &mut scopes {
            scope.tokens -= 1.0;
            scope.receipts += 1;
            if *needs_preparation {
                scope.pending += 1;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attributes() -> Vec<AttributeEntry> {
        vec![
            AttributeEntry { key: "plan".into(), definition: json!({"type": "string"}) },
            AttributeEntry { key: "amount".into(), definition: json!({"type": "number", "required": true}) },
            AttributeEntry { key: "channel".into(), definition: json!({"type": "string", "default": "web"}) },
            AttributeEntry {
                key: "summary".into(),
                definition: json!({"type": "string", "autoFill": {"enabled": true, "prompt": "summary"}}),
            },
            AttributeEntry { key: "score".into(), definition: json!({"type": "evaluated"}) },
        ]
    }

    fn parse(input: Value) -> Result<FireInput, EventRefusal> {
        let attributes = attributes();
        let Value::Object(input) = input else { panic!("object") };
        parse_fire(EventSchema { attributes: &attributes }, input, 1_000_000_000_000, || "generated".into())
    }

    #[test]
    fn a_valid_input_is_normalised_with_defaults_and_pending_auto_fill() {
        let parsed = parse(json!({"eventId": "e1", "amount": 5, "id": "ignored", "contactId": "con_1"})).expect("ok");
        assert_eq!(parsed.event_id, "e1");
        assert!(!parsed.generated_event_id);
        assert_eq!(parsed.values["channel"], "web");
        assert_eq!(parsed.values["plan"], Value::Null);
        assert_eq!(parsed.pending_keys, ["summary"]);
        assert_eq!(parsed.readiness(), "pending");
        assert_eq!(parsed.subject(), Some("con_1"));
        let given = parse(json!({"amount": 5, "summary": "given"})).expect("ok");
        assert!(given.pending_keys.is_empty());
        assert_eq!(given.event_id, "generated");
        assert!(given.generated_event_id);
    }

    #[test]
    fn invalid_inputs_are_refused_with_their_codes() {
        let code = |input: Value| parse(input).err().map(|refusal| refusal.code());
        assert_eq!(code(json!({})), Some(Code::RequiredAttributeMissing));
        assert_eq!(code(json!({"amount": 1, "readinessState": "ready"})), Some(Code::ReservedField));
        assert_eq!(code(json!({"amount": 1, "nope": 1})), Some(Code::UnknownAttribute));
        assert_eq!(code(json!({"amount": 1, "score": 1})), Some(Code::AttributeNotWritable));
        assert_eq!(code(json!({"amount": "x"})), Some(Code::InvalidAttributeValue));
        // A required attribute given with the wrong type is invalid, not also missing.
        let Err(EventRefusal::Invalid { issues, .. }) = parse(json!({"amount": "ten"})) else {
            panic!("a wrong-typed required attribute is refused")
        };
        let codes: Vec<_> = issues.iter().map(|issue| issue.code).collect();
        assert_eq!(codes, [Some(Code::InvalidAttributeValue)]);
        assert_eq!(
            code(json!({"amount": 1, "contactId": "con_1", "objectId": "obj_1"})),
            Some(Code::InvalidEventSubject)
        );
        assert_eq!(code(json!({"amount": 1, "eventId": 7})), Some(Code::InvalidAttributeValue));
        assert_eq!(code(json!({"amount": 1, "eventId": "x".repeat(257)})), Some(Code::InvalidAttributeValue));
        assert_eq!(code(json!({"amount": 1, "plan": "x".repeat(MAX_INPUT_BYTES)})), Some(Code::EventInputTooLarge));
    }

    #[test]
    fn occurred_at_must_lie_within_366_days_back_and_5_minutes_ahead() {
        let now = 1_000_000_000_000_i64;
        let at = |ms: i64| platform::time::format_millis(ms);
        let code = |input: Value| parse(input).err().map(|refusal| refusal.code());
        assert_eq!(code(json!({"amount": 1, "occurredAt": at(now - MAX_AGE_MS - 1)})), Some(Code::InvalidOccurredAt));
        assert_eq!(code(json!({"amount": 1, "occurredAt": at(now + MAX_AHEAD_MS + 1)})), Some(Code::InvalidOccurredAt));
        assert_eq!(code(json!({"amount": 1, "occurredAt": "yesterday"})), Some(Code::InvalidOccurredAt));
        let parsed = parse(json!({"amount": 1, "occurredAt": at(now - MAX_AGE_MS + 1000)})).expect("in range");
        assert_eq!(parsed.occurred_at_ms, Some(now - MAX_AGE_MS + 1000));
        assert!(parse(json!({"amount": 1, "occurredAt": at(now + MAX_AHEAD_MS)})).is_ok());
    }

    #[test]
    fn the_normalised_payload_ignores_key_order_and_the_event_id() {
        let a = parse(json!({"eventId": "a", "amount": 1, "plan": "pro"})).expect("ok");
        let b = parse(json!({"plan": "pro", "amount": 1.0, "eventId": "b"})).expect("ok");
        let canonical = |input: &FireInput| crate::canonical::canonical_json(&input.normalized());
        assert_ne!(canonical(&a), canonical(&b), "1 and 1.0 are different JSON numbers");
        let c = parse(json!({"plan": "pro", "amount": 1, "eventId": "c"})).expect("ok");
        assert_eq!(canonical(&a), canonical(&c));
        let d = parse(json!({"plan": "pro", "amount": 2, "eventId": "a"})).expect("ok");
        assert_ne!(canonical(&a), canonical(&d));
    }

    #[test]
    fn earlier_receipts_decide_duplicate_conflict_or_erased() {
        assert_eq!(compare_with_receipt(Some("d"), false, "d"), Earlier::Duplicate);
        assert_eq!(compare_with_receipt(Some("d"), false, "x"), Earlier::Conflict);
        assert_eq!(compare_with_receipt(Some("d"), true, "d"), Earlier::Erased);
        assert_eq!(compare_with_receipt(None, false, "d"), Earlier::Erased);
    }

    fn scope(tokens: f64, pending: i64, receipts: i64) -> ScopeState {
        ScopeState {
            limits: ScopeLimits { rate: 5.0, burst: 15.0, pending: 2, receipts: 10 },
            tokens,
            pending,
            receipts,
        }
    }

    #[test]
    fn refusals_name_the_first_occurrence_over_a_limit() {
        assert_eq!(first_refusal(&[scope(3.0, 0, 0)], &[false, false, false]), None);
        assert_eq!(
            first_refusal(&[scope(2.5, 0, 0)], &[false, false, false]),
            Some((2, AdmissionRefusal::RateLimited { retry_after_ms: 100 }))
        );
        assert_eq!(first_refusal(&[scope(9.0, 1, 0)], &[false, true, true]), Some((2, AdmissionRefusal::BacklogFull)));
        assert_eq!(first_refusal(&[scope(9.0, 0, 9)], &[false, false]), Some((1, AdmissionRefusal::ReceiptLimit)));
        // The strictest scope decides the delay.
        let slow = ScopeState { limits: ScopeLimits { rate: 1.0, ..scope(0.0, 0, 0).limits }, ..scope(0.5, 0, 0) };
        assert_eq!(
            first_refusal(&[scope(0.0, 0, 0), slow], &[false]),
            Some((0, AdmissionRefusal::RateLimited { retry_after_ms: 500 }))
        );
    }

    #[test]
    fn refusals_say_when_to_retry() {
        let refusal = AdmissionRefusal::RateLimited { retry_after_ms: 1200 };
        assert_eq!((refusal.code(), refusal.retry_after_ms()), (Code::EventRateLimited, 1200));
        assert_eq!(AdmissionRefusal::BacklogFull.retry_after_ms(), 30_000);
        assert_eq!(AdmissionRefusal::ReceiptLimit.retry_after_ms(), 3_600_000);
    }
}
