//! Recipient decisions on an email: the one-click unsubscribe and the preference page's
//! choices (reading a choice, what it changes, and the answer, a page or JSON), and the email
//! consent those actions and a form's confirmation set. Pure: the email's stream, the space's
//! topics, the contact's subscriptions and the contact whose consent changes are loaded by the
//! shells (`unsubscribe.rs`, `preferences.rs`, `consent.rs`).

pub(crate) mod subscriptions;

use std::collections::BTreeMap;
use std::sync::Arc;

use domain::catalog::WriteContext;
use domain::email::page_text::PageText;
use domain::records::write::Write;
use platform::error::{Code, Issue};
use platform::events::LogEvent;
use platform::ids::{EmailId, SpaceId};
use platform::log::{ExpectedVersion, NewEvent, StreamAppend};
use platform::proto;
use serde_json::{Map, Value, json};

use crate::decision::{Decide, Given, Outcome, Reply};
use crate::records::decide::{self as records, Input, Owners, Target};
pub(crate) use subscriptions::{Source, subscription_changes};

/// Why a recipient's action is refused. The HTTP edge maps each to the contract's answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// No such email (404).
    #[error("no email {0:?}")]
    EmailNotFound(String),
    /// The preference change is not one; `issues` names every problem (400).
    #[error("{message}")]
    Invalid { message: String, issues: Vec<Issue> },
    /// Every attempt at a preference change lost a race (409).
    #[error("the recipient's preferences kept changing; retry")]
    PreferencesKeptChanging,
    /// Every attempt at an unsubscription lost a race (409).
    #[error("the email's recipient kept changing; retry")]
    RecipientKeptChanging,
    /// The contact's consent write could not be assembled (the record write's answer).
    #[error(transparent)]
    Record(#[from] records::Refusal),
}

impl Refusal {
    /// A preference change refused for `issues`, named by the first.
    fn invalid(issues: Vec<Issue>) -> Self {
        let message = issues.first().map_or_else(String::new, |issue| issue.message.clone());
        Self::Invalid { message, issues }
    }
}

/// A contact's email consent to set, as loaded: the space, the write context of the contact's
/// schema, its consent attributes set to the wanted value (the input), the contact as it is
/// (stream version, state, data key) and the holders of the identities the input sets (none).
pub(crate) struct ConsentLoaded {
    pub space_id: SpaceId,
    pub context: Arc<WriteContext>,
    pub input: Input,
    pub target: Target,
    pub owners: Owners,
}

/// The consent write `loaded` asks for, carried by `source`: `None` when nothing was loaded
/// (the contact is gone or its schema has no consent attribute) or nothing changes. A
/// contact without a data key gets one from `given.fresh`.
pub(crate) fn consent_write(
    loaded: Option<Box<ConsentLoaded>>,
    source: Source<'_>,
    given: &mut Given<'_>,
) -> Result<Option<Write>, records::Refusal> {
    let Some(loaded) = loaded else { return Ok(None) };
    let ConsentLoaded { space_id, context, input, target, owners } = *loaded;
    let schema = records::write_schema(&context, &space_id);
    let decided = records::decide_record_update(&schema, input, target, &owners, given.now_ms, given.fresh)?;
    Ok(decided.0.map(|write| write.carried_by(source.kind, source.id)))
}

/// What the email's stream says.
pub(crate) struct Email {
    pub version: i64,
    pub scheduled: proto::EmailScheduled,
    pub unsubscribed: bool,
}

/// The email's `EmailUnsubscribed`: an opt-out made through it (the one-click link, or the
/// preference page), appended at the email's version so it is recorded once.
pub(crate) fn unsubscribed(email_id: &str, email: &Email, now: i64) -> StreamAppend {
    let scheduled = &email.scheduled;
    let unsubscribed = proto::EmailUnsubscribed {
        email_id: email_id.to_owned(),
        space_id: scheduled.space_id.clone(),
        contact_id: scheduled.contact_id.clone(),
        topic_id: scheduled.topic_id.clone(),
        at_ms: now,
    };
    StreamAppend {
        stream_id: domain::email::stream_id(email_id),
        expected: ExpectedVersion::Exactly(email.version),
        events: vec![NewEvent {
            event: LogEvent::EmailUnsubscribed(unsubscribed),
            subject_id: Some(scheduled.contact_id.clone()),
            occurred_at: platform::time::from_millis(now),
        }],
    }
}

