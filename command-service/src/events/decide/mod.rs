//! Business event decisions: normalising a fire input against the event schema, what makes
//! two fires the same occurrence, which admission limit refuses an occurrence, and what a
//! fire appends (the decision a single fire and every item of a batch share). Pure: every
//! fact comes in as an argument.

pub(crate) mod batch;

use std::cell::Cell;
use std::collections::HashMap;

use domain::attributes::{default_value, has_auto_fill, is_required, is_writable, writable_value};
use domain::catalog::{AttributeEntry, SchemaEntry};
use domain::records::Loaded;
use platform::error::Code;
use platform::error::Issue;
use platform::events::LogEvent;
use platform::fresh::Fresh;
use platform::ids::SpaceId;
use platform::log::{ExpectedVersion, Guard, NewEvent, StreamAppend};
use platform::proto;
use platform::settings::ScopeLimits;
use serde_json::{Map, Value, json};

use crate::decision::{Decide, Given, Outcome, Reply};
use crate::events::store::{NewReceipt, Receipt, ScopeState, admission_guard, receipts_guard, subjects_guard};

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

/// Why a fire is refused. The HTTP edge maps each to the contract's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EventRefusal {
    /// The input (or a batch's body) does not fit; `issues` names every problem (400).
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
    /// The event needs preparation and the space has no AI credits (402).
    #[error("the space has no AI credits left; add credits before writing to a schema with AI auto-fill")]
    NoCredits,
    /// The subject the event names is not a record of that kind in the space (404).
    #[error("no {kind} {id:?} in this space")]
    SubjectNotFound { kind: &'static str, id: String },
    /// The subject the event names is being deleted (409).
    #[error("{kind} {id:?} is being deleted; it accepts no more events")]
    SubjectDeletionPending { kind: &'static str, id: String },
    /// The subject's deletion started before the append (409).
    #[error("the event's subject is being deleted; it accepts no more events")]
    SubjectDeleting,
    /// The occurrence is not admitted (429, with `Retry-After`).
    #[error("{}", .0.message())]
    NotAdmitted(AdmissionRefusal),
    /// Every attempt lost the race for the eventId (409).
    #[error("this eventId was being fired concurrently; retry")]
    Concurrent,
    /// Every attempt of a batch lost a race for its eventIds (409).
    #[error("eventIds of this batch were being fired concurrently; retry")]
    BatchConcurrent,
    /// The event's data could not be sealed under its subject's key (500).
    #[error("{0}")]
    Unsealable(String),
}

impl EventRefusal {
    /// An invalid input or batch body with no issue list.
    pub(crate) fn invalid(code: Code, message: impl Into<String>) -> Self {
        Self::Invalid { code, message: message.into(), issues: Vec::new() }
    }

    /// When to retry a refused admission.
    pub(crate) fn retry_after_ms(&self) -> Option<u64> {
        match self {
            Self::NotAdmitted(refusal) => Some(refusal.retry_after_ms()),
            _ => None,
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

/// Admission of new occurrences taken in order (`true` for one that needs preparation)
/// against the scopes' state: for each, the reason it would be refused once the earlier
/// admitted ones took their share, or `None`. The receipt cap is checked first, then the
/// backlog, then the rate, in every scope.
pub(crate) fn admitted_each(scopes: &[ScopeState], occurrences: &[bool]) -> Vec<Option<AdmissionRefusal>> {
    let mut scopes = scopes.to_vec();
    occurrences
        .iter()
        .map(|&needs_preparation| {
            let refusal = refusal_of(&scopes, needs_preparation);
            if refusal.is_none() {
                for scope in &mut scopes {
                    scope.tokens -= 1.0;
                    scope.receipts += 1;
                    scope.pending += i64::from(needs_preparation);
                }
            }
            refusal
        })
        .collect()
}

/// Why the scopes have no room for one more occurrence, if they have none.
fn refusal_of(scopes: &[ScopeState], needs_preparation: bool) -> Option<AdmissionRefusal> {
    if scopes.iter().any(|scope| scope.receipts + 1 > scope.limits.receipts) {
        return Some(AdmissionRefusal::ReceiptLimit);
    }
    if needs_preparation && scopes.iter().any(|scope| scope.pending + 1 > scope.limits.pending) {
        return Some(AdmissionRefusal::BacklogFull);
    }
    let wait = scopes
        .iter()
        .filter(|scope| scope.tokens < 1.0)
        .map(|scope| if scope.limits.rate > 0.0 { (1.0 - scope.tokens) / scope.limits.rate } else { f64::INFINITY })
        .fold(0.0_f64, f64::max);
    if wait > 0.0 {
        let retry_after_ms = if wait.is_finite() { (wait * 1000.0).ceil() as u64 } else { u64::MAX / 2 };
        return Some(AdmissionRefusal::RateLimited { retry_after_ms: retry_after_ms.max(1) });
    }
    None
}

/// The first of new occurrences taken in order ([`admitted_each`]) that would be refused, with
/// the reason.
pub(crate) fn first_refusal(scopes: &[ScopeState], occurrences: &[bool]) -> Option<(usize, AdmissionRefusal)> {
    admitted_each(scopes, occurrences).into_iter().enumerate().find_map(|(index, refusal)| refusal.map(|r| (index, r)))
}

/// A generated eventId: a random UUID (version 4).
pub(crate) fn generated_event_id(fresh: &mut dyn Fresh) -> String {
    fresh.uuid().to_string()
}

/// What every fire of a request decides on: the space, the event schema (its id, revision
/// and attributes), the space's AI credits and the admission scopes.
#[derive(Clone)]
pub(crate) struct FireContext {
    pub space_id: SpaceId,
    pub schema: SchemaEntry,
    pub attributes: Vec<AttributeEntry>,
    pub credits: i64,
    pub scopes: Vec<(String, ScopeLimits)>,
}

impl FireContext {
    /// What an input is parsed against.
    pub(crate) fn event_schema(&self) -> EventSchema<'_> {
        EventSchema { attributes: &self.attributes }
    }
}

/// A valid item, ready to be decided: its input and the keyed digest of its normalised
/// payload.
pub(crate) struct Candidate {
    pub input: FireInput,
    pub digest: String,
}

fn duplicate(receipt: &Receipt) -> Value {
    let mut body = receipt.receipt.clone();
    body["isDuplicate"] = Value::Bool(true);
    body
}

/// How an item stands against the receipt held under its eventId: the original receipt (a
/// duplicate), or why it is refused.
pub(crate) fn against_receipt(candidate: &Candidate, receipt: &Receipt) -> Result<Value, EventRefusal> {
    match compare_with_receipt(receipt.input_digest.as_deref(), receipt.subject_erased, &candidate.digest) {
        Earlier::Duplicate => Ok(duplicate(receipt)),
        Earlier::Conflict => Err(EventRefusal::IdConflict(candidate.input.event_id.clone())),
        Earlier::Erased => Err(EventRefusal::Erased(candidate.input.event_id.clone())),
    }
}

/// The live subject record the input names (`None`: no subject), or why the item cannot
/// name it. Its data key (absent for a record written before encryption) seals the event.
fn live_subject<'a>(
    input: &FireInput,
    space_id: &str,
    subjects: &'a HashMap<String, Loaded>,
) -> Result<Option<&'a Loaded>, EventRefusal> {
    let (id, kind) = match (&input.contact_id, &input.object_id) {
        (Some(id), _) => (id, "contact"),
        (None, Some(id)) => (id, "object"),
        (None, None) => return Ok(None),
    };
    match subjects.get(id) {
        Some(live @ Loaded::Live { state, .. }) if state.space_id == space_id && state.schema_type == kind => {
            Ok(Some(live))
        }
        Some(Loaded::Deleting { .. }) => Err(EventRefusal::SubjectDeletionPending { kind, id: id.clone() }),
        _ => Err(EventRefusal::SubjectNotFound { kind, id: id.clone() }),
    }
}

/// The log event and receipt of a new occurrence whose subject (if any) is in `subjects`.
pub(crate) fn new_occurrence(
    context: &FireContext,
    candidate: &Candidate,
    subjects: &HashMap<String, Loaded>,
    now_ms: i64,
    fresh: &mut dyn Fresh,
) -> Result<(StreamAppend, NewReceipt), EventRefusal> {
    let subject = live_subject(&candidate.input, &context.space_id, subjects)?;
    accepted(context, candidate, subject, now_ms, fresh)
}

/// The log event and receipt of a new occurrence; refused when it needs preparation and the
/// space has no credits (a duplicate recovers its receipt whatever the credits).
fn accepted(
    context: &FireContext,
    Candidate { input, digest, .. }: &Candidate,
    subject: Option<&Loaded>,
    now_ms: i64,
    fresh: &mut dyn Fresh,
) -> Result<(StreamAppend, NewReceipt), EventRefusal> {
    if !input.pending_keys.is_empty() && context.credits <= 0 {
        return Err(EventRefusal::NoCredits);
    }
    let id = fresh.id("ev");
    let values = Value::Object(input.values.clone()).to_string();
    let subject_id = input.subject().map(str::to_owned);
    let mut data =
        platform::events::seal(subject_id.as_deref().unwrap_or(&id), &proto::EventData { values_json: values });
    if let Some(Loaded::Live { key: Some(key), .. }) = subject {
        platform::events::encrypt(&mut data, key).map_err(|error| EventRefusal::Unsealable(format!("{error:#}")))?;
    }
    let occurred_at_ms = input.occurred_at_ms.unwrap_or(now_ms);
    let event = proto::EventAccepted {
        id: id.clone(),
        space_id: context.space_id.clone().into(),
        schema_id: context.schema.schema_id.clone(),
        event_id: input.event_id.clone(),
        occurred_at_ms,
        received_at_ms: now_ms,
        contact_id: input.contact_id.clone().unwrap_or_default(),
        object_id: input.object_id.clone().unwrap_or_default(),
        definition_revision: context.schema.revision,
        readiness: input.readiness().to_owned(),
        data: Some(data),
        pending_keys: input.pending_keys.clone(),
    };
    let receipt = json!({
        "accepted": 1,
        "id": id,
        "eventId": input.event_id,
        "isDuplicate": false,
        "readinessAtAcceptance": input.readiness(),
    });
    let stream = StreamAppend {
        stream_id: domain::business_events::stream_id(&id),
        expected: ExpectedVersion::NoStream,
        events: vec![NewEvent {
            event: LogEvent::EventAccepted(event),
            subject_id: subject_id.clone(),
            occurred_at: platform::time::from_millis(occurred_at_ms),
        }],
    };
    let new_receipt = NewReceipt {
        event_id: input.event_id.clone(),
        id,
        input_digest: digest.clone(),
        subject_id,
        receipt,
        pending: !input.pending_keys.is_empty(),
    };
    Ok((stream, new_receipt))
}

/// The streams and guards of some new occurrences, appended all or nothing.
pub(crate) fn acceptance_parts(
    context: &FireContext,
    new: Vec<(StreamAppend, NewReceipt)>,
) -> (Vec<StreamAppend>, Vec<Guard>) {
    let (streams, receipts): (Vec<StreamAppend>, Vec<NewReceipt>) = new.into_iter().unzip();
    let count = receipts.len() as i64;
    let pending = receipts.iter().filter(|receipt| receipt.pending).count() as i64;
    let subjects: Vec<String> = receipts.iter().filter_map(|receipt| receipt.subject_id.clone()).collect();
    let mut guards: Vec<Guard> = vec![receipts_guard(&context.space_id, &context.schema.schema_id, &receipts)];
    if !subjects.is_empty() {
        guards.push(subjects_guard(subjects));
    }
    // The catalog revision guard is the pipeline's, for the revision the load read at.
    guards.push(admission_guard(&context.scopes, count, pending));
    (streams, guards)
}

/// What one fire comes to.
pub(crate) enum Fired {
    /// The same occurrence as the receipt held under its eventId: that receipt (with
    /// `isDuplicate`); nothing is admitted.
    Duplicate(Value),
    /// A new occurrence: its stream and receipt.
    New(StreamAppend, NewReceipt),
}

/// What a fire is decided on beside its context.
pub(crate) struct Known<'a> {
    /// The receipt held under its eventId, if any.
    pub receipt: Option<&'a Receipt>,
    /// The records events name.
    pub subjects: &'a HashMap<String, Loaded>,
    /// The admission state of its scopes, once an append was refused admission.
    pub admission: Option<&'a [ScopeState]>,
}

