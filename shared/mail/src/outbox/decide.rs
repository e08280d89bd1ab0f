//! The outbox's decisions: what a relay's outcome comes to (recorded, or queued again), the
//! events and guards that record it, and the answer a replay gets. Pure: the hand-off draws the
//! suppression's id and subject and reads the clock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{AppendError, ExpectedVersion, Guard, NewEvent, SetValue, StreamAppend};
use platform::proto;
use serde_json::{Value, json};

use super::{Lease, Parties};
use crate::mailer::Outcome;

/// The answer of a send once its outcome is known: `{data: {emailId, status, error}}`.
pub fn answer(email_id: &str, failure: Option<(&str, &str)>) -> Value {
    json!({ "data": {
        "emailId": email_id,
        "status": if failure.is_some() { "failed" } else { "sent" },
        "error": failure.map(|(code, message)| json!({ "code": code, "message": message })),
    }})
}

/// What to record for an outcome: `None` for one the outbox worker retries later (refused for
/// now, or the relay unreachable, while `retry` says so).
pub fn outcome_event(parties: &Parties, outcome: &Outcome, retry: bool, now_ms: i64) -> Option<LogEvent> {
    let failed = |code: &str, message: &str, permanent: bool| {
        LogEvent::EmailFailed(proto::EmailFailed {
            email_id: parties.email_id.clone(),
            space_id: parties.space_id.clone(),
            contact_id: parties.contact_id.clone(),
            code: code.to_owned(),
            message: message.to_owned(),
            permanent,
            failed_at_ms: now_ms,
        })
    };
    match outcome {
        Outcome::Accepted { reply } => Some(LogEvent::EmailSent(proto::EmailSent {
            email_id: parties.email_id.clone(),
            space_id: parties.space_id.clone(),
            contact_id: parties.contact_id.clone(),
            message_id: parties.message_id.clone(),
            relay_reply: reply.clone(),
            sent_at_ms: now_ms,
        })),
        Outcome::Rejected { permanent: true, reply, .. } => Some(failed("relay_rejected", reply, true)),
        Outcome::Rejected { permanent: false, .. } | Outcome::Unreachable { .. } if retry => None,
        Outcome::Rejected { permanent: false, reply, .. } => Some(failed("relay_rejected", reply, false)),
        Outcome::Unreachable { message } => Some(failed("relay_unavailable", message, false)),
        Outcome::Unknown { message } => Some(unknown(parties, message, now_ms)),
    }
}

pub fn unknown(parties: &Parties, reason: &str, now_ms: i64) -> LogEvent {
    LogEvent::EmailOutcomeUnknown(proto::EmailOutcomeUnknown {
        email_id: parties.email_id.clone(),
        space_id: parties.space_id.clone(),
        contact_id: parties.contact_id.clone(),
        reason: reason.to_owned(),
        at_ms: now_ms,
    })
}

/// The row's final state and the answer of a recorded outcome event.
pub(crate) fn settled(event: &LogEvent) -> (&'static str, Option<Value>) {
    match event {
        LogEvent::EmailSent(sent) => ("sent", Some(answer(&sent.email_id, None))),
        LogEvent::EmailFailed(failed) => {
            ("failed", Some(answer(&failed.email_id, Some((failed.code.as_str(), failed.message.as_str())))))
        }
        _ => ("unknown", None),
    }
}

/// A mailbox the relay says does not exist (a hard bounce at the relay): 550, 551 or 553.
pub fn hard_bounce(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Rejected { permanent: true, code: Some(550 | 551 | 553), .. })
}

/// A hard bounce at the relay: the address to suppress and the enhanced status of the
/// refusal (empty when it carried none).
#[derive(Debug, Clone, PartialEq)]
pub struct Bounce {
    pub address: String,
    pub status: String,
}