/// What the page after an unsubscription names: the email's topic, its sender and the
/// address it went to (masked), in the words of the recipient's locale.
#[derive(Default)]
pub(crate) struct PageFacts {
    /// The email's topic, named in the page's locale.
    pub topic_name: Option<String>,
    /// Every topic of the space by id, named in the page's locale.
    pub topic_names: BTreeMap<String, String>,
    pub sender: Option<String>,
    pub recipient: Option<String>,
    pub text: PageText,
}

impl PageFacts {
    /// Whom a person leaving everything stops hearing from: the sender by name, when the
    /// catalog still has it.
    pub(crate) fn sender_name(&self) -> String {
        self.sender.clone().unwrap_or_else(|| self.text.get("sender.unknown").to_owned())
    }

    /// "Email from S to a***@example.com." when either is known.
    pub(crate) fn parties_line(&self) -> Option<String> {
        self.text.parties(self.sender.as_deref(), self.recipient.as_deref())
    }

    /// A success page in the recipient's words: the parties' line, then `text`, and a link
    /// back to the preference page.
    fn page(&self, title: &str, text: &str, link: &str) -> Reply {
        let parties = self.parties_line();
        let lines: Vec<&str> = parties.iter().map(String::as_str).chain([text]).collect();
        Reply::page(title, &lines, &self.text).with_link("unsubscribe", self.text.get(link))
    }
}

fn unsubscribe_reply(email_id: &str, topic_id: &str, page: Option<&PageFacts>) -> Reply {
    let topic = (!topic_id.is_empty()).then_some(topic_id);
    if let Some(facts) = page {
        let words = &facts.text;
        let text = match &facts.topic_name {
            Some(name) => words.fill("unsubscribed.topic", &[("topic", name)]),
            None => words.fill("unsubscribed.marketing", &[("sender", &facts.sender_name())]),
        };
        return facts.page(words.get("unsubscribed.title"), &text, "unsubscribed.link");
    }
    Reply::ok(json!({
        "emailId": email_id,
        "unsubscribed": true,
        "scope": if topic.is_some() { "topic" } else { "marketing" },
        "topicId": topic,
    }))
}

/// `POST /emails/{emailId}/unsubscribe`: the one-click unsubscribe.
pub(crate) struct Unsubscribe {
    pub email_id: EmailId,
    /// Answer a page (a browser), not JSON.
    pub browser: bool,
}

impl Unsubscribe {
    /// The answer: for a browser a page naming the topic left, the sender and the address.
    fn reply(&self, topic_id: &str, page: &PageFacts) -> Reply {
        unsubscribe_reply(&self.email_id, topic_id, self.browser.then_some(page))
    }
}

impl Decide for Unsubscribe {
    /// The email (`None` when unknown), (for an email without a topic) the contact whose
    /// consent is withdrawn, and what a page names.
    type Loaded = Option<(Email, Option<Box<ConsentLoaded>>, PageFacts)>;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, loaded: Self::Loaded, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let Some((email, consent, page)) = loaded else {
            return Err(Refusal::EmailNotFound(self.email_id.to_string()));
        };
        let (email_id, scheduled, now) = (&self.email_id, &email.scheduled, given.now_ms);
        if email.unsubscribed {
            return Ok(Outcome::Answer(self.reply(&scheduled.topic_id, &page)));
        }
        let mut streams = Vec::new();
        let mut guards = Vec::new();
        let source = Source { kind: "unsubscribe", id: email_id };
        if let Some(write) = consent_write(consent, source, given)? {
            streams.push(write.stream);
            guards.extend(write.guards);
        }
        if !scheduled.topic_id.is_empty() {
            let topics = [&scheduled.topic_id];
            let source = Source { kind: "unsubscribe", id: email_id };
            let parties = (scheduled.space_id.as_str(), scheduled.contact_id.as_str());
            streams.extend(subscription_changes(parties, &topics, "unsubscribed", source, now));
        }
        streams.push(unsubscribed(email_id, &email, now));
        let reply = self.reply(&scheduled.topic_id, &page);
        Ok(Outcome::append(streams, guards, reply).in_space(&scheduled.space_id))
    }
}