/// The decision of one fire (a single one, or an item of a batch): a duplicate of the receipt
/// held under its eventId, or a new occurrence if admission (when its state is known) lets it
/// in.
pub(crate) fn decide_fire(
    context: &FireContext,
    candidate: &Candidate,
    known: Known<'_>,
    now_ms: i64,
    fresh: &mut dyn Fresh,
) -> Result<Fired, EventRefusal> {
    if let Some(receipt) = known.receipt {
        return against_receipt(candidate, receipt).map(Fired::Duplicate);
    }
    if let Some(scopes) = known.admission
        && let Some((_, refusal)) = first_refusal(scopes, &[!candidate.input.pending_keys.is_empty()])
    {
        return Err(EventRefusal::NotAdmitted(refusal));
    }
    let (stream, receipt) = new_occurrence(context, candidate, known.subjects, now_ms, fresh)?;
    Ok(Fired::New(stream, receipt))
}

/// `POST /events/{schema}`: a single fire. The first attempt at an occurrence about no record
/// appends before anything is looked up: its receipt's unique key and its admission guard
/// refuse exactly what the lookup would have found (a taken eventId) or admission would
/// refuse, and whatever is refused is decided again from the lookup. One round trip and one
/// transaction less per fire.
pub(crate) struct FireEvent {
    pub space_id: SpaceId,
    pub schema_ref: String,
    pub input: Map<String, Value>,
    /// An append was refused admission: the next attempt looks the receipt up (a duplicate
    /// costs nothing, even with an empty bucket) and reads the admission state.
    pub admission_refused: Cell<bool>,
}