/// What a hand-off's relay outcome comes to.
#[derive(Debug, Clone, PartialEq)]
pub enum Settle {
    /// Record this outcome event (and, for a hard bounce, the bounce and its suppression).
    Record { event: Box<LogEvent>, bounce: Option<Bounce> },
    /// Refused for now, or the relay unreachable, with retries left: queue it again after
    /// `delay`.
    Retry { delay: Duration, error: String },
}

/// Settles the relay's `outcome` of the hand-off of an email to `address` (whose reply is
/// redacted of it) that was attempted `attempts` times before; `retry_schedule` is the outbox
/// worker's delays, `None` (the inline hand-off) making a refusal for now or an unreachable
/// relay final.
pub fn settle(
    parties: &Parties,
    outcome: Outcome,
    address: &str,
    (attempts, retry_schedule): (i32, Option<&[u64]>),
    now_ms: i64,
) -> Settle {
    let outcome = redact(outcome, address);
    let bounce = hard_bounce(&outcome).then(|| Bounce {
        address: address.to_owned(),
        status: match &outcome {
            Outcome::Rejected { reply, .. } => crate::enhanced_status(reply).unwrap_or_default(),
            _ => String::new(),
        },
    });
    let delay = retry_schedule.and_then(|schedule| usize::try_from(attempts).ok().and_then(|n| schedule.get(n)));
    match outcome_event(parties, &outcome, delay.is_some(), now_ms) {
        Some(event) => Settle::Record { event: Box::new(event), bounce },
        None => {
            let error = match &outcome {
                Outcome::Rejected { reply, .. } => reply.clone(),
                Outcome::Unreachable { message } => message.clone(),
                _ => String::new(),
            };
            Settle::Retry { delay: Duration::from_millis(delay.copied().unwrap_or(0)), error }
        }
    }
}

/// The event of an email whose contact was erased before it left.
pub fn erased(parties: &Parties, now_ms: i64) -> LogEvent {
    LogEvent::EmailFailed(proto::EmailFailed {
        email_id: parties.email_id.clone(),
        space_id: parties.space_id.clone(),
        contact_id: parties.contact_id.clone(),
        code: "recipient_erased".to_owned(),
        message: "the contact was deleted before the email left".to_owned(),
        permanent: true,
        failed_at_ms: now_ms,
    })
}

/// A new provider suppression: its id, its normalized identifier and that one's subject.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSuppression {
    pub suppression_id: String,
    pub identifier: String,
    pub subject_id: String,
}

