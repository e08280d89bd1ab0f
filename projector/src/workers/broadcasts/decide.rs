//! A run's batch decided: which pending recipients get their email (scheduled for the
//! hand-off, or held for later by the send policy) and which are skipped, and the stories of
//! the skipped ones. Pure: the step loads the recipients and what decided each refusal, draws
//! the ids through a `Fresh`, reads the clock, and appends.

use mail::outbox::{self, Prepared};
use mail::send::{Authored, EmailTo, Gate, Site, Verdict, allowance_guard, schedule};
use mail::skipped::DecidedBy;
use platform::error::Code;
use platform::fresh::Fresh;
use platform::ids::{RunId, SpaceId};
use platform::log::{AppendError, AppendRequest, Guard, SetValue, StreamAppend};

use crate::workers::email::recipients::{Allowed, Recipients};

/// A sending run as a step reads it.
#[derive(Clone)]
pub(super) struct Run {
    pub run_id: RunId,
    pub broadcast_id: String,
    pub space_id: SpaceId,
    pub template_id: String,
    pub sender_id: Option<String>,
    /// The experiment's variant this batch sends (its template, sender and subject are the
    /// fields above), if the run has an experiment.
    pub variant: Option<String>,
    /// The variant's subject, replacing the template's.
    pub subject: Option<String>,
    /// The variant's preheader.
    pub preheader: Option<String>,
    /// The variant is sent as the experiment's winner (to the rest), not in its test.
    pub winner: bool,
}

impl Run {
    /// The run as it sends `variant` of its experiment, in its test or as its `winner`.
    pub(super) fn for_variant(&self, variant: &domain::email::experiments::VariantDef, winner: bool) -> Self {
        Self {
            run_id: self.run_id.clone(),
            broadcast_id: self.broadcast_id.clone(),
            space_id: self.space_id.clone(),
            template_id: variant.template_id.clone().unwrap_or_else(|| self.template_id.clone()),
            sender_id: variant.sender_id.clone().or_else(|| self.sender_id.clone()),
            variant: Some(variant.id.clone()),
            subject: variant.subject.clone(),
            preheader: variant.preheader.clone(),
            winner,
        }
    }

    fn origin(&self) -> mail::send::Origin<'_> {
        mail::send::Origin::broadcast(&self.broadcast_id, &self.run_id)
            .with_variant(self.variant.as_deref().unwrap_or(""), self.winner)
    }
}

/// Recipients the decision refused: the gate, and the log position that decided when the
/// decision knows it.
pub(super) type Skipped = Vec<(String, Gate, Option<i64>)>;

/// The reason a refused recipient is counted under in its run.
pub(crate) fn reason(gate: Gate) -> &'static str {
    match gate {
        Gate::Consent => "no_consent",
        Gate::Topic => "not_subscribed",
        gate => gate.as_str(),
    }
}

/// What a step decides on.
pub(super) struct Step<'a> {
    pub run: &'a Run,
    pub authored: &'a Authored,
    pub recipients: &'a Recipients,
    pub site: &'a Site,
    pub now: i64,
}

/// A batch decided: one append per recipient let through (with the email to hand off, when
/// not held), and the recipients refused.
pub(super) struct Batch {
    pub appends: Vec<(String, AppendRequest, Option<Prepared>)>,
    pub skipped: Skipped,
}