/// What a fire decides on.
pub(crate) struct Fire {
    pub context: FireContext,
    /// The parsed input; a generated eventId is drawn when the fire is decided (until then
    /// it is empty, which names no receipt).
    pub candidate: Candidate,
    /// Receipts and subjects; `None`: not looked up (the optimistic first attempt).
    pub lookups: Option<(HashMap<String, Receipt>, HashMap<String, Loaded>)>,
    pub admission: Option<Vec<ScopeState>>,
}

impl Decide for FireEvent {
    type Loaded = Fire;
    type Outcome = Outcome;
    type Refusal = EventRefusal;

    fn decide(&self, fire: Fire, given: &mut Given<'_>) -> Result<Outcome, EventRefusal> {
        let Fire { context, mut candidate, lookups, admission } = fire;
        if candidate.input.generated_event_id {
            candidate.input.event_id = generated_event_id(given.fresh);
        }
        let no_subjects = HashMap::new();
        let (receipts, subjects) =
            lookups.as_ref().map_or((None, &no_subjects), |(receipts, subjects)| (Some(receipts), subjects));
        let known = Known {
            receipt: receipts.and_then(|receipts| receipts.get(&candidate.input.event_id)),
            subjects,
            admission: admission.as_deref(),
        };
        match decide_fire(&context, &candidate, known, given.now_ms, given.fresh) {
            Ok(Fired::Duplicate(receipt)) => Ok(Outcome::Answer(Reply::accepted(json!(receipt)))),
            Ok(Fired::New(stream, receipt)) => {
                let body = json!(receipt.receipt);
                let (streams, guards) = acceptance_parts(&context, vec![(stream, receipt)]);
                Ok(Outcome::append(streams, guards, Reply::accepted(body)))
            }
            // Without its receipt looked up, a refusal may be a duplicate's: decide again.
            Err(_) if lookups.is_none() => Ok(Outcome::Again),
            Err(refusal) => Err(refusal),
        }
    }
}