/// The append that records an outcome `event` under the `lease`: the event (with the hard
/// `bounce`, when there is one) on the email's stream, the `suppression` of the bounced
/// address when it is to be added, the row's final state, and the answer of the send's
/// idempotency claim.
pub(super) fn outcome_append(
    parties: &Parties,
    lease: &Lease,
    event: LogEvent,
    bounce: Option<&Bounce>,
    suppression: Option<NewSuppression>,
    now: DateTime<Utc>,
) -> (Vec<StreamAppend>, Vec<Guard>) {
    let (state, answer) = settled(&event);
    let error = match &event {
        LogEvent::EmailFailed(failed) => Some(failed.message.clone()),
        LogEvent::EmailOutcomeUnknown(unknown) => Some(unknown.reason.clone()),
        _ => None,
    };
    let row = vec![
        SetValue::Text(Some(lease.email_id.clone())),
        SetValue::Uuid(lease.token),
        SetValue::Text(Some(state.to_owned())),
        SetValue::Text(error.clone()),
    ];
    let mut guards = vec![
        Guard::exactly_one(
            "UPDATE email_outbox SET state = $3, leased_until = NULL, last_error = $4
         WHERE email_id = $1 AND lease_token = $2 AND (state || '') = 'attempting'",
            vec![Box::new(lease.email_id.clone()), Box::new(lease.token), Box::new(state), Box::new(error)],
            AppendError::Conflict {
                code: Code::IdempotencyConflict,
                message: "the hand-off's lease was lost".to_owned(),
            },
        )
        .with_set(
            "UPDATE email_outbox o SET state = w.state, leased_until = NULL, last_error = w.last_error
         FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[]) AS w(email_id, token, state, last_error)
         WHERE o.email_id = w.email_id AND o.lease_token = w.token AND (o.state || '') = 'attempting'",
            row,
        ),
    ];
    if let (Some((scope_key, claim_token)), Some(answer)) = (&lease.claim, answer) {
        guards.push(Guard::unique(
            "UPDATE idempotency_records SET state = 'completed', status = 200, response = $3, completed_at = now()
             WHERE scope_key = $1 AND claim_token = $2 AND state IN ('processing', 'unresolved')",
            vec![Box::new(scope_key.clone()), Box::new(*claim_token), Box::new(answer)],
            AppendError::Failed("could not record the send's answer".to_owned()),
        ));
    }
    let mut events = vec![NewEvent { event, subject_id: Some(parties.contact_id.clone()), occurred_at: now }];
    let mut streams = Vec::new();
    if let Some(bounce) = bounce {
        let at_ms = now.timestamp_millis();
        events.push(NewEvent {
            event: LogEvent::EmailBounced(proto::EmailBounced {
                email_id: parties.email_id.clone(),
                space_id: parties.space_id.clone(),
                contact_id: parties.contact_id.clone(),
                kind: "hard".to_owned(),
                diagnostic: "the relay refused the mailbox".to_owned(),
                at_ms,
                status: bounce.status.clone(),
                source: "relay".to_owned(),
            }),
            subject_id: Some(parties.contact_id.clone()),
            occurred_at: now,
        });
        if let Some(suppression) = suppression {
            let (stream, guard) = provider_suppression(&parties.space_id, "bounce", suppression, now);
            streams.push(stream);
            guards.push(guard);
        }
    }
    streams.insert(
        0,
        StreamAppend { stream_id: domain::email::stream_id(&parties.email_id), expected: ExpectedVersion::Any, events },
    );
    (streams, guards)
}

/// A provider suppression (`reason` `bounce` or `complaint`) in the space, and
/// the claim of its key (refused with `suppression_already_exists` when the address has a
/// suppression of that reason).
pub(super) fn provider_suppression(
    space_id: &str,
    reason: &str,
    NewSuppression { suppression_id, identifier, subject_id }: NewSuppression,
    now: DateTime<Utc>,
) -> (StreamAppend, Guard) {
    let added = proto::SuppressionAdded {
        suppression_id: suppression_id.clone(),
        space_id: space_id.to_owned(),
        reason: reason.to_owned(),
        created_at_ms: now.timestamp_millis(),
        personal: Some(platform::events::seal(
            &suppression_id,
            &proto::SuppressionPersonal { identifier: identifier.clone() },
        )),
        source: "provider".to_owned(),
    };
    let guard = Guard::unique(
        "INSERT INTO suppression_keys (scope, identifier, reason, suppression_id) VALUES ($1, $2, $3, $4)",
        vec![
            Box::new(space_id.to_owned()),
            Box::new(identifier),
            Box::new(reason.to_owned()),
            Box::new(suppression_id.clone()),
        ],
        AppendError::Conflict { code: Code::SuppressionAlreadyExists, message: "already suppressed".to_owned() },
    );
    let stream = StreamAppend {
        stream_id: format!("suppression/{suppression_id}"),
        expected: ExpectedVersion::NoStream,
        events: vec![NewEvent {
            event: LogEvent::SuppressionAdded(added),
            subject_id: Some(subject_id),
            occurred_at: now,
        }],
    };
    (stream, guard)
}
/// A relay's reply often quotes the recipient's address; what is recorded in the clear (the
/// log's outcome events, the outbox row, webhook payloads) must not hold it, so it is
/// replaced by `<recipient>`.
pub(crate) fn redact(outcome: Outcome, address: &str) -> Outcome {
    let scrub = |text: String| {
        if address.is_empty() {
            return text;
        }
        let (lower, needle) = (text.to_lowercase(), address.to_lowercase());
        let mut out = String::with_capacity(text.len());
        let mut rest = 0;
        for (start, _) in lower.match_indices(&needle) {
            if let (Some(before), Some(_)) = (text.get(rest..start), text.get(start..start + needle.len())) {
                out.push_str(before);
                out.push_str("<recipient>");
                rest = start + needle.len();
            }
        }
        out.push_str(text.get(rest..).unwrap_or_default());
        out
    };
    match outcome {
        Outcome::Accepted { reply } => Outcome::Accepted { reply: scrub(reply) },
        Outcome::Rejected { permanent, code, reply } => Outcome::Rejected { permanent, code, reply: scrub(reply) },
        Outcome::Unreachable { message } => Outcome::Unreachable { message: scrub(message) },
        Outcome::Unknown { message } => Outcome::Unknown { message: scrub(message) },
    }
}