/// Decides each of the run's `pending` recipients, as every send is decided
/// (`mail::send::decide`).
pub(super) fn decide_batch(step: Step<'_>, pending: &[String], fresh: &mut dyn Fresh) -> anyhow::Result<Batch> {
    let Step { run, authored, recipients, site, now } = step;
    let public_base_url = &site.base_url;
    let mut skipped: Skipped = Vec::new();
    let mut appends = Vec::new();
    for contact_id in pending {
        let facts = recipients.facts(authored, contact_id, now);
        let zone = mail::send::zone_used(&facts);
        let follows = mail::send::follows(&facts);
        let held = match mail::send::decide(&facts) {
            Verdict::Send => None,
            Verdict::Skip { gate, decided_by } => {
                skipped.push((contact_id.clone(), gate, decided_by));
                continue;
            }
            Verdict::Hold { until_ms, gate } => Some((until_ms, gate)),
        };
        let Some(Allowed { contact, address, key }) = recipients.allowed(contact_id) else {
            skipped.push((contact_id.clone(), Gate::Gone, None));
            continue;
        };
        let context = serde_json::json!({ authored.template.recipient.clone(): contact.document });
        let email_id = fresh.id("em");
        let rendered = match mail::send::render_email(authored, &email_id, context, site) {
            Ok(rendered) => rendered,
            Err(error) => anyhow::bail!("template {} does not render: {error}", run.template_id),
        };
        let to = EmailTo { space_id: &run.space_id, contact_id, address, key, follows };
        let scheduled = schedule(&email_id, authored, to, &rendered, run.origin(), (now, public_base_url))?
            .decided_in(zone.as_ref());
        // A held recipient's email is stored now and decided again at its time by the held
        // sends worker; the others are handed off after the batch.
        let (stream, mut guards, email) = match held {
            None => {
                let mut guards = vec![
                    outbox::insert_guard(&email_id, &run.space_id),
                    recipient_moved(&run.run_id, contact_id, &email_id, "scheduled"),
                ];
                guards.extend(scheduled.guards);
                (scheduled.stream, guards, Some(scheduled.prepared))
            }
            Some((until_ms, gate)) => {
                let held = scheduled.hold(until_ms, gate, now);
                (held.stream, vec![held.guard, recipient_moved(&run.run_id, contact_id, &email_id, "held")], None)
            }
        };
        if let Some(allowance) = &authored.allowance {
            guards.push(allowance_guard(&run.space_id, now, allowance.monthly));
        }
        let request = AppendRequest::in_space(&run.space_id, vec![stream], guards);
        appends.push((contact_id.clone(), request, email));
    }
    Ok(Batch { appends, skipped })
}

/// The stories of the refused recipients: each one's `EmailSkipped` (with the log event that
/// decided, `found` in the same order) and the guard moving them all to `skipped`.
pub(super) fn skip_stories(
    run: &Run,
    (authored, recipients): (&Authored, &Recipients),
    skipped: &Skipped,
    found: Vec<Option<DecidedBy>>,
    now: i64,
    fresh: &mut dyn Fresh,
) -> (Vec<StreamAppend>, Guard) {
    let origin = run.origin();
    let mut streams = Vec::with_capacity(skipped.len());
    let (mut contact_ids, mut reasons, mut email_ids) = (Vec::new(), Vec::new(), Vec::new());
    for ((contact_id, gate, _), by) in skipped.iter().zip(found) {
        let email_id = fresh.id("em");
        let zone = mail::send::zone_used(&recipients.facts(authored, contact_id, now));
        streams.push(mail::skipped::skipped(mail::skipped::Skip {
            email_id: &email_id,
            space_id: &run.space_id,
            authored,
            contact_id,
            origin,
            gate: *gate,
            decided_by: by.as_ref(),
            recipient: recipients.sealable(contact_id),
            zone: zone.as_ref(),
            at_ms: now,
        }));
        contact_ids.push(contact_id.clone());
        reasons.push(reason(*gate).to_owned());
        email_ids.push(email_id);
    }
    let count = contact_ids.len();
    let moved = Guard {
        sql: "UPDATE broadcast_recipients r SET state = 'skipped', reason = s.reason, email_id = s.email_id, counted = false
              FROM unnest($2::text[], $3::text[], $4::text[]) AS s(contact_id, reason, email_id)
              WHERE r.run_id = $1 AND r.contact_id = s.contact_id AND r.state = 'pending'",
        params: vec![Box::new(run.run_id.clone()), Box::new(contact_ids), Box::new(reasons), Box::new(email_ids)],
        conflict: AppendError::Conflict {
            code: Code::OperationTaken,
            message: "a recipient was already decided".to_owned(),
        },
        expect_rows: Some(u64::try_from(count).unwrap_or(u64::MAX)),
        set: None,
    };
    (streams, moved)
}