impl platform::refusal::Answered for EventRefusal {}

/// A refused fire as the contract answers it: an occurrence not admitted with `Retry-After`.
impl platform::refusal::Refusal for EventRefusal {
    fn code(&self) -> Code {
        match self {
            Self::Invalid { code, .. } => *code,
            Self::TooLarge(_) => Code::EventInputTooLarge,
            Self::IdConflict(_) => Code::EventIdConflict,
            Self::Erased(_) => Code::EventErased,
            Self::NoCredits => Code::InsufficientCredits,
            Self::SubjectNotFound { .. } => Code::RecordNotFound,
            Self::SubjectDeletionPending { .. } | Self::SubjectDeleting => Code::RecordDeletionPending,
            Self::NotAdmitted(refusal) => refusal.code(),
            Self::Concurrent | Self::BatchConcurrent => Code::ConcurrentModification,
            Self::Unsealable(_) => Code::InternalError,
        }
    }

    fn issues(&self) -> Vec<Issue> {
        match self {
            Self::Invalid { issues, .. } => issues.clone(),
            _ => Vec::new(),
        }
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::NotAdmitted(refusal) => platform::refusal::Refusal::headers(refusal),
            _ => Vec::new(),
        }
    }

    fn is_defect(&self) -> bool {
        matches!(self, Self::Unsealable(_))
    }
}

