//! The pure parts of a send: what the body may hold, the context it must give, who may
//! receive marketing mail, and the transactional send's decision.

use std::collections::BTreeMap;
use std::sync::Arc;

use domain::catalog::{AttributeEntry, WriteContext};
use domain::email::resources::TemplateDef;
use mail::facts::SendFacts;
use mail::outbox::Prepared;
use mail::send::{self, Authored, EmailTo, Gate, Site};
use platform::error::{Code, Issue};
use platform::ids::{EmailId, SpaceId};
use platform::log::{Guard, StreamAppend};
use serde_json::{Map, Value, json};

use crate::decision::{Decide, Given, Outcome, Reply};
use crate::records::decide::{self as records, PlannedUpsert, UpsertLoaded};

/// Fields a caller might try in order to replace stored content; refused with 400.
const CONTENT_FIELDS: &[&str] = &["subject", "html", "text", "body", "content", "from", "sender", "to", "replyTo"];

/// Why a template send is refused. The HTTP edge maps each to the contract's answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// No such template in the caller's space (404 `template_not_found`).
    #[error("no template {0:?} in this space")]
    NotFound(String),
    /// The body names a content field (400 `template_content_not_accepted`).
    #[error("{0:?} cannot be given: the stored template's content is sent as authored")]
    ContentNotAccepted(String),
    /// The body has a field other than `data` (400 `unknown_field`).
    #[error("unknown field {0:?}; the body is {{data: {{...}}}}")]
    UnknownField(String),
    /// A preview's field is not what it may be (400 `invalid_field`).
    #[error("{message}")]
    InvalidField { field: String, message: String },
    /// A preview's `contactId` is no contact of the template's recipient schema in the space
    /// (404 `record_not_found`).
    #[error("no contact {0:?} of the template's recipient schema in this space")]
    ContactNotFound(String),
    /// The context is not what the template expects; `issues` names the keys (400
    /// `invalid_template_data`).
    #[error("{message}")]
    InvalidData { message: String, issues: Vec<Issue> },
    /// The send decision refused the recipient (D9, D11): a contact without an address is a
    /// 400 `recipient_missing`, every other gate 422 with its code; nothing was sent.
    #[error("{}; nothing was sent", .0.reason())]
    Gate(Gate),
    /// The space's send policy skips the send (422 `frequency_capped` or `quiet_hours`):
    /// which rule, and when a send would be allowed.
    #[error(
        "{}: {}; a send is allowed from {}; nothing was sent",
        .gate.reason(),
        .reason.description,
        platform::time::format_millis(.reason.allowed_at_ms)
    )]
    Policy { gate: Gate, reason: send::SkipReason },
    /// The template does not render with this context (422 `template_render_failed`).
    #[error("the template does not render: {0}")]
    RenderFailed(String),
    /// The space's allowance of the month is used up (402 `email_limit_reached`).
    #[error("the space's email allowance for this month is used up; nothing was sent")]
    EmailLimitReached,
    /// The context records kept changing while the send was applied (409).
    #[error("the context records kept changing while the send was applied; retry")]
    KeptChanging,
    /// A context record's write could not be assembled (the record write's answer).
    #[error(transparent)]
    Record(#[from] records::Refusal),
    /// A send that cannot be decided on what was loaded, or whose content cannot be sealed
    /// (500).
    #[error("{0}")]
    Failed(String),
}

/// The context of a send body `{data: {<key>: {...}}}`: each key's record input.
pub fn context(body: &Map<String, Value>) -> Result<BTreeMap<String, Map<String, Value>>, Refusal> {
    if let Some(field) = body.keys().find(|key| CONTENT_FIELDS.contains(&key.as_str())) {
        return Err(Refusal::ContentNotAccepted(field.clone()));
    }
    if let Some(field) = body.keys().find(|key| *key != "data") {
        return Err(Refusal::UnknownField(field.clone()));
    }
    let Some(Value::Object(data)) = body.get("data") else {
        return Err(invalid("data", "data must be an object of context records, one per key the template expects"));
    };
    data.iter()
        .map(|(key, value)| match value {
            Value::Object(record) => Ok((key.clone(), record.clone())),
            _ => Err(invalid(&format!("data.{key}"), "each context value is an object of the record's fields")),
        })
        .collect()
}

