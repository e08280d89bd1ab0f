//! The send decision: whether one email goes now, waits, or does not go, and which gate said
//! so. Every send asks it (a template send, a form's confirmation, a broadcast's recipient, a
//! journey's send step); no other code decides a gate. Pure: the caller loads the facts
//! (with one statement per batch, never per recipient) and acts on the verdict.
//!
//! The gates, in order: the contact is gone (deleted or erased); it has no address; the
//! address is suppressed (every send, transactional ones too); for marketing mail, the
//! contact's email consent and its subscription to the template's topic; then the space's
//! send policy (frequency caps and quiet hours in the recipient's local time, marketing
//! only); last, the month's allowance, which the append counts and reports back.

pub mod policy;

use kernel::error::Code;
use serde_json::Value;

pub use policy::{Outcome, Ruling, SendPolicy, Sent};

/// What a template sends: marketing mail passes every gate, transactional mail (a form's
/// confirmation too) only the recipient's own gates and suppressions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Marketing,
    Transactional,
}

impl Kind {
    /// The kind of a template of kind `kind` (`marketing` or `transactional`).
    pub fn of(kind: &str) -> Self {
        if kind == "marketing" { Kind::Marketing } else { Kind::Transactional }
    }
}

/// The gate that refused (or held) a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Gate {
    /// The contact was deleted or erased.
    Gone,
    /// The contact has no email address.
    NoAddress,
    /// The address is suppressed (every send).
    Suppressed,
    /// The contact has not consented to marketing email.
    Consent,
    /// The contact is not subscribed to the marketing template's topic.
    Topic,
    /// A frequency cap of the space's send policy.
    FrequencyCap,
    /// The quiet hours of the space's send policy, in the recipient's local time.
    QuietHours,
    /// The space's monthly allowance is used up.
    Allowance,
}

impl Gate {
    pub const ALL: [Gate; 8] = [
        Gate::Gone,
        Gate::NoAddress,
        Gate::Suppressed,
        Gate::Consent,
        Gate::Topic,
        Gate::FrequencyCap,
        Gate::QuietHours,
        Gate::Allowance,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Gate::Gone => "gone",
            Gate::NoAddress => "no_address",
            Gate::Suppressed => "suppressed",
            Gate::Consent => "consent",
            Gate::Topic => "topic",
            Gate::FrequencyCap => "frequency_cap",
            Gate::QuietHours => "quiet_hours",
            Gate::Allowance => "allowance",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|gate| gate.as_str() == text)
    }

    /// The refusal's code, as a template send answers it (D9, D11).
    pub fn code(self) -> Code {
        match self {
            Gate::Gone => Code::RecordNotFound,
            Gate::NoAddress => Code::RecipientMissing,
            Gate::Suppressed => Code::RecipientSuppressed,
            Gate::Consent | Gate::Topic => Code::RecipientNotSubscribed,
            Gate::FrequencyCap => Code::FrequencyCapped,
            Gate::QuietHours => Code::QuietHours,
            Gate::Allowance => Code::EmailLimitReached,
        }
    }

    /// Why, in words.
    pub fn reason(self) -> &'static str {
        match self {
            Gate::Gone => "the contact was deleted or erased",
            Gate::NoAddress => "the contact has no email address",
            Gate::Suppressed => "the recipient's address is suppressed",
            Gate::Consent => "the contact has not consented to marketing email",
            Gate::Topic => "the contact is not subscribed to the template's topic",
            Gate::FrequencyCap => "a frequency cap of the space's send policy is reached for this contact",
            Gate::QuietHours => "it is within the quiet hours of the space's send policy in the contact's time zone",
            Gate::Allowance => "the space's email allowance for this month is used up",
        }
    }
}

/// The contact's email consent: given when the schema has email consent attributes and every
/// one of them is `true`; `None` when the schema has none (marketing mail then never goes).
/// `value_of` reads an attribute of the contact.
pub fn email_consent<'v>(consent_keys: &[String], value_of: impl Fn(&str) -> Option<&'v Value>) -> Option<bool> {
    if consent_keys.is_empty() {
        return None;
    }
    Some(consent_keys.iter().all(|key| value_of(key) == Some(&Value::Bool(true))))
}

/// The keys of the email consent attributes among `attributes` (a schema's).
pub fn consent_keys(attributes: &[crate::catalog::AttributeEntry]) -> Vec<String> {
    attributes
        .iter()
        .filter(|attribute| is_email_consent(&attribute.definition))
        .map(|attribute| attribute.key.clone())
        .collect()
}