impl std::fmt::Display for AdmissionRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl platform::refusal::Answered for AdmissionRefusal {}

/// An occurrence not admitted: 429 with `Retry-After` in whole seconds (at least 1).
impl platform::refusal::Refusal for AdmissionRefusal {
    fn code(&self) -> Code {
        AdmissionRefusal::code(*self)
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        vec![("Retry-After", self.retry_after_ms().div_ceil(1000).max(1).to_string())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Status;
    use crate::decision::harness::{NOW_MS, given};
    use platform::refusal::Refusal as _;

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

    fn context(credits: i64) -> FireContext {
        FireContext {
            space_id: "spc_1".into(),
            schema: SchemaEntry {
                schema_id: "sch_1".into(),
                slug: "signup".into(),
                schema_type: "event".into(),
                doc: Value::Null,
                attribute_count: 5,
                revision: 3,
            },
            attributes: attributes(),
            credits,
            scopes: Vec::new(),
        }
    }

    /// A fire of `input` as its shell loads it (a generated eventId still empty), looked up
    /// with `receipts` unless `None`.
    fn fire(input: Value, receipts: Option<HashMap<String, Receipt>>) -> Fire {
        let context = context(5);
        let Value::Object(input) = input else { panic!("object") };
        let input = parse_fire(context.event_schema(), input, NOW_MS, String::new).expect("valid");
        let candidate = Candidate { input, digest: "digest".into() };
        let lookups = receipts.map(|receipts| (receipts, HashMap::new()));
        Fire { context, candidate, lookups, admission: None }
    }

    fn command() -> FireEvent {
        FireEvent {
            space_id: "spc_1".into(),
            schema_ref: "signup".into(),
            input: Map::new(),
            admission_refused: Cell::new(false),
        }
    }

    #[test]
    fn a_new_fire_is_accepted_under_fresh_ids_with_a_generated_event_id() {
        let loaded = fire(json!({"amount": 5, "summary": "given"}), None);
        let values = Value::Object(loaded.candidate.input.values.clone()).to_string();
        let event_id = &generated_event_id(&mut platform::fresh::Counted::new().expect("the test keys"));
        assert_eq!(uuid::Uuid::parse_str(event_id).map(|uuid| uuid.get_version_num()).ok(), Some(4));
        let reply = given(loaded).when(&command()).then_events(&[LogEvent::EventAccepted(proto::EventAccepted {
            id: "ev_2".into(),
            space_id: "spc_1".into(),
            schema_id: "sch_1".into(),
            event_id: event_id.into(),
            occurred_at_ms: NOW_MS,
            received_at_ms: NOW_MS,
            contact_id: String::new(),
            object_id: String::new(),
            definition_revision: 3,
            readiness: "ready".into(),
            data: Some(platform::events::seal("ev_2", &proto::EventData { values_json: values })),
            pending_keys: Vec::new(),
        })]);
        assert_eq!(reply.status, Status::Accepted);
        assert_eq!(
            reply.json(),
            json!({"data": {"accepted": 1, "id": "ev_2", "eventId": event_id, "isDuplicate": false,
                             "readinessAtAcceptance": "ready"}})
        );
    }

    #[test]
    fn a_retry_answers_the_original_receipt_and_changed_input_is_refused() {
        let receipt = |digest: &str| Receipt {
            id: "ev_0".into(),
            input_digest: Some(digest.into()),
            receipt: json!({"accepted": 1, "id": "ev_0", "eventId": "e1", "isDuplicate": false}),
            subject_erased: false,
        };
        let held = |digest: &str| Some(HashMap::from([("e1".to_owned(), receipt(digest))]));
        let input = json!({"eventId": "e1", "amount": 5, "summary": "given"});
        let reply = given(fire(input.clone(), held("digest"))).when(&command()).then_answers();
        assert_eq!((reply.status, &reply.json()["data"]["isDuplicate"]), (Status::Accepted, &json!(true)));
        assert_eq!(reply.json()["data"]["id"], "ev_0");
        given(fire(input, held("other"))).when(&command()).then_refused(EventRefusal::IdConflict("e1".into()));
    }

    #[test]
    fn a_fire_is_refused_without_credits_a_subject_or_admission() {
        let mut no_credits = fire(json!({"eventId": "e1", "amount": 5}), Some(HashMap::new()));
        no_credits.context.credits = 0;
        given(no_credits).when(&command()).then_refused(EventRefusal::NoCredits);
        let about =
            fire(json!({"eventId": "e1", "amount": 5, "summary": "s", "contactId": "con_1"}), Some(HashMap::new()));
        given(about)
            .when(&command())
            .then_refused(EventRefusal::SubjectNotFound { kind: "contact", id: "con_1".into() });
        let mut refused = fire(json!({"eventId": "e1", "amount": 5, "summary": "s"}), Some(HashMap::new()));
        refused.admission = Some(vec![scope(0.0, 0, 0)]);
        given(refused)
            .when(&command())
            .then_refused(EventRefusal::NotAdmitted(AdmissionRefusal::RateLimited { retry_after_ms: 200 }));
    }

    #[test]
    fn a_refusal_before_the_lookup_is_decided_again() {
        let mut optimistic = fire(json!({"eventId": "e1", "amount": 5}), None);
        optimistic.context.credits = 0;
        assert!(matches!(given(optimistic).when(&command()).decided(), Outcome::Again));
    }

    fn batch_command(on_error: batch::OnError) -> batch::FireBatch {
        batch::FireBatch {
            space_id: "spc_1".into(),
            schema_ref: "signup".into(),
            events: Vec::new(),
            on_error,
            admission_refused: Cell::new(false),
        }
    }

    /// A batch's item as its shell loads it: parsed, with `digest` as its input's digest.
    fn item(input: Value, digest: &str) -> Result<Candidate, EventRefusal> {
        let Value::Object(input) = input else { panic!("object") };
        let input = parse_fire(context(5).event_schema(), input, NOW_MS, String::new)?;
        Ok(Candidate { input, digest: digest.into() })
    }

    fn batch_of(items: Vec<Result<Candidate, EventRefusal>>) -> batch::Batch {
        let held = Receipt {
            id: "ev_0".into(),
            input_digest: Some("d0".into()),
            receipt: json!({"accepted": 1, "id": "ev_0", "eventId": "e0", "isDuplicate": false}),
            subject_erased: false,
        };
        let receipts = HashMap::from([("e0".to_owned(), held)]);
        batch::Batch { context: context(5), items, receipts, subjects: HashMap::new(), admission: None }
    }

    fn streams_of(outcome: &batch::BatchOutcome) -> Vec<&str> {
        match outcome {
            batch::BatchOutcome::Accepted { streams, .. } => {
                streams.iter().map(|stream| stream.stream_id.as_str()).collect()
            }
            batch::BatchOutcome::Aborted { .. } => Vec::new(),
        }
    }

    #[test]
    fn a_continuing_batch_appends_its_new_items_together_and_answers_each_on_its_own() {
        let invalid = || item(json!({"summary": "no amount"}), "d4");
        let loaded = batch_of(vec![
            item(json!({"eventId": "e1", "amount": 1}), "d1"),
            item(json!({"eventId": "e0", "amount": 0}), "d0"),
            item(json!({"eventId": "e1", "amount": 1}), "d1"),
            item(json!({"eventId": "e1", "amount": 2}), "d3"),
            invalid(),
            item(json!({"amount": 5}), "d5"),
        ]);
        let outcome = given(loaded).when(&batch_command(batch::OnError::Continue)).decided();
        assert_eq!(
            streams_of(&outcome),
            ["event/ev_1", "event/ev_3"],
            "the new occurrences, under fresh ids, in one append"
        );
        let batch::BatchOutcome::Accepted { items, guards, .. } = outcome else { panic!("accepted") };
        assert!(!guards.is_empty(), "the receipts' and admission's guards");
        let Err(invalid) = invalid() else { panic!("an invalid item") };
        assert!(matches!(&items[0], batch::Item::New(receipt) if receipt["eventId"] == "e1"));
        assert!(matches!(&items[1], batch::Item::Existing(receipt) if receipt["isDuplicate"] == true));
        assert_eq!(items[2], batch::Item::RepeatOf(0), "the same input again is a duplicate of the first");
        assert_eq!(items[3], batch::Item::Refused(EventRefusal::IdConflict("e1".into())));
        assert_eq!(items[4], batch::Item::Refused(invalid));
        let batch::Item::New(generated) = &items[5] else { panic!("a new occurrence") };
        assert_eq!(
            uuid::Uuid::parse_str(generated["eventId"].as_str().unwrap_or_default())
                .ok()
                .map(|id| id.get_version_num()),
            Some(4)
        );
    }

    #[test]
    fn an_aborting_batch_stops_at_its_first_failing_item_and_appends_nothing() {
        let loaded = batch_of(vec![
            item(json!({"eventId": "e1", "amount": 1}), "d1"),
            item(json!({"eventId": "e0", "amount": 0}), "d0"),
            item(json!({"eventId": "e0", "amount": 9}), "d2"),
            item(json!({"eventId": "e3", "amount": 3}), "d3"),
        ]);
        let outcome = given(loaded).when(&batch_command(batch::OnError::Abort)).decided();
        let batch::BatchOutcome::Aborted { items } = outcome else { panic!("aborted") };
        assert_eq!(items.len(), 3, "nothing after the failing item: {items:?}");
        assert!(matches!(items[0], batch::Item::New(_)));
        assert!(matches!(items[1], batch::Item::Existing(_)));
        assert_eq!(items[2], batch::Item::Refused(EventRefusal::IdConflict("e0".into())));
        let whole = batch_of(vec![item(json!({"eventId": "e1", "amount": 1}), "d1")]);
        let outcome = given(whole).when(&batch_command(batch::OnError::Abort)).decided();
        assert_eq!(streams_of(&outcome), ["event/ev_1"], "a batch without a failure appends");
    }

    #[test]
    fn once_admission_refused_the_items_over_the_limit_are_refused_in_the_batchs_order() {
        let items = || {
            vec![
                item(json!({"eventId": "e1", "amount": 1}), "d1"),
                item(json!({"eventId": "e2", "amount": 2}), "d2"),
                item(json!({"eventId": "e2", "amount": 2}), "d2"),
                item(json!({"eventId": "e0", "amount": 0}), "d0"),
            ]
        };
        let limited = || Some(vec![scope(1.5, 0, 0)]);
        let refused =
            batch::Item::Refused(EventRefusal::NotAdmitted(AdmissionRefusal::RateLimited { retry_after_ms: 100 }));
        let outcome = given(batch::Batch { admission: limited(), ..batch_of(items()) })
            .when(&batch_command(batch::OnError::Continue))
            .decided();
        assert_eq!(streams_of(&outcome), ["event/ev_1"], "only the admitted occurrence is appended");
        let batch::BatchOutcome::Accepted { items: decided, .. } = outcome else { panic!("accepted") };
        assert!(matches!(decided[0], batch::Item::New(_)));
        assert_eq!(decided[1..3], [refused.clone(), refused.clone()], "a repeat of a refused item is refused too");
        assert!(matches!(decided[3], batch::Item::Existing(_)), "a duplicate costs no capacity");

        let outcome = given(batch::Batch { admission: limited(), ..batch_of(items()) })
            .when(&batch_command(batch::OnError::Abort))
            .decided();
        let batch::BatchOutcome::Aborted { items: decided } = outcome else { panic!("aborted") };
        assert_eq!(decided.len(), 2);
        assert_eq!(decided[1], refused);
    }

    #[test]
    fn admission_in_order_refuses_what_has_no_room_and_lets_later_occurrences_that_fit_in() {
        let refusals = batch_admitted(&[scope(9.0, 2, 0)], &[true, false, true]);
        assert_eq!(refusals, [Some(AdmissionRefusal::BacklogFull), None, Some(AdmissionRefusal::BacklogFull)]);
        let refusals = batch_admitted(&[scope(2.0, 0, 0)], &[false, false, false]);
        assert_eq!(refusals[..2], [None, None]);
        assert!(matches!(refusals[2], Some(AdmissionRefusal::RateLimited { .. })));
        assert_eq!(first_refusal(&[scope(2.0, 0, 0)], &[false, false, false]).map(|(index, _)| index), Some(2));
    }

    fn batch_admitted(scopes: &[ScopeState], occurrences: &[bool]) -> Vec<Option<AdmissionRefusal>> {
        admitted_each(scopes, occurrences)
    }
}