fn invalid(field: &str, message: &str) -> Refusal {
    Refusal::InvalidData { message: message.to_owned(), issues: vec![Issue::for_key(field, message)] }
}

/// Every key the template expects is given, and nothing else.
pub(crate) fn check_keys(
    template: &TemplateDef,
    context: &BTreeMap<String, Map<String, Value>>,
) -> Result<(), Refusal> {
    let mut issues = Vec::new();
    for key in context.keys().filter(|key| !template.data.contains_key(*key)) {
        let expected: Vec<&str> = template.data.keys().map(String::as_str).collect();
        issues.push(Issue::for_key(
            format!("data.{key}"),
            format!("the template does not expect {key:?}; it expects {}", expected.join(", ")),
        ));
    }
    for (key, expected) in template.data.iter().filter(|(key, _)| !context.contains_key(*key)) {
        issues.push(Issue::for_key(
            format!("data.{key}"),
            format!("the template expects a record of schema {:?} under {key:?}", expected.schema_slug),
        ));
    }
    if issues.is_empty() {
        return Ok(());
    }
    Err(Refusal::InvalidData { message: "the context does not match what the template expects".to_owned(), issues })
}

/// The Liquid context: each key's record document, with every attribute of its schema
/// present (null when unset) so a template may name any of them.
pub(crate) fn render_context(documents: &BTreeMap<String, (Value, Vec<String>)>) -> Value {
    let mut context = Map::new();
    for (key, (document, attribute_keys)) in documents {
        let mut document = document.as_object().cloned().unwrap_or_default();
        for attribute in attribute_keys {
            document.entry(attribute.clone()).or_insert(Value::Null);
        }
        context.insert(key.clone(), Value::Object(document));
    }
    Value::Object(context)
}

/// A context record as loaded: its schema's write context and what its upsert reads.
pub(crate) struct ContextRecord {
    pub context: Arc<WriteContext>,
    pub upsert: UpsertLoaded,
}

/// A context record planned: its upsert and its schema's attributes.
struct Planned {
    upsert: PlannedUpsert,
    attributes: Vec<AttributeEntry>,
}

/// What is read about the recipient before its upsert is decided, for every contact and
/// address it may turn out to be: the contact its identities (or `id`) matched, or a new
/// one, which has no subscriptions and no sends; the address the send gives, or the one the
/// contact has.
#[derive(Default)]
pub(crate) struct RecipientFacts {
    /// The contact the recipient's upsert matched.
    pub matched: Option<String>,
    /// The addresses the facts were read for.
    pub addresses: Vec<String>,
    pub facts: SendFacts,
}

impl RecipientFacts {
    /// The recipient the send's upsert decided (`planned`, whose attribute values are
    /// `values`) as the send decision reads it: a decided address the facts were not read
    /// for is a defect.
    fn contact<'a>(
        &'a self,
        planned: &'a Planned,
        values: &'a Map<String, Value>,
        authored: &'a Authored,
    ) -> Result<send::Contact<'a>, Refusal> {
        let RecipientFacts { matched, addresses, facts } = self;
        let record = &planned.upsert.record;
        let address = record
            .personal
            .as_ref()
            .and_then(|personal| personal.email.as_deref())
            .filter(|address| !address.is_empty());
        if let Some(address) = address.filter(|address| !addresses.iter().any(|read| read == address)) {
            return Err(Refusal::Failed(format!("the recipient's address {address:?} was not read")));
        }
        // A new contact has no subscriptions and no sends.
        let known = matched.as_deref() == Some(record.record_id.as_str());
        let zone_attribute = authored.policy.as_ref().and_then(|policy| policy.time_zone.attribute.as_ref());
        Ok(send::Contact {
            address,
            suppressed: address.is_some_and(|address| facts.suppressed.contains(address)),
            consent: send::email_consent(&send::consent_keys(&planned.attributes), |key| values.get(key)),
            subscription: match (&authored.template.topic_id, known) {
                (Some(topic_id), true) => facts
                    .subscriptions
                    .get(&record.record_id)
                    .and_then(|topics| topics.get(topic_id))
                    .map(String::as_str),
                _ => None,
            },
            zone: zone_attribute.and_then(|attribute| values.get(attribute)).and_then(Value::as_str),
            sent: match known {
                true => facts.sent.get(&record.record_id).map(Vec::as_slice).unwrap_or_default(),
                false => &[],
            },
        })
    }
}