/// Whether an attribute of definition `definition` is an email consent attribute
/// (`consent.channel` is `email`).
pub fn is_email_consent(definition: &Value) -> bool {
    definition.pointer("/consent/channel").and_then(Value::as_str) == Some("email")
}

/// What is known about the recipient when a send is decided.
#[derive(Debug, Clone, Default)]
pub struct Contact<'a> {
    pub address: Option<&'a str>,
    pub suppressed: bool,
    /// [`email_consent`].
    pub consent: Option<bool>,
    /// Its status in the template's topic (`subscribed`, `pending`, `unsubscribed`), if any.
    pub subscription: Option<&'a str>,
    /// The value of the policy's time-zone attribute, if any.
    pub zone: Option<&'a str>,
    /// Its marketing sends within the policy's longest window (any order).
    pub sent: &'a [Sent],
}

/// Everything one send is decided on.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    pub kind: Kind,
    /// The template's topic (marketing).
    pub topic_id: Option<&'a str>,
    /// `None`: the contact is gone.
    pub contact: Option<Contact<'a>>,
    /// The space's send policy, if it has one.
    pub policy: Option<&'a SendPolicy>,
    /// The append refused the send because the allowance is used up.
    pub allowance_refused: bool,
    pub now_ms: i64,
}

/// What happens to the send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Send,
    /// Decided again at `until_ms`.
    Hold {
        until_ms: i64,
        gate: Gate,
    },
    /// Not sent; `decided_by` is the log position of what decided when the facts know it
    /// (the send that filled a cap); the caller looks up the others' ([`Gate`]).
    Skip {
        gate: Gate,
        decided_by: Option<i64>,
    },
}

impl Verdict {
    fn skip(gate: Gate) -> Self {
        Verdict::Skip { gate, decided_by: None }
    }
}

/// The zone the space's send policy decides a marketing send in, by its IANA name, and
/// where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneUsed {
    pub name: String,
    pub source: policy::ZoneSource,
}

impl ZoneUsed {
    /// As the log records it.
    pub fn to_proto(&self) -> kernel::proto::PolicyZone {
        kernel::proto::PolicyZone { name: self.name.clone(), source: self.source.as_str().to_owned() }
    }
}

/// The zone the send policy reads for the send of `facts`: `None` for transactional mail,
/// without a policy, or when the contact is gone.
pub fn zone_used(facts: &Facts<'_>) -> Option<ZoneUsed> {
    let policy = facts.policy.filter(|_| facts.kind == Kind::Marketing)?;
    let contact = facts.contact.as_ref()?;
    let (tz, source) = policy.time_zone.explain(contact.zone);
    Some(ZoneUsed { name: tz.name().to_owned(), source })
}

/// The send decision (see the module's documentation for the order of the gates).
pub fn decide(facts: &Facts<'_>) -> Verdict {
    let Some(contact) = &facts.contact else { return Verdict::skip(Gate::Gone) };
    if contact.address.is_none_or(str::is_empty) {
        return Verdict::skip(Gate::NoAddress);
    }
    if contact.suppressed {
        return Verdict::skip(Gate::Suppressed);
    }
    if facts.kind == Kind::Marketing {
        if contact.consent != Some(true) {
            return Verdict::skip(Gate::Consent);
        }
        if facts.topic_id.is_some() && contact.subscription != Some("subscribed") {
            return Verdict::skip(Gate::Topic);
        }
        if let Some(policy) = facts.policy {
            let zone = policy.time_zone.resolve(contact.zone);
            match policy.rule(zone, facts.now_ms, contact.sent) {
                Ruling::Allow => {}
                // A held email counts against the allowance when it is stored: with the
                // allowance used up it cannot be held, and holding it again would refuse it
                // again (a broadcast's recipients stayed pending for ever).
                Ruling::Hold { .. } if facts.allowance_refused => return Verdict::skip(Gate::Allowance),
                Ruling::Hold { until_ms, rule } => return Verdict::Hold { until_ms, gate: gate_of(rule) },
                Ruling::Skip { rule, filled_by } => {
                    return Verdict::Skip { gate: gate_of(rule), decided_by: filled_by };
                }
            }
        }
    }
    if facts.allowance_refused {
        return Verdict::skip(Gate::Allowance);
    }
    Verdict::Send
}

fn gate_of(rule: policy::Rule) -> Gate {
    match rule {
        policy::Rule::QuietHours => Gate::QuietHours,
        policy::Rule::FrequencyCap => Gate::FrequencyCap,
    }
}

#[cfg(test)]
mod tests;