/// The latest definition of an authored resource, from its authoring stream.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_for_now_is_queued_again_on_the_schedule_then_fails_and_a_hard_bounce_is_recorded_with_it() {
        let schedule: &[u64] = &[1_000, 60_000];
        let retried = settle(&parties(), rejected(false, 451), "a@b.io", (1, Some(schedule)), 7);
        assert_eq!(retried, Settle::Retry { delay: Duration::from_millis(60_000), error: "451 no".into() });
        let Settle::Record { event, bounce: None } =
            settle(&parties(), rejected(false, 451), "a@b.io", (2, Some(schedule)), 7)
        else {
            panic!("failed once the schedule is over")
        };
        let LogEvent::EmailFailed(failed) = *event else { panic!("failed: {event:?}") };
        assert_eq!(failed.failed_at_ms, 7);
        let inline = settle(&parties(), rejected(false, 451), "a@b.io", (0, None), 7);
        assert!(matches!(inline, Settle::Record { .. }), "the inline hand-off does not retry");
        let bounced = Outcome::Rejected { permanent: true, code: Some(550), reply: "550 5.1.1 a@b.io unknown".into() };
        let Settle::Record { event, bounce: Some(bounce) } =
            settle(&parties(), bounced, "a@b.io", (0, Some(schedule)), 7)
        else {
            panic!("a hard bounce")
        };
        let LogEvent::EmailFailed(failed) = *event else { panic!("failed: {event:?}") };
        assert_eq!((bounce.address.as_str(), bounce.status.as_str()), ("a@b.io", "5.1.1"));
        assert_eq!(failed.message, "550 5.1.1 <recipient> unknown", "the reply is redacted");
    }

    #[test]
    fn a_hard_bounce_is_recorded_with_its_suppression_under_the_given_id() {
        let lease = Lease { email_id: "em_1".into(), token: uuid::Uuid::nil(), claim: None, attempts: 0 };
        let bounce = Bounce { address: "a@b.io".into(), status: "5.1.1".into() };
        let suppression = NewSuppression {
            suppression_id: "sup_1".into(),
            identifier: "a@b.io".into(),
            subject_id: "email:ab".into(),
        };
        let event = erased(&parties(), 7);
        let (streams, guards) = outcome_append(&parties(), &lease, event, Some(&bounce), Some(suppression), Utc::now());
        let ids: Vec<&str> = streams.iter().map(|stream| stream.stream_id.as_str()).collect();
        assert_eq!(ids, [domain::email::stream_id("em_1").as_str(), "suppression/sup_1"]);
        assert_eq!(streams[0].events.len(), 2, "the outcome and the bounce");
        assert_eq!(streams[1].events[0].subject_id.as_deref(), Some("email:ab"));
        assert_eq!(guards.len(), 2, "the row's state and the suppression's key");
    }

    #[test]
    fn relay_replies_lose_the_recipients_address() {
        let reply = "550 5.1.1 <Ada@Example.com>: unknown; ada@example.com".to_owned();
        let rejected = Outcome::Rejected { permanent: true, code: Some(550), reply };
        assert_eq!(
            redact(rejected, "ada@example.com"),
            Outcome::Rejected {
                permanent: true,
                code: Some(550),
                reply: "550 5.1.1 <<recipient>>: unknown; <recipient>".into()
            }
        );
        let accepted = Outcome::Accepted { reply: "250 queued".into() };
        assert_eq!(redact(accepted.clone(), "ada@example.com"), accepted);
    }

    fn parties() -> Parties {
        Parties {
            email_id: "em_1".into(),
            space_id: "spc_1".into(),
            contact_id: "con_1".into(),
            message_id: "<em_1@example.test>".into(),
        }
    }

    fn rejected(permanent: bool, code: u16) -> Outcome {
        Outcome::Rejected { permanent, code: Some(code), reply: format!("{code} no") }
    }

    #[test]
    fn given_an_accepted_message_when_recorded_then_it_is_sent_with_the_relays_reply() {
        let event = outcome_event(&parties(), &Outcome::Accepted { reply: "250 queued".into() }, true, 7);
        let Some(LogEvent::EmailSent(sent)) = event else { panic!("sent: {event:?}") };
        assert_eq!(
            (sent.relay_reply.as_str(), sent.sent_at_ms, sent.message_id.as_str()),
            ("250 queued", 7, "<em_1@example.test>")
        );
        assert_eq!(settled(&LogEvent::EmailSent(sent)).0, "sent");
    }

    #[test]
    fn given_a_refusal_for_now_or_no_relay_when_retries_remain_then_nothing_is_recorded_yet() {
        let unreachable = Outcome::Unreachable { message: "connection refused".into() };
        assert!(outcome_event(&parties(), &rejected(false, 451), true, 7).is_none());
        assert!(outcome_event(&parties(), &unreachable, true, 7).is_none());
        let Some(LogEvent::EmailFailed(failed)) = outcome_event(&parties(), &rejected(false, 451), false, 7) else {
            panic!("failed once retries are over")
        };
        assert_eq!((failed.code.as_str(), failed.permanent), ("relay_rejected", false));
        let Some(LogEvent::EmailFailed(failed)) = outcome_event(&parties(), &unreachable, false, 7) else {
            panic!("failed once retries are over")
        };
        assert_eq!((failed.code.as_str(), failed.message.as_str()), ("relay_unavailable", "connection refused"));
        assert_eq!(settled(&LogEvent::EmailFailed(failed)).0, "failed");
    }

    #[test]
    fn given_a_permanent_refusal_when_recorded_then_it_fails_at_once_and_only_a_mailbox_refusal_is_a_hard_bounce() {
        let Some(LogEvent::EmailFailed(failed)) = outcome_event(&parties(), &rejected(true, 554), true, 7) else {
            panic!("a permanent refusal is never retried")
        };
        assert!(failed.permanent);
        for code in [550, 551, 553] {
            assert!(hard_bounce(&rejected(true, code)), "{code}");
        }
        assert!(!hard_bounce(&rejected(true, 554)), "a policy refusal says nothing of the mailbox");
        assert!(!hard_bounce(&rejected(false, 550)), "not while the relay may still take it");
    }

    #[test]
    fn given_an_exchange_broken_after_the_content_when_recorded_then_the_outcome_is_unknown() {
        let event = outcome_event(&parties(), &Outcome::Unknown { message: "reset".into() }, true, 7);
        let Some(LogEvent::EmailOutcomeUnknown(unknown)) = event else { panic!("unknown: {event:?}") };
        assert_eq!((unknown.reason.as_str(), unknown.at_ms), ("reset", 7));
        assert_eq!(settled(&LogEvent::EmailOutcomeUnknown(unknown)), ("unknown", None));
    }
}