/// What the recipient chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Each named topic subscribed (`true`) or not.
    Topics(BTreeMap<String, bool>),
    /// Every topic left and the marketing consent withdrawn.
    LeaveAll,
}

impl Choice {
    /// The email consent the choice sets: withdrawn when leaving everything, granted when
    /// subscribing to a topic, else untouched.
    pub(crate) fn consent(&self) -> Option<bool> {
        match self {
            Self::LeaveAll => Some(false),
            Self::Topics(chosen) if chosen.values().any(|subscribed| *subscribed) => Some(true),
            Self::Topics(_) => None,
        }
    }

    /// The chosen topics that are not among the space's `topics`, as issues.
    pub(crate) fn unknown_topics(&self, topics: &BTreeMap<String, String>) -> Vec<Issue> {
        let Self::Topics(chosen) = self else { return Vec::new() };
        chosen
            .keys()
            .filter(|topic_id| !topics.contains_key(*topic_id))
            .map(|topic_id| {
                Issue::for_key(format!("topics.{topic_id}"), format!("no topic {topic_id:?} in this space"))
            })
            .collect()
    }
}

/// Parses a body into a choice. A urlencoded body is the page's form.
pub fn parse(fields: &Map<String, Value>, urlencoded: bool) -> Result<Choice, Refusal> {
    let invalid = Refusal::invalid;
    let status = |key: &str, value: &Value| match value.as_str() {
        Some("subscribed") => Ok(true),
        Some("unsubscribed") => Ok(false),
        _ => Err(Issue::for_key(key, format!("{key} must be \"subscribed\" or \"unsubscribed\""))),
    };
    let mut issues = Vec::new();
    if urlencoded {
        let action = fields.get("action").and_then(Value::as_str).unwrap_or("save");
        let mut topics = BTreeMap::new();
        for (key, value) in fields.iter().filter(|(key, _)| *key != "action") {
            if !key.starts_with("top_") {
                issues.push(Issue::for_key(key, format!("{key} is not a topic")));
                continue;
            }
            match status(key, value) {
                Ok(subscribed) => {
                    topics.insert(key.clone(), subscribed);
                }
                Err(issue) => issues.push(issue),
            }
        }
        // The page posts every topic's choice with either button; they are held to the
        // form's shape with both (a topic the space no longer has does not stop leaving all).
        return match (action, issues.is_empty()) {
            ("unsubscribe_all", true) => Ok(Choice::LeaveAll),
            ("save", true) => Ok(Choice::Topics(topics)),
            ("save" | "unsubscribe_all", false) => Err(invalid(issues)),
            (other, _) => Err(invalid(vec![Issue::for_key(
                "action",
                format!("action must be \"save\" or \"unsubscribe_all\"; got {other:?}"),
            )])),
        };
    }
    for key in fields.keys().filter(|key| !["topics", "unsubscribeAll"].contains(&key.as_str())) {
        issues.push(Issue::for_key(key, format!("{key} is not a field of a preference change")));
    }
    let leave_all = match fields.get("unsubscribeAll") {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => {
            issues.push(Issue::for_key("unsubscribeAll", "unsubscribeAll must be a boolean"));
            false
        }
    };
    let mut topics = BTreeMap::new();
    match fields.get("topics") {
        None => {}
        // As documented (at least one): `{"topics": {}, "unsubscribeAll": true}` is refused,
        // not read as leaving everything.
        Some(Value::Object(given)) if given.is_empty() => {
            issues.push(Issue::for_key("topics", "topics names no topic; name at least one, or leave it out"));
        }
        Some(Value::Object(given)) => {
            for (topic_id, value) in given {
                let key = format!("topics.{topic_id}");
                match status(&key, value) {
                    Ok(subscribed) => {
                        topics.insert(topic_id.clone(), subscribed);
                    }
                    Err(issue) => issues.push(issue),
                }
            }
        }
        Some(_) => issues.push(Issue::for_key("topics", "topics must be an object of topic ids to statuses")),
    }
    if leave_all && !topics.is_empty() {
        issues.push(Issue::for_key("topics", "give either topics or unsubscribeAll, not both"));
    }
    if !leave_all && topics.is_empty() && issues.is_empty() {
        issues.push(Issue::for_key("topics", "name at least one topic, or set unsubscribeAll"));
    }
    if !issues.is_empty() {
        return Err(invalid(issues));
    }
    Ok(if leave_all { Choice::LeaveAll } else { Choice::Topics(topics) })
}