/// What a send decides on.
pub(crate) struct Loaded {
    pub authored: Arc<Authored>,
    /// Each key's context record.
    pub context: BTreeMap<String, ContextRecord>,
    pub recipient: RecipientFacts,
}

/// `POST /templates/{templateId}/send`.
pub(crate) struct SendTemplate<'a> {
    pub space_id: SpaceId,
    pub template_id: String,
    pub context: BTreeMap<String, Map<String, Value>>,
    /// Where the unsubscribe and tracking links point.
    pub site: &'a Site,
}

/// What a send decided.
pub(crate) enum Sent {
    /// Held by the send policy: stored now, decided again at its time; the answer is final
    /// (the claim completes with it).
    Held(Outcome),
    /// Appended, then handed to the relay inline.
    HandOff(Box<HandOff>),
}

/// A send to append and hand off. The append also inserts the email's outbox row (after
/// `guards`, before `allowance`), which holds the send's claim: the hand-off records the
/// answer.
pub(crate) struct HandOff {
    pub streams: Vec<StreamAppend>,
    /// The context records' guards and the email's own.
    pub guards: Vec<Guard>,
    /// The count against the space's allowance, when it has one.
    pub allowance: Option<Guard>,
    pub email_id: EmailId,
    /// What the hand-off sends.
    pub prepared: Prepared,
}

impl Decide for SendTemplate<'_> {
    type Loaded = Loaded;
    type Outcome = Sent;
    type Refusal = Refusal;

    fn decide(&self, loaded: Loaded, given: &mut Given<'_>) -> Result<Sent, Refusal> {
        let Loaded { authored, context, recipient } = loaded;
        let (space_id, now) = (self.space_id.as_str(), given.now_ms);
        let template = &authored.template;
        // Each context record is upserted as a record write is; AI auto-fill needs credits.
        let mut planned = BTreeMap::new();
        for (key, ContextRecord { context, upsert }) in context {
            let schema = records::write_schema(&context, space_id);
            records::check_credits(&schema, context.credits).map_err(records::Refusal::from)?;
            let upsert = records::decide_upsert(&schema, upsert, now, given.fresh)?;
            planned.insert(key, Planned { upsert, attributes: context.attributes.clone() });
        }
        let Some(planned_recipient) = planned.get(&template.recipient) else {
            return Err(Refusal::Failed("the template's recipient key was not given".to_owned()));
        };
        let values = planned_recipient.upsert.record.values();
        let facts = send::Facts {
            kind: send::Kind::of(&template.kind),
            topic_id: template.topic_id.as_deref(),
            contact: Some(recipient.contact(planned_recipient, &values, &authored)?),
            policy: authored.policy.as_ref(),
            allowance_refused: false,
            now_ms: now,
        };
        let zone = send::zone_used(&facts);
        let follows = send::follows(&facts);
        let contact = facts.contact.as_ref();
        let held = match send::decide(&facts) {
            send::Verdict::Send => None,
            send::Verdict::Hold { until_ms, gate } => Some((until_ms, gate)),
            send::Verdict::Skip { gate, .. } => {
                let explained = authored.policy.as_ref().and_then(|policy| {
                    let zone = policy.time_zone.resolve(contact.and_then(|contact| contact.zone));
                    policy.explain_skip(zone, now, contact.map(|contact| contact.sent).unwrap_or_default())
                });
                return Err(match explained {
                    Some(reason) => Refusal::Policy { gate, reason },
                    None => Refusal::Gate(gate),
                });
            }
        };
        let address = contact.and_then(|contact| contact.address).unwrap_or_default().to_owned();
        let documents: BTreeMap<String, (Value, Vec<String>)> = planned
            .iter()
            .map(|(key, planned)| {
                let keys = planned.attributes.iter().map(|attribute| attribute.key.clone()).collect();
                (key.clone(), (planned.upsert.record.document(), keys))
            })
            .collect();
        let email_id = given.fresh.id("em");
        let rendered = send::render_email(&authored, &email_id, render_context(&documents), self.site)
            .map_err(Refusal::RenderFailed)?;
        // The content is sealed under the contact's data key: the key its write carries, or
        // the one it already has.
        let mut streams = Vec::new();
        let mut guards: Vec<Guard> = Vec::new();
        let mut contact = None;
        for (key, planned) in planned {
            let is_recipient = key == template.recipient;
            let record_id = planned.upsert.record.record_id.clone();
            match planned.upsert.write {
                Some(write) => {
                    let write = write.map_err(records::Refusal::Unwritable)?;
                    if is_recipient {
                        contact = Some((record_id, write.key.clone()));
                    }
                    streams.push(write.stream);
                    guards.extend(write.guards);
                }
                None if is_recipient => contact = planned.upsert.key.map(|key| (record_id, key)),
                None => {}
            }
        }
        let Some((contact_id, contact_key)) = contact else {
            return Err(Refusal::Failed("the recipient has no data key".to_owned()));
        };
        let to = EmailTo { space_id, contact_id: &contact_id, address: &address, key: &contact_key, follows };
        let scheduled =
            send::schedule(&email_id, &authored, to, &rendered, send::Origin::template(), (now, &self.site.base_url))
                .map_err(|error| Refusal::Failed(format!("{error:#}")))?
                .decided_in(zone.as_ref());
        let allowance =
            authored.allowance.as_ref().map(|allowance| send::allowance_guard(space_id, now, allowance.monthly));
        if let Some((until_ms, gate)) = held {
            // Held by the send policy: stored now, decided again at `until_ms`; the answer is
            // final (the claim completes with it).
            let held = scheduled.hold(until_ms, gate, now);
            streams.push(held.stream);
            guards.push(held.guard);
            guards.extend(allowance);
            let body = json!({
                "emailId": email_id,
                "status": "held",
                "notBefore": platform::time::format_millis(until_ms),
                "gate": gate.as_str(),
                "error": null,
            });
            return Ok(Sent::Held(Outcome::append(streams, guards, Reply::ok(body))));
        }
        streams.push(scheduled.stream);
        guards.extend(scheduled.guards);
        Ok(Sent::HandOff(Box::new(HandOff {
            streams,
            guards,
            allowance,
            email_id: email_id.into(),
            prepared: scheduled.prepared,
        })))
    }
}

