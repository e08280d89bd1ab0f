//! What a decision reads besides the run's row and definition: the facts loaded for it when
//! a step reaches for them, what it is given (the time, a call's outcome), and what it asks for
//! when a fact is missing.

use std::collections::{BTreeMap, BTreeSet};

use domain::records::RecordState;
use domain::webhooks::signing::Secret;
use domain::workflows::EngagementAction;
use mail::send::{Authored, Gate};
use mail::skipped::DecidedBy;
use platform::crypto::DataKey;
use serde_json::Value;

use domain::webhooks::attempt::AttemptResult;

/// What a decision reads beyond the run's row and definition, loaded when a step reaches
/// for it (see [`Need`]).
#[derive(Default)]
pub struct Facts {
    /// The run's contact, once a step needed it.
    pub contact: Option<ContactFacts>,
    /// Send steps' templates with their sender, domain and allowance, by template id (`None`:
    /// the template is gone).
    pub templates: BTreeMap<String, Option<Authored>>,
    /// Whether an address is suppressed in the run's space.
    pub suppressed: BTreeMap<String, bool>,
    /// The secret the workflow's calls are signed with, opened (`Some(None)`: it signs
    /// nothing).
    pub secret: Option<Option<Secret>>,
    /// What a person did with the run's emails, by email id.
    pub engagement: BTreeMap<String, Engaged>,
    /// The fact that decided a gate's refusal, by gate (`None`: no event decided).
    pub decided_by: BTreeMap<&'static str, Option<DecidedBy>>,
    /// The contact's marketing sends within the send policy's caps' windows, once a
    /// marketing send under caps needed them.
    pub sent: Option<Vec<mail::send::Sent>>,
}

/// Whether a person opened an email and followed one of its links (machines' opens and
/// clicks are left out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Engaged {
    pub opened: bool,
    pub clicked: bool,
}

impl Engaged {
    pub(super) fn did(self, action: EngagementAction) -> bool {
        match action {
            EngagementAction::Opened => self.opened,
            EngagementAction::Clicked => self.clicked,
        }
    }
}

impl Facts {
    pub(super) fn contact(&self) -> Result<&ContactFacts, Stop> {
        self.contact.as_ref().ok_or(Stop::Needs(Need::Contact))
    }

    /// What a person did with `email_ids`, once loaded.
    pub(super) fn engaged(&self, email_ids: &[String]) -> Result<Vec<Engaged>, Stop> {
        let missing: Vec<String> = email_ids.iter().filter(|id| !self.engagement.contains_key(*id)).cloned().collect();
        if !missing.is_empty() {
            return Err(Stop::Needs(Need::Engagement(missing)));
        }
        Ok(email_ids.iter().map(|id| self.engagement.get(id).copied().unwrap_or_default()).collect())
    }
}

/// The email a send step of the run last scheduled (its output), if any.
pub(super) fn email_of(outputs: &BTreeMap<String, Value>, step_id: &str) -> Option<String> {
    outputs.get(step_id)?.get("emailId")?.as_str().map(str::to_owned)
}

/// A fact a decision needs before it can be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// The run's contact: its record, consent, subscriptions and segments.
    Contact,
    /// A template, by id, with its sender, domain and the space's allowance.
    Template(String),
    /// Whether an address is suppressed.
    Suppression(String),
    /// The workflow's signing secret, opened.
    Secret,
    /// What a person did with these emails of the run.
    Engagement(Vec<String>),
    /// The fact that decided a gate's refusal of a send to `address` (of a template with
    /// `topic_id`; for a cap, the position of the send that filled it, as the decision named it).
    DecidedBy { gate: Gate, address: String, topic_id: Option<String>, filled_by: Option<i64> },
    /// The contact's marketing sends since `since_ms` (the caps count them).
    MarketingSends { since_ms: i64 },
}

/// What a decision is given besides the run and the facts.
pub struct Given<'a> {
    pub now: i64,
    /// The factor a retry's delay is scaled by (0.8 to 1.2), drawn once per transition.
    pub jitter: f64,
    /// The month's allowance refused the email this transition scheduled: the send is skipped.
    pub allowance_refused: bool,
    /// The outcome of the webhook call the run has in flight, just made.
    pub call_outcome: Option<&'a CallOutcome>,
    /// The delays of a call's retries (`APP__WEBHOOKS__RETRY_SCHEDULE_MS`).
    pub retry_schedule_ms: &'a [u64],
    /// The base of the links in email (`APP__EMAIL__PUBLIC_BASE_URL`) and the keys that sign
    /// tracking links.
    pub site: &'a mail::send::Site,
    /// The revision a newer publish moves the run to, with its definition (the run's
    /// `migrate_to`).
    pub newer: Option<(i64, &'a domain::workflows::WorkflowDef)>,
}

/// Why a transition was not made: a fact is missing, or the run is broken.
pub(super) enum Stop {
    Needs(Need),
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Stop {
    fn from(error: anyhow::Error) -> Self {
        Self::Failed(error)
    }
}

/// A contact as steps read it.
#[derive(Clone)]
pub struct Contact {
    pub version: i64,
    pub state: RecordState,
    pub key: Option<DataKey>,
    pub consent: Option<bool>,
    /// The keys of the contact's email consent attributes (`consent` is whether all are true).
    pub consent_keys: Vec<String>,
    pub subscriptions: BTreeMap<String, String>,
    pub segments: BTreeSet<String>,
    /// The contact schema's attributes, which bound what an update step writes.
    pub attributes: Vec<domain::catalog::AttributeEntry>,
}

/// What a run's contact is now.
#[derive(Clone)]
pub enum ContactFacts {
    /// The run has none.
    None,
    /// Being deleted or erased: the run ends.
    Gone,
    Live(Box<Contact>),
}

/// What a webhook call came to.
pub struct CallOutcome {
    pub result: AttemptResult,
    /// The answer's body, when it is JSON.
    pub body: Option<Value>,
}