/// Moves the recipient from `pending` to `state` (`scheduled` or `held`) with its email, in
/// the email's append: a recipient decided before (by a process that died after its append)
/// refuses it.
fn recipient_moved(run_id: &str, contact_id: &str, email_id: &str, state: &str) -> Guard {
    let row = [run_id, contact_id, email_id, state].map(|value| SetValue::Text(Some(value.to_owned()))).to_vec();
    Guard::exactly_one(
        "UPDATE broadcast_recipients SET state = $4, email_id = $3
         WHERE run_id = $1 AND contact_id = $2 AND state = 'pending'",
        vec![
            Box::new(run_id.to_owned()),
            Box::new(contact_id.to_owned()),
            Box::new(email_id.to_owned()),
            Box::new(state.to_owned()),
        ],
        AppendError::Conflict { code: Code::OperationTaken, message: "the recipient was already decided".to_owned() },
    )
    .with_set(
        "UPDATE broadcast_recipients r SET state = w.state, email_id = w.email_id
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS w(run_id, contact_id, email_id, state)
         WHERE r.run_id = w.run_id AND r.contact_id = w.contact_id AND r.state = 'pending'",
        row,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::email::recipients::Contact;
    use platform::crypto::Keyring;
    use platform::crypto::Keys;
    use platform::events::LogEvent;
    use platform::fresh::Counted;
    use serde_json::json;

    use crate::workers::email::recipients::fixtures::{TOPIC, authored, given};

    /// The decision on `con_1` for a marketing template of topic `topic`: the address it is
    /// sent to, or the gate that refused it.
    fn verdict<'a>(recipients: &'a Recipients, topic: Option<&str>) -> Result<&'a str, Gate> {
        decided(recipients, topic, "con_1")
    }

    fn decided<'a>(recipients: &'a Recipients, topic: Option<&str>, contact_id: &str) -> Result<&'a str, Gate> {
        let authored = authored(topic);
        match mail::send::decide(&recipients.facts(&authored, contact_id, 0)) {
            Verdict::Send => recipients.allowed(contact_id).map(|allowed| allowed.address).ok_or(Gate::Gone),
            Verdict::Skip { gate, .. } | Verdict::Hold { gate, .. } => Err(gate),
        }
    }

    #[test]
    fn given_a_consenting_subscribed_contact_when_checked_then_it_is_sent_to_its_address() {
        let recipients = given(json!({"email": "ada@example.test", "emailOk": true}), Some("subscribed"));
        assert_eq!(verdict(&recipients, Some(TOPIC)), Ok("ada@example.test"));
        assert_eq!(verdict(&recipients, None), Ok("ada@example.test"), "a template without a topic asks consent only");
    }

    #[test]
    fn given_a_contact_deleted_or_erased_since_the_snapshot_when_checked_then_it_is_gone() {
        let recipients = given(json!({"email": "ada@example.test", "emailOk": true}), Some("subscribed"));
        assert_eq!(decided(&recipients, None, "con_2"), Err(Gate::Gone), "not in the read model");
        let mut erased = given(json!({"email": "ada@example.test", "emailOk": true}), Some("subscribed"));
        erased.keys = Keys::default();
        assert_eq!(verdict(&erased, None), Err(Gate::Gone), "its data key is destroyed");
    }

    #[test]
    fn given_no_address_or_a_suppressed_one_when_checked_then_the_reason_says_which() {
        let no_address = given(json!({"emailOk": true}), Some("subscribed"));
        assert_eq!(verdict(&no_address, None), Err(Gate::NoAddress));
        let mut suppressed = given(json!({"email": "ada@example.test", "emailOk": true}), Some("subscribed"));
        suppressed.suppressed.insert("ada@example.test".to_owned());
        assert_eq!(verdict(&suppressed, None), Err(Gate::Suppressed));
    }

    #[test]
    fn given_consent_missing_withdrawn_or_unknown_when_checked_then_the_consent_gate_refuses_it() {
        let withdrawn = given(json!({"email": "ada@example.test", "emailOk": false}), Some("subscribed"));
        assert_eq!(verdict(&withdrawn, None), Err(Gate::Consent));
        let unset = given(json!({"email": "ada@example.test"}), Some("subscribed"));
        assert_eq!(verdict(&unset, None), Err(Gate::Consent));
        let mut no_consent_attribute = given(json!({"email": "ada@example.test", "emailOk": true}), None);
        no_consent_attribute.consent_keys.clear();
        assert_eq!(
            verdict(&no_consent_attribute, None),
            Err(Gate::Consent),
            "a schema without consent is never mailed"
        );
    }

    #[test]
    fn given_a_topic_when_the_contact_is_not_subscribed_to_it_then_it_is_skipped() {
        for status in [None, Some("unsubscribed"), Some("pending")] {
            let recipients = given(json!({"email": "ada@example.test", "emailOk": true}), status);
            assert_eq!(verdict(&recipients, Some(TOPIC)), Err(Gate::Topic), "{status:?}");
        }
    }

    fn run() -> Run {
        Run {
            run_id: "run_1".into(),
            broadcast_id: "bc_1".into(),
            space_id: "spc_1".into(),
            template_id: "tpl_1".into(),
            sender_id: None,
            variant: None,
            subject: None,
            preheader: None,
            winner: false,
        }
    }

    static SITE: std::sync::LazyLock<Site> = std::sync::LazyLock::new(|| Site {
        base_url: "https://api.example.test".to_owned(),
        links: mail::tracking::Links::derive(|_| [7; 32], 1, &[]),
    });

    #[test]
    fn a_batch_schedules_the_recipients_let_through_and_skips_the_rest_with_their_gate() {
        let mut recipients = given(json!({"email": "ada@example.test", "emailOk": true}), Some("subscribed"));
        // con_2 has an address, consent and a key, but is not subscribed to the topic.
        let con_2 = json!({"email": "bob@example.test", "emailOk": true});
        recipients.contacts.insert("con_2".into(), Contact { schema_id: "contacts".into(), document: con_2 });
        let keyring = Keyring::from_hex(&"ab".repeat(32)).expect("a key");
        recipients.keys.insert("con_2".into(), keyring.generate("con_2").expect("a data key").0);
        let authored = authored(Some(TOPIC));
        let (run, pending) = (run(), ["con_1".to_owned(), "con_2".to_owned(), "con_3".to_owned()]);
        let step = Step { run: &run, authored: &authored, recipients: &recipients, site: &SITE, now: 5 };
        let mut fresh = Counted::new().expect("test keys");
        let Batch { appends, skipped } = decide_batch(step, &pending, &mut fresh).expect("decided");
        assert_eq!(appends.len(), 1);
        let (contact_id, request, prepared) = &appends[0];
        assert_eq!(contact_id, "con_1");
        assert_eq!(request.streams[0].stream_id, "email-em_1", "its email id was drawn from the Fresh");
        assert!(matches!(request.streams[0].events[0].event, LogEvent::EmailScheduled(_)));
        assert_eq!(prepared.as_ref().map(|prepared| prepared.outgoing.to.as_str()), Some("ada@example.test"));
        let gates: Vec<(&str, Gate)> = skipped.iter().map(|(contact, gate, _)| (contact.as_str(), *gate)).collect();
        assert_eq!(gates, [("con_2", Gate::Topic), ("con_3", Gate::Gone)]);
    }

    #[test]
    fn the_skipped_get_one_story_each_naming_the_address_sealed_and_move_together() {
        let authored = authored(None);
        let recipients = given(json!({"email": "ada@example.test"}), None);
        let skipped: Skipped = vec![("con_1".into(), Gate::Consent, None), ("con_2".into(), Gate::Suppressed, None)];
        let mut fresh = Counted::new().expect("test keys");
        let (streams, moved) =
            skip_stories(&run(), (&authored, &recipients), &skipped, vec![None, None], 5, &mut fresh);
        let ids: Vec<&str> = streams.iter().map(|stream| stream.stream_id.as_str()).collect();
        assert_eq!(ids, ["email-em_1", "email-em_2"]);
        let addresses: Vec<Option<String>> = streams
            .iter()
            .map(|stream| match &stream.events[0].event {
                LogEvent::EmailSkipped(skipped) => {
                    let opened: Option<platform::proto::EmailRecipient> =
                        platform::events::open(skipped.recipient.as_ref(), &recipients.keys).expect("opens");
                    opened.map(|recipient| recipient.address)
                }
                other => panic!("an EmailSkipped was expected: {other:?}"),
            })
            .collect();
        assert_eq!(addresses, [Some("ada@example.test".to_owned()), None], "con_2 is not in the batch's contacts");
        assert_eq!(moved.expect_rows, Some(2));
        assert_eq!(
            [reason(Gate::Consent), reason(Gate::Topic), reason(Gate::Suppressed)],
            ["no_consent", "not_subscribed", "suppressed"],
            "never consenting is counted apart from leaving a topic"
        );
    }
}