impl platform::refusal::Answered for Refusal {}

/// A refused template send as the contract answers it: a gate's refusal with its code, the
/// send policy's with the rule and when a send is allowed, a context record's write as the
/// record write's refusal is.
impl platform::refusal::Refusal for Refusal {
    /// The contract's code of the refusal.
    fn code(&self) -> Code {
        match self {
            Self::NotFound(_) => Code::TemplateNotFound,
            Self::ContentNotAccepted(_) => Code::TemplateContentNotAccepted,
            Self::UnknownField(_) => Code::UnknownField,
            Self::InvalidField { .. } => Code::InvalidField,
            Self::ContactNotFound(_) => Code::RecordNotFound,
            Self::InvalidData { .. } => Code::InvalidTemplateData,
            Self::Gate(gate) | Self::Policy { gate, .. } => gate.code(),
            Self::RenderFailed(_) => Code::TemplateRenderFailed,
            Self::EmailLimitReached => Code::EmailLimitReached,
            Self::KeptChanging => Code::ConcurrentModification,
            Self::Record(records::Refusal::Record(refusal)) => refusal.code(),
            Self::Record(records::Refusal::KeptChanging) => Code::ConcurrentModification,
            Self::Record(_) | Self::Failed(_) => Code::InternalError,
        }
    }

    fn issues(&self) -> Vec<Issue> {
        match self {
            Self::InvalidField { field, message } => vec![Issue::for_key(field, message)],
            Self::InvalidData { issues, .. } => issues.clone(),
            Self::Policy { reason, .. } => {
                let detail = format!(
                    "{}; a send is allowed from {}",
                    reason.description,
                    platform::time::format_millis(reason.allowed_at_ms)
                );
                vec![Issue::coded(reason.rule.clone(), Refusal::code(self), detail)]
            }
            Self::Record(refusal) => platform::refusal::Refusal::issues(refusal),
            _ => Vec::new(),
        }
    }