/// What a preference change decides on: the email, the topics and the consent.
pub(crate) struct Preferences {
    pub email: Email,
    /// The space's topics: id → name.
    pub topics: BTreeMap<String, String>,
    /// The contact's subscriptions: topic id → status.
    pub subscribed: BTreeMap<String, String>,
    /// The contact whose consent the choice sets (granted or withdrawn), when it sets one
    /// (not loaded when a chosen topic is unknown).
    pub consent: Option<Box<ConsentLoaded>>,
    /// What the page after the change names (loaded for a browser).
    pub page: PageFacts,
}

/// `POST /emails/{emailId}/preferences`: the recipient's choices from the preference page.
pub(crate) struct ChangePreferences {
    pub email_id: EmailId,
    pub choice: Choice,
    pub browser: bool,
}

impl Decide for ChangePreferences {
    /// The recipient, `None` when the email is unknown.
    type Loaded = Option<Preferences>;
    type Outcome = Outcome;
    type Refusal = Refusal;

    fn decide(&self, loaded: Self::Loaded, given: &mut Given<'_>) -> Result<Outcome, Refusal> {
        let Some(Preferences { email, topics, subscribed, consent, page }) = loaded else {
            return Err(Refusal::EmailNotFound(self.email_id.to_string()));
        };
        let unknown = self.choice.unknown_topics(&topics);
        if !unknown.is_empty() {
            return Err(Refusal::Invalid { message: "a topic is not one of the space's".to_owned(), issues: unknown });
        }
        let (space_id, contact_id) = (email.scheduled.space_id.as_str(), email.scheduled.contact_id.as_str());
        let wanted: BTreeMap<&String, bool> = match &self.choice {
            Choice::LeaveAll => topics.keys().map(|topic_id| (topic_id, false)).collect(),
            Choice::Topics(chosen) => chosen.iter().map(|(topic_id, subscribed)| (topic_id, *subscribed)).collect(),
        };
        let status_of = |topic_id: &String| subscribed.get(topic_id).map(String::as_str);
        let is_subscribed = |topic_id: &String| status_of(topic_id) == Some("subscribed");
        // A subscription still waiting for its double opt-in is not one yet: choosing it on the
        // page subscribes, and leaving it ends the wait.
        let to_subscribe: Vec<&String> =
            wanted.iter().filter(|(topic_id, want)| **want && !is_subscribed(topic_id)).map(|(id, _)| *id).collect();
        let to_leave: Vec<&String> = wanted
            .iter()
            .filter(|(topic_id, want)| !**want && matches!(status_of(topic_id), Some("subscribed" | "pending")))
            .map(|(id, _)| *id)
            .collect();
        let mut after: BTreeMap<&String, bool> =
            topics.keys().map(|topic_id| (topic_id, is_subscribed(topic_id))).collect();
        after.extend(wanted.iter().map(|(topic_id, want)| (*topic_id, *want)));
        let reply = self.reply(&topics, &after, &page);
        let mut streams = Vec::new();
        let mut guards = Vec::new();
        let source = || Source { kind: "preferences", id: &self.email_id };
        if let Some(write) = consent_write(consent, source(), given)? {
            streams.push(write.stream);
            guards.extend(write.guards);
        }
        let now = given.now_ms;
        streams.extend(subscription_changes((space_id, contact_id), &to_subscribe, "subscribed", source(), now));
        streams.extend(subscription_changes((space_id, contact_id), &to_leave, "unsubscribed", source(), now));
        if streams.is_empty() {
            return Ok(Outcome::Answer(reply));
        }
        // An opt-out made through this email counts as the one-click link's does: leaving its
        // topic, or leaving everything (D11).
        let topic = &email.scheduled.topic_id;
        let opted_out = match &self.choice {
            Choice::LeaveAll => true,
            Choice::Topics(_) => !topic.is_empty() && to_leave.contains(&topic),
        };
        if opted_out && !email.unsubscribed {
            streams.push(unsubscribed(&self.email_id, &email, now));
        }
        Ok(Outcome::append(streams, guards, reply).in_space(space_id))
    }
}