    fn fields(&self) -> Vec<(&'static str, Value)> {
        match self {
            Self::Policy { reason, .. } => {
                vec![("notBefore", json!(platform::time::format_millis(reason.allowed_at_ms)))]
            }
            _ => Vec::new(),
        }
    }

    fn is_defect(&self) -> bool {
        match self {
            Self::Record(refusal) => platform::refusal::Refusal::is_defect(refusal),
            Self::Failed(_) => true,
            _ => false,
        }
    }

    fn into_failure(self) -> Result<platform::refusal::Failure, Self> {
        match self {
            Self::Record(refusal) => platform::refusal::Refusal::into_failure(refusal).map_err(Self::Record),
            other => Err(other),
        }
    }
}

/// A template and what a send reads of it, for the decisions' tests that send.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use domain::email::resources::{AllowanceDef, ContextKey, DomainDef, SenderDef, StoredKey};

    pub(crate) fn template(kind: &str, topic: Option<&str>) -> TemplateDef {
        TemplateDef {
            slug: "t".into(),
            name: "T".into(),
            kind: kind.into(),
            sender_id: "snd_1".into(),
            topic_id: topic.map(str::to_owned),
            subject: String::new(),
            html: String::new(),
            text: String::new(),
            recipient: "contact".into(),
            data: BTreeMap::from([(
                "contact".to_owned(),
                ContextKey { schema_id: "sch_1".into(), schema_slug: "contacts".into(), schema_type: "contact".into() },
            )]),
            tracking: None,
            ..Default::default()
        }
    }

    pub(crate) fn authored(subject: &str) -> Arc<Authored> {
        let sender = SenderDef {
            slug: "s".into(),
            from_name: "S".into(),
            from_address: "s@example.test".into(),
            domain_id: "dom_1".into(),
            reply_to: None,
            postal_address: None,
        };
        let dkim = StoredKey {
            selector: "s1".into(),
            public_key: String::new(),
            wrapped_key: String::new(),
            private_key: String::new(),
        };
        let domain = DomainDef { slug: "d".into(), name: "example.test".into(), dkim, return_path: String::new() };
        Arc::new(Authored {
            template_id: "tpl_1".into(),
            revision: 3,
            template: TemplateDef { subject: subject.into(), ..template("transactional", None) },
            sender_id: "snd_1".into(),
            sender,
            domain,
            topic: None,
            allowance: Some(AllowanceDef { monthly: 100 }),
            policy: None,
            parts: Default::default(),
            preheader: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{authored, template};
    use super::*;
    use platform::refusal::Refusal as _;
    use serde_json::json;

    #[test]
    fn the_body_is_data_only_and_its_keys_are_the_templates() {
        let body = |value: Value| value.as_object().cloned().unwrap_or_default();
        let refused = context(&body(json!({"data": {}, "subject": "x"}))).err().map(|e| e.code());
        assert_eq!(refused, Some(Code::TemplateContentNotAccepted));
        assert_eq!(context(&body(json!({"data": {}, "other": 1}))).err().map(|e| e.code()), Some(Code::UnknownField));
        assert_eq!(
            context(&body(json!({"data": {"contact": 1}}))).err().map(|e| e.code()),
            Some(Code::InvalidTemplateData)
        );
        let given = context(&body(json!({"data": {"contact": {"email": "a@example.com"}}}))).expect("valid");
        assert!(check_keys(&template("transactional", None), &given).is_ok());
        let extra = context(&body(json!({"data": {"contact": {}, "order": {}}}))).expect("valid");
        assert!(check_keys(&template("transactional", None), &extra).is_err());
        assert!(check_keys(&template("transactional", None), &BTreeMap::new()).is_err());
    }

    use crate::decision::Status;
    use crate::decision::harness::{self, NOW_MS};
    use domain::records::RecordState;
    use platform::events::LogEvent;
    use platform::fresh::{Counted, Fresh};
    use platform::proto;

    #[test]
    fn the_refusals_read_as_the_contract_words_them() {
        let unknown = Refusal::UnknownField("other".into());
        assert_eq!(unknown.to_string(), "unknown field \"other\"; the body is {data: {...}}");
        let content = Refusal::ContentNotAccepted("subject".into());
        assert_eq!(
            content.to_string(),
            "\"subject\" cannot be given: the stored template's content is sent as authored"
        );
        let gate = Refusal::Gate(Gate::NoAddress);
        assert_eq!(gate.to_string(), format!("{}; nothing was sent", Gate::NoAddress.reason()));
        let body = |value: Value| value.as_object().cloned().unwrap_or_default();
        let Err(Refusal::InvalidData { message, issues }) = context(&body(json!({"data": {"contact": 1}}))) else {
            panic!("refused");
        };
        assert_eq!(message, "each context value is an object of the record's fields");
        assert_eq!(issues, [Issue::for_key("data.contact", message.as_str())]);
    }

    fn site() -> Site {
        Site {
            base_url: "https://api.example.test/v1".into(),
            links: mail::tracking::Links::derive(|_| [7; 32], 1, &[]),
        }
    }

    /// The contacts schema, with the email consent attribute `news`.
    fn contacts() -> Arc<WriteContext> {
        crate::records::decide::fixtures::context(
            json!({"news": {"type": "boolean", "consent": {"channel": "email"}}}),
            0,
        )
    }

    /// A contact `con_1` with `address` who consented, matched by a send that changes nothing,
    /// and the send facts read for it: `suppressed` when its address is.
    fn loaded(subject: &str, address: Option<&str>, suppressed: bool) -> Loaded {
        let (key, _) = Counted::new().expect("the test keys").data_key("con_1").expect("a data key");
        let record = RecordState {
            record_id: "con_1".into(),
            space_id: "spc_1".into(),
            schema_id: "sch_1".into(),
            schema_type: "contact".into(),
            source: "api".into(),
            created_at_ms: 1,
            updated_at_ms: 1,
            personal: Some(proto::RecordPersonal {
                user_id: None,
                email: address.map(str::to_owned),
                phone: None,
                external_id: None,
                values_json: json!({"news": true}).to_string(),
            }),
        };
        let context = contacts();
        let input = records::parse_input(&records::write_schema(&context, "spc_1"), Map::new()).expect("valid");
        let upsert = UpsertLoaded { input, owners: Default::default(), target: Some((4, record, Some(key))) };
        let addresses: Vec<String> = address.map(str::to_owned).into_iter().collect();
        let facts = SendFacts {
            suppressed: addresses.iter().filter(|_| suppressed).cloned().collect(),
            ..SendFacts::default()
        };
        Loaded {
            authored: authored(subject),
            context: BTreeMap::from([("contact".to_owned(), ContextRecord { context, upsert })]),
            recipient: RecipientFacts { matched: Some("con_1".into()), addresses, facts },
        }
    }

    fn send_template(site: &Site) -> SendTemplate<'_> {
        SendTemplate { space_id: "spc_1".into(), template_id: "tpl_1".into(), context: BTreeMap::new(), site }
    }

    #[test]
    fn given_a_reachable_contact_when_sent_then_the_email_is_scheduled_under_a_drawn_id_and_handed_off() {
        let site = site();
        let sent = harness::given(loaded("Hello {{ contact.email }}", Some("ada@example.test"), false))
            .when(&send_template(&site))
            .decided();
        let Sent::HandOff(hand_off) = sent else { panic!("handed off, not held") };
        let HandOff { streams, guards, allowance, email_id, prepared } = *hand_off;
        assert_eq!(email_id, "em_1");
        assert_eq!(streams.len(), 1, "the contact is unchanged: the email's stream alone");
        let [event] = streams[0].events.as_slice() else { panic!("one event") };
        let LogEvent::EmailScheduled(scheduled) = &event.event else { panic!("scheduled: {event:?}") };
        assert_eq!(
            (scheduled.email_id.as_str(), scheduled.contact_id.as_str(), scheduled.template_id.as_str()),
            ("em_1", "con_1", "tpl_1")
        );
        assert_eq!(
            (scheduled.template_revision, scheduled.scheduled_at_ms, scheduled.origin.as_str()),
            (3, NOW_MS, "template")
        );
        assert!(scheduled.content.is_some(), "the content is sealed");
        assert!(guards.is_empty(), "a transactional email counts against no frequency cap");
        assert_eq!(allowance.map(|guard| guard.sql), Some(send::allowance_guard("spc_1", NOW_MS, 100).sql));
        assert_eq!((prepared.parties.email_id.as_str(), prepared.parties.contact_id.as_str()), ("em_1", "con_1"));
    }

    #[test]
    fn given_a_contact_without_an_address_or_suppressed_when_sent_then_the_gate_refuses() {
        let site = site();
        harness::given(loaded("Hi", None, false))
            .when(&send_template(&site))
            .then_refused(Refusal::Gate(Gate::NoAddress));
        harness::given(loaded("Hi", Some("ada@example.test"), true))
            .when(&send_template(&site))
            .then_refused(Refusal::Gate(Gate::Suppressed));
    }

    /// A send whose context names a contact nobody holds yet: a new contact, with the send
    /// facts read for the address it gives.
    fn new_contact(address: &str, suppressed: bool) -> Loaded {
        let context = contacts();
        let schema = records::write_schema(&context, "spc_1");
        let input = records::parse_input(&schema, crate::records::decide::fixtures::input(json!({"email": address})))
            .expect("valid");
        let upsert = UpsertLoaded { input, owners: Default::default(), target: None };
        let addresses = vec![address.to_lowercase()];
        let facts = SendFacts {
            suppressed: addresses.iter().filter(|_| suppressed).cloned().collect(),
            ..SendFacts::default()
        };
        Loaded {
            authored: authored("Hi"),
            context: BTreeMap::from([("contact".to_owned(), ContextRecord { context, upsert })]),
            recipient: RecipientFacts { matched: None, addresses, facts },
        }
    }

    #[test]
    fn given_a_new_contact_when_sent_then_it_is_created_under_a_drawn_id_with_the_email_in_one_append() {
        let site = site();
        let sent = harness::given(new_contact("Grace@Example.test", false)).when(&send_template(&site)).decided();
        let Sent::HandOff(hand_off) = sent else { panic!("handed off, not held") };
        let events: Vec<&LogEvent> =
            hand_off.streams.iter().flat_map(|stream| &stream.events).map(|new| &new.event).collect();
        let [LogEvent::RecordCreated(created), LogEvent::EmailScheduled(scheduled)] = events[..] else {
            panic!("the contact created, then the email scheduled: {events:?}")
        };
        assert_eq!((created.record_id.as_str(), created.created_at_ms), ("con_1", NOW_MS));
        assert_eq!((scheduled.email_id.as_str(), scheduled.contact_id.as_str()), ("em_2", "con_1"));
        harness::given(new_contact("grace@example.test", true))
            .when(&send_template(&site))
            .then_refused(Refusal::Gate(Gate::Suppressed));
    }

    #[test]
    fn given_no_credits_for_auto_fill_or_an_address_not_read_when_sent_then_nothing_is_decided() {
        let site = site();
        let mut loaded = new_contact("grace@example.test", false);
        let auto_filled = json!({"summary": {"type": "string", "autoFill": true}});
        if let Some(record) = loaded.context.get_mut("contact") {
            record.context = crate::records::decide::fixtures::context(auto_filled, 0);
        }
        let refusal = records::Refusal::Record(records::RecordRefusal::InsufficientCredits);
        harness::given(loaded).when(&send_template(&site)).then_refused(Refusal::Record(refusal));
        let mut unread = new_contact("grace@example.test", false);
        unread.recipient.addresses.clear();
        let refused = harness::given(unread).when(&send_template(&site)).0.err();
        assert!(matches!(&refused, Some(Refusal::Failed(message)) if message.contains("was not read")), "{refused:?}");
    }

    #[test]
    fn given_a_template_that_does_not_render_when_sent_then_it_is_refused_before_anything_is_written() {
        let site = site();
        let refused = harness::given(loaded("Hello {{ contact.email", Some("ada@example.test"), false))
            .when(&send_template(&site))
            .0
            .err();
        assert!(matches!(&refused, Some(Refusal::RenderFailed(_))), "{refused:?}");
        assert_eq!(refused.map(|refusal| refusal.code()), Some(Code::TemplateRenderFailed));
    }

    #[test]
    fn given_quiet_hours_when_a_marketing_email_is_sent_then_it_is_held_and_answered_at_once() {
        let site = site();
        let mut loaded = loaded("Hi", Some("ada@example.test"), false);
        let mut marketing = (*loaded.authored).clone();
        marketing.template.kind = "marketing".into();
        let quiet = json!({"timeZone": {"default": "UTC"}, "quietHours": {"fromMinute": 900, "toMinute": 1020, "outcome": "hold"}});
        marketing.policy = Some(serde_json::from_value(quiet).expect("a policy"));
        loaded.authored = Arc::new(marketing);
        let Sent::Held(outcome) = harness::given(loaded).when(&send_template(&site)).decided() else {
            panic!("held, not handed off")
        };
        let until_ms = NOW_MS + 3_600_000;
        let events = outcome.events();
        let [LogEvent::EmailScheduled(scheduled), LogEvent::EmailHeld(held)] = events.as_slice() else {
            panic!("scheduled, then held: {events:?}")
        };
        assert_eq!((scheduled.email_id.as_str(), scheduled.kind.as_str()), ("em_1", "marketing"));
        assert_eq!((held.email_id.as_str(), held.not_before_ms, held.at_ms), ("em_1", until_ms, NOW_MS));
        let reply = outcome.reply().expect("a reply");
        assert_eq!(reply.status, Status::Ok);
        assert_eq!(
            reply.json(),
            json!({"data": {
                "emailId": "em_1",
                "status": "held",
                "notBefore": platform::time::format_millis(until_ms),
                "gate": Gate::QuietHours.as_str(),
                "error": null,
            }})
        );
        let Outcome::Append(writes) = &outcome else { panic!("appended") };
        let allowance = send::allowance_guard("spc_1", NOW_MS, 100).sql;
        assert_eq!(writes.guards.last().map(|guard| guard.sql), Some(allowance), "counted against the allowance");
    }

    #[test]
    fn given_a_frequency_cap_that_skips_when_a_marketing_email_is_sent_then_the_refusal_names_the_rule_and_when() {
        let site = site();
        let mut loaded = loaded("Hi", Some("ada@example.test"), false);
        let mut marketing = (*loaded.authored).clone();
        marketing.template.kind = "marketing".into();
        let policy = json!({"timeZone": {"default": "UTC"},
                            "frequencyCaps": [{"max": 2, "window": {"hours": 24}, "outcome": "skip"}]});
        marketing.policy = Some(serde_json::from_value(policy).expect("a policy"));
        loaded.authored = Arc::new(marketing);
        let hour = 3_600_000;
        let sent = (1..=2).map(|n| send::Sent { at_ms: NOW_MS - n * hour, topic_id: None, position: n, seq: n });
        loaded.recipient.facts.sent.insert("con_1".into(), sent.collect());
        let allowed_at_ms = NOW_MS + 22 * hour;
        let reason = send::SkipReason {
            rule: "sendPolicy.frequencyCaps[0]".into(),
            description: "at most 2 marketing emails per 24 hours".into(),
            allowed_at_ms,
        };
        let refusal = Refusal::Policy { gate: Gate::FrequencyCap, reason };
        harness::given(loaded).when(&send_template(&site)).then_refused(refusal.clone());
        let allowed_at = platform::time::format_millis(allowed_at_ms);
        let answer = platform::error::ApiError::from(refusal);
        assert_eq!(answer.status().as_u16(), 422);
        assert_eq!(
            answer.body(),
            json!({"error": {
                "type": "invalid_request_error",
                "code": "frequency_capped",
                "message": format!("a frequency cap of the space's send policy is reached for this contact: at most 2 \
                                    marketing emails per 24 hours; a send is allowed from {allowed_at}; nothing was sent"),
                "issues": [{"key": "sendPolicy.frequencyCaps[0]", "code": "frequency_capped",
                            "message": format!("at most 2 marketing emails per 24 hours; a send is allowed from {allowed_at}")}],
                "notBefore": allowed_at,
            }})
        );
    }
}