impl ChangePreferences {
    /// The answer: every topic of the space with its status after the change.
    fn reply(&self, topics: &BTreeMap<String, String>, after: &BTreeMap<&String, bool>, page: &PageFacts) -> Reply {
        let status = |subscribed: bool| if subscribed { "subscribed" } else { "unsubscribed" };
        if self.browser {
            let words = &page.text;
            let kept: Vec<&str> = after
                .iter()
                .filter(|(_, subscribed)| **subscribed)
                .filter_map(|(topic_id, _)| {
                    page.topic_names.get(*topic_id).or_else(|| topics.get(*topic_id)).map(String::as_str)
                })
                .collect();
            let (title, text) = match (&self.choice, kept.is_empty()) {
                (Choice::LeaveAll, _) => (
                    words.get("saved.leftAllTitle"),
                    words.fill("unsubscribed.marketing", &[("sender", &page.sender_name())]),
                ),
                (Choice::Topics(_), true) => (words.get("saved.title"), words.get("saved.none").to_owned()),
                (Choice::Topics(_), false) => {
                    (words.get("saved.title"), words.fill("saved.some", &[("topics", &kept.join(", "))]))
                }
            };
            return page.page(title, &text, "saved.link");
        }
        let subscriptions: Map<String, Value> =
            after.iter().map(|(topic_id, subscribed)| ((*topic_id).clone(), json!(status(*subscribed)))).collect();
        Reply::ok(json!({
            "emailId": self.email_id,
            "unsubscribedFromAll": self.choice == Choice::LeaveAll,
            "topics": subscriptions,
        }))
    }
}

impl platform::refusal::Answered for Refusal {}

/// A refused recipient action on an email (unsubscribe, preferences) as the contract answers it.
impl platform::refusal::Refusal for Refusal {
    fn code(&self) -> Code {
        match self {
            Self::EmailNotFound(_) => Code::EmailNotFound,
            Self::Invalid { .. } => Code::InvalidPreferences,
            Self::PreferencesKeptChanging | Self::RecipientKeptChanging => Code::ConcurrentModification,
            Self::Record(refusal) => platform::refusal::Refusal::code(refusal),
        }
    }

    fn issues(&self) -> Vec<Issue> {
        match self {
            Self::Invalid { issues, .. } => issues.clone(),
            Self::Record(refusal) => platform::refusal::Refusal::issues(refusal),
            _ => Vec::new(),
        }
    }

    fn is_defect(&self) -> bool {
        match self {
            Self::Record(refusal) => platform::refusal::Refusal::is_defect(refusal),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::harness::{NOW_MS, given};
    use platform::refusal::Refusal as _;

    fn fields(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("an object")
    }

    #[test]
    fn the_page_form_is_read_as_topics_or_leaving_all() {
        let saved = parse(&fields(json!({"action": "save", "top_a": "subscribed", "top_b": "unsubscribed"})), true);
        assert_eq!(saved.ok(), Some(Choice::Topics([("top_a".to_owned(), true), ("top_b".to_owned(), false)].into())));
        let all = parse(&fields(json!({"action": "unsubscribe_all", "top_a": "subscribed"})), true);
        assert_eq!(all.ok(), Some(Choice::LeaveAll));
        let code = |value: Value, urlencoded: bool| parse(&fields(value), urlencoded).err().map(|e| e.code());
        assert_eq!(code(json!({"action": "save", "top_a": "maybe"}), true), Some(Code::InvalidPreferences));
        assert_eq!(code(json!({"action": "save", "colour": "red"}), true), Some(Code::InvalidPreferences));
        assert_eq!(code(json!({"action": "shout"}), true), Some(Code::InvalidPreferences));
        let junk = json!({"action": "unsubscribe_all", "top_a": "\u{1a}u"});
        assert_eq!(code(junk, true), Some(Code::InvalidPreferences));
    }

    #[test]
    fn a_json_body_names_topics_or_unsubscribe_all_but_not_both() {
        let topics = parse(&fields(json!({"topics": {"top_a": "unsubscribed"}})), false);
        assert_eq!(topics.ok(), Some(Choice::Topics([("top_a".to_owned(), false)].into())));
        assert_eq!(parse(&fields(json!({"unsubscribeAll": true})), false).ok(), Some(Choice::LeaveAll));
        for invalid in [
            json!({}),
            json!({"unsubscribeAll": false}),
            json!({"unsubscribeAll": "yes"}),
            json!({"topics": []}),
            json!({"topics": {"top_a": true}}),
            json!({"topics": {"top_a": "subscribed"}, "unsubscribeAll": true}),
            json!({"topics": {}, "unsubscribeAll": true}),
            json!({"topics": {"top_a": "subscribed"}, "colour": "red"}),
        ] {
            let refused = parse(&fields(invalid.clone()), false).expect_err("refused");
            assert_eq!(refused.code(), Code::InvalidPreferences, "{invalid}");
            let Refusal::Invalid { issues, .. } = refused else { panic!("invalid: {invalid}") };
            assert!(!issues.is_empty(), "{invalid}");
        }
    }

    fn email(topic_id: &str, unsubscribed: bool) -> Email {
        let scheduled = proto::EmailScheduled {
            email_id: "em_1".into(),
            space_id: "spc_1".into(),
            contact_id: "con_1".into(),
            topic_id: topic_id.into(),
            ..Default::default()
        };
        Email { version: 2, scheduled, unsubscribed }
    }

    fn changed(topic_id: &str, status: &str, source: &str) -> LogEvent {
        LogEvent::SubscriptionChanged(proto::SubscriptionChanged {
            space_id: "spc_1".into(),
            contact_id: "con_1".into(),
            topic_id: topic_id.into(),
            status: status.into(),
            source: source.into(),
            source_id: "em_1".into(),
            at_ms: NOW_MS,
        })
    }

    fn email_unsubscribed(topic_id: &str) -> LogEvent {
        LogEvent::EmailUnsubscribed(proto::EmailUnsubscribed {
            email_id: "em_1".into(),
            space_id: "spc_1".into(),
            contact_id: "con_1".into(),
            topic_id: topic_id.into(),
            at_ms: NOW_MS,
        })
    }

    #[test]
    fn unsubscribing_leaves_the_topic_once_and_answers_the_same_again() {
        let command = Unsubscribe { email_id: "em_1".into(), browser: false };
        let loaded = Some((email("top_a", false), None, PageFacts::default()));
        let reply = given(loaded)
            .when(&command)
            .then_events(&[changed("top_a", "unsubscribed", "unsubscribe"), email_unsubscribed("top_a")]);
        let json = json!({"emailId": "em_1", "unsubscribed": true, "scope": "topic", "topicId": "top_a"});
        assert_eq!(reply, Reply::ok(json.clone()));
        let again = given(Some((email("top_a", true), None, PageFacts::default()))).when(&command).then_answers();
        assert_eq!(again, Reply::ok(json));
        given(None).when(&command).then_refused(Refusal::EmailNotFound("em_1".into()));
    }

    /// Ada, a contact of a schema with the email consent attribute `news`, holding `consented`.
    fn ada_consenting(consented: bool, wanted: bool) -> Option<Box<ConsentLoaded>> {
        use crate::records::decide::fixtures::{ada, context, input};
        let context = context(json!({"news": {"type": "boolean", "consent": {"channel": "email"}}}), 0);
        let mut ada = ada();
        if let Some(personal) = ada.personal.as_mut() {
            personal.values_json = json!({"news": consented}).to_string();
        }
        let schema = records::write_schema(&context, "spc_1");
        let input = records::parse_input(&schema, input(json!({"news": wanted}))).expect("valid");
        let target = (3, ada, None);
        Some(Box::new(ConsentLoaded { space_id: "spc_1".into(), context, input, target, owners: Owners::new() }))
    }

    #[test]
    fn unsubscribing_from_an_email_without_a_topic_withdraws_the_consent_carried_by_the_email() {
        let command = Unsubscribe { email_id: "em_1".into(), browser: false };
        let loaded = Some((email("", false), ada_consenting(true, false), PageFacts::default()));
        let outcome = given(loaded).when(&command).decided();
        let events = outcome.events();
        let [LogEvent::RecordUpdated(updated), LogEvent::EmailUnsubscribed(_)] = events[..] else {
            panic!("the consent's update, then the email's unsubscription: {events:?}")
        };
        assert_eq!(
            (updated.record_id.as_str(), updated.changed_keys.as_slice()),
            ("con_ada", &["news".to_owned()][..])
        );
        assert_eq!((updated.change_source.as_str(), updated.change_source_id.as_str()), ("unsubscribe", "em_1"));
        assert_eq!(updated.updated_at_ms, NOW_MS);
        let Outcome::Append(writes) = &outcome else { panic!("appended") };
        assert!(matches!(writes.streams[0].expected, ExpectedVersion::Exactly(3)), "at the version it was read at");
        let withdrawn = Some((email("", false), ada_consenting(false, false), PageFacts::default()));
        let outcome = given(withdrawn).when(&command).decided();
        assert!(matches!(outcome.events()[..], [LogEvent::EmailUnsubscribed(_)]), "a withdrawn consent is not written");
    }

    #[test]
    fn a_browser_is_answered_with_a_page_naming_the_parties() {
        let command = Unsubscribe { email_id: "em_1".into(), browser: true };
        let page = PageFacts { topic_name: Some("News".into()), sender: Some("Acme".into()), ..PageFacts::default() };
        let outcome = given(Some((email("", false), None, page))).when(&command).decided();
        let Outcome::Append(writes) = outcome else { panic!("appended") };
        assert_eq!(writes.space_id.as_deref(), Some("spc_1"));
        let Some(page) = crate::pipeline::html_of(&writes.reply) else { panic!("a page") };
        assert!(page.contains("Email from \u{2068}Acme\u{2069}.") && page.contains("emails about News"), "{page}");
    }

    fn recipient(subscribed: &[(&str, &str)]) -> Option<Preferences> {
        Some(Preferences {
            email: email("top_a", false),
            topics: [("top_a".to_owned(), "News".to_owned()), ("top_b".to_owned(), "Offers".to_owned())].into(),
            subscribed: subscribed.iter().map(|(topic, status)| ((*topic).to_owned(), (*status).to_owned())).collect(),
            consent: None,
            page: PageFacts { topic_name: Some("News".into()), sender: Some("Acme".into()), ..PageFacts::default() },
        })
    }

    #[test]
    fn leaving_everything_in_a_browser_names_the_sender_left() {
        let command = ChangePreferences { email_id: "em_1".into(), choice: Choice::LeaveAll, browser: true };
        let outcome = given(recipient(&[("top_a", "subscribed")])).when(&command).decided();
        let Outcome::Append(writes) = outcome else { panic!("appended") };
        let Some(page) = crate::pipeline::html_of(&writes.reply) else { panic!("a page") };
        assert!(page.contains("no longer receive marketing email from Acme."), "{page}");
        assert!(!page.contains("from us"), "{page}");
        let unknown_sender = PageFacts::default();
        assert_eq!(unknown_sender.sender_name(), "this sender");
    }

    #[test]
    fn leaving_the_emails_topic_on_the_page_is_an_opt_out_through_the_email() {
        let choice = Choice::Topics([("top_a".to_owned(), false), ("top_b".to_owned(), true)].into());
        let command = ChangePreferences { email_id: "em_1".into(), choice, browser: false };
        let reply = given(recipient(&[("top_a", "subscribed")])).when(&command).then_events(&[
            changed("top_b", "subscribed", "preferences"),
            changed("top_a", "unsubscribed", "preferences"),
            email_unsubscribed("top_a"),
        ]);
        assert_eq!(
            reply.json()["data"],
            json!({"emailId": "em_1", "unsubscribedFromAll": false,
                   "topics": {"top_a": "unsubscribed", "top_b": "subscribed"}})
        );
        let unchanged = Choice::Topics([("top_b".to_owned(), false)].into());
        let command = ChangePreferences { email_id: "em_1".into(), choice: unchanged, browser: false };
        given(recipient(&[])).when(&command).then_answers();
    }

    #[test]
    fn a_topic_of_another_space_or_an_unknown_email_is_refused() {
        let choice = Choice::Topics([("top_z".to_owned(), true)].into());
        let command = ChangePreferences { email_id: "em_1".into(), choice, browser: false };
        given(recipient(&[])).when(&command).then_refused(Refusal::Invalid {
            message: "a topic is not one of the space's".into(),
            issues: vec![Issue::for_key("topics.top_z", "no topic \"top_z\" in this space")],
        });
        given(None).when(&command).then_refused(Refusal::EmailNotFound("em_1".into()));
    }
}
