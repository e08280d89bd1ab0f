//! The held sends' decision: each due held email decided again with the facts of its moment
//! (the send decision, `mail::send::decide`), and the append that records the batch's
//! outcomes. Pure: the shell (`super`) leases the emails, loads their templates and their
//! recipients' facts, loads the stories of the skipped ones, appends, and queues the released
//! ones for their hand-off.

use std::collections::{BTreeMap, HashMap};

use mail::send::{Authored, Gate, Sent, Verdict, ZoneUsed};
use platform::error::Code;
use platform::events::LogEvent;
use platform::ids::{ContactId, EmailId, SpaceId};
use platform::log::{AppendError, ExpectedVersion, Guard, NewEvent, StreamAppend};
use platform::proto;
use uuid::Uuid;

use crate::workers::email::recipients::Recipients;

/// Held emails decided together (one load of their facts, one append); a step decides its
/// chunks concurrently, each contact's emails in one chunk.
const CHUNK: usize = 500;

/// A due held email, as its lease and its `EmailScheduled` tell it.
pub(super) struct Due {
    pub(super) email_id: EmailId,
    pub(super) space_id: SpaceId,
    pub(super) contact_id: ContactId,
    pub(super) template_id: String,
    pub(super) topic_id: Option<String>,
    /// Kind, source, parent, step and experiment variant, as its `EmailScheduled` names them.
    pub(super) origin: (String, String, String, String, String, bool),
}

/// What the decision came to for one email.
pub(super) enum Decided {
    /// Released as the contact's marketing send at place `seq` (0: none, no caps).
    Release {
        seq: i64,
    },
    Hold {
        until_ms: i64,
        gate: Gate,
    },
    Skip {
        gate: Gate,
        filled_by: Option<i64>,
    },
}

/// One email's outcome: the email, what was decided, and the zone the policy used.
pub(super) type Outcome<'e> = (&'e Due, Decided, Option<ZoneUsed>);

/// Decides each of `emails` again at `now`, in order: a released one counts against the caps
/// of the contact's next email of the batch, which takes the place after it. An email whose
/// template is gone (`None` in `templates`: its policy can no longer be read) goes as it was
/// held for: it was rendered and stored.
pub(super) fn decide<'e>(
    emails: &'e [Due],
    templates: &HashMap<&str, Option<Authored>>,
    recipients: &mut Recipients,
    now: i64,
) -> Vec<Outcome<'e>> {
    let mut decided = Vec::with_capacity(emails.len());
    for email in emails {
        let Some(Some(authored)) = templates.get(email.template_id.as_str()) else {
            decided.push((email, Decided::Release { seq: 0 }, None));
            continue;
        };
        let facts = recipients.facts(authored, &email.contact_id, now);
        let zone = mail::send::zone_used(&facts);
        let seq = mail::send::follows(&facts).map_or(0, |last| last + 1);
        let outcome = match mail::send::decide(&facts) {
            Verdict::Send => {
                let sent = Sent { at_ms: now, topic_id: email.topic_id.clone(), position: 0, seq };
                recipients.sent.entry(email.contact_id.to_string()).or_default().push(sent);
                Decided::Release { seq }
            }
            Verdict::Hold { until_ms, gate } => Decided::Hold { until_ms, gate },
            Verdict::Skip { gate, decided_by } => Decided::Skip { gate, filled_by: decided_by },
        };
        decided.push((email, outcome, zone));
    }
    decided
}

/// The append of a batch's outcomes.
pub(super) struct Appends {
    /// `EmailReleased` and `EmailHeld` on each email's stream, after `stories` (the
    /// `EmailSkipped` of the skipped ones, which the shell loaded what they name for).
    pub(super) streams: Vec<StreamAppend>,
    /// The rows' moves, each under the batch's lease ([`outcome_guards`]).
    pub(super) guards: Vec<Guard>,
    /// The released emails, for their hand-off once the append is in.
    pub(super) released: Vec<String>,
}

/// What the batch's `decided` outcomes append in `space_id` under the lease `token` at `now`;
/// a released email is left to the outbox worker from `grace_ms` after `now` (until then it is
/// this process's hand-offs').
pub(super) fn appends(
    space_id: &str,
    decided: &[Outcome<'_>],
    stories: Vec<StreamAppend>,
    (token, grace_ms): (Uuid, i64),
    now: i64,
) -> Appends {
    let mut streams = stories;
    let (mut released, mut held, mut untils, mut skipped, mut reasons) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut sent_contacts, mut sent_topics, mut sent_seqs) = (Vec::new(), Vec::new(), Vec::new());
    for (email, outcome, zone) in decided {
        let zone = zone.as_ref().map(ZoneUsed::to_proto);
        let event = match outcome {
            Decided::Release { seq } => {
                released.push(email.email_id.to_string());
                sent_contacts.push(email.contact_id.to_string());
                sent_topics.push(email.topic_id.clone().unwrap_or_default());
                sent_seqs.push(*seq);
                LogEvent::EmailReleased(proto::EmailReleased {
                    email_id: email.email_id.to_string(),
                    space_id: space_id.to_owned(),
                    contact_id: email.contact_id.to_string(),
                    at_ms: now,
                    zone,
                })
            }
            Decided::Hold { until_ms, gate } => {
                held.push(email.email_id.to_string());
                untils.push(*until_ms);
                LogEvent::EmailHeld(proto::EmailHeld {
                    email_id: email.email_id.to_string(),
                    space_id: space_id.to_owned(),
                    contact_id: email.contact_id.to_string(),
                    gate: gate.as_str().to_owned(),
                    not_before_ms: *until_ms,
                    at_ms: now,
                    zone,
                })
            }
            Decided::Skip { gate, .. } => {
                skipped.push(email.email_id.to_string());
                reasons.push(crate::workers::broadcasts::reason(*gate).to_owned());
                continue;
            }
        };
        streams.push(StreamAppend {
            stream_id: domain::email::stream_id(&email.email_id),
            expected: ExpectedVersion::Any,
            events: vec![NewEvent {
                event,
                subject_id: Some(email.contact_id.to_string()),
                occurred_at: platform::time::from_millis(now),
            }],
        });
    }
    let guards = outcome_guards(
        token,
        (now, now + grace_ms),
        (&released, &sent_contacts, &sent_topics, &sent_seqs),
        (&held, &untils),
        (&skipped, &reasons),
    );
    Appends { streams, guards, released }
}

/// The step's emails in chunks of one space and at most [`CHUNK`] emails (more only for one
/// contact's), each contact's emails in one chunk and in their order, so the releases of a
/// contact are decided one after another.
pub(super) fn chunks(due: Vec<Due>) -> Vec<(String, Vec<Due>)> {
    let mut by_contact: BTreeMap<(String, String), Vec<Due>> = BTreeMap::new();
    for email in due {
        by_contact.entry((email.space_id.to_string(), email.contact_id.to_string())).or_default().push(email);
    }
    let mut chunks: Vec<(String, Vec<Due>)> = Vec::new();
    for ((space_id, _), emails) in by_contact {
        match chunks.last_mut() {
            Some((space, chunk)) if *space == space_id && chunk.len() < CHUNK => chunk.extend(emails),
            _ => chunks.push((space_id, emails)),
        }
    }
    chunks
}

/// The guards of a batch's outcomes, each under the batch's lease `token`: released rows back
/// to `pending` (due to the outbox worker at `handed_ms`) and counted against the caps at
/// `now`, held ones moved on, skipped ones `skipped`; a broadcast recipient follows its email.
fn outcome_guards(
    token: Uuid,
    (now, handed_ms): (i64, i64),
    (released, contacts, topics, seqs): (&[String], &[String], &[String], &[i64]),
    (held, untils): (&[String], &[i64]),
    (skipped, reasons): (&[String], &[String]),
) -> Vec<Guard> {
    let lost = || AppendError::Conflict {
        code: Code::OperationTaken,
        message: "the lease on a held email ran out".to_owned(),
    };
    let count = |ids: &[String]| Some(u64::try_from(ids.len()).unwrap_or(u64::MAX));
    let mut guards = Vec::new();
    // By id, the state tested through an expression: see `mail::outbox` on plans and indexes.
    if !released.is_empty() {
        guards.push(Guard {
            sql: "UPDATE email_outbox SET state = 'pending', next_attempt_at = to_timestamp($3::bigint / 1000.0),
                      leased_until = NULL, lease_token = NULL
                  WHERE email_id = ANY($1) AND lease_token = $2 AND (state || '') = 'held'",
            params: vec![Box::new(released.to_vec()), Box::new(token), Box::new(handed_ms)],
            conflict: lost(),
            expect_rows: count(released),
            set: None,
        });
        // Each at the place its decision gave it: a send another worker recorded for the contact
        // since this batch read its sends takes the place first, and the batch decides again.
        guards.push(Guard {
            sql: "INSERT INTO marketing_sends (contact_id, at_ms, email_id, topic_id, seq)
                  SELECT c, $2, e, t, NULLIF(s, 0) FROM unnest($1::text[], $3::text[], $4::text[], $5::bigint[])
                      AS w(c, e, t, s)
                  ON CONFLICT DO NOTHING",
            params: vec![
                Box::new(contacts.to_vec()),
                Box::new(now),
                Box::new(released.to_vec()),
                Box::new(topics.to_vec()),
                Box::new(seqs.to_vec()),
            ],
            conflict: AppendError::Conflict {
                code: Code::StreamMoved,
                message: "a contact was sent marketing email while its held emails were decided".to_owned(),
            },
            expect_rows: count(released),
            set: None,
        });
        guards.push(Guard::unique(
            "UPDATE broadcast_recipients SET state = 'scheduled' WHERE email_id = ANY($1) AND state = 'held'",
            vec![Box::new(released.to_vec())],
            lost(),
        ));
    }
    if !held.is_empty() {
        guards.push(Guard {
            sql: "UPDATE email_outbox o SET next_attempt_at = to_timestamp(w.until_ms / 1000.0), leased_until = NULL,
                      lease_token = NULL
                  FROM unnest($1::text[], $3::bigint[]) AS w(email_id, until_ms)
                  WHERE o.email_id = w.email_id AND o.lease_token = $2 AND (o.state || '') = 'held'",
            params: vec![Box::new(held.to_vec()), Box::new(token), Box::new(untils.to_vec())],
            conflict: lost(),
            expect_rows: count(held),
            set: None,
        });
    }
    if !skipped.is_empty() {
        guards.push(Guard {
            sql: "UPDATE email_outbox SET state = 'skipped', leased_until = NULL, lease_token = NULL
                  WHERE email_id = ANY($1) AND lease_token = $2 AND (state || '') = 'held'",
            params: vec![Box::new(skipped.to_vec()), Box::new(token)],
            conflict: lost(),
            expect_rows: count(skipped),
            set: None,
        });
        guards.push(Guard::unique(
            "UPDATE broadcast_recipients r SET state = 'skipped', reason = w.reason, counted = false
             FROM unnest($1::text[], $2::text[]) AS w(email_id, reason)
             WHERE r.email_id = w.email_id AND r.state = 'held'",
            vec![Box::new(skipped.to_vec()), Box::new(reasons.to_vec())],
            lost(),
        ));
    }
    guards
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::workers::email::recipients::fixtures::{TOPIC, authored, given};

    /// 2026-01-01 10:00 UTC.
    const NOW: i64 = 1_767_261_600_000;

    fn due(space: &str, contact: &str, email: &str) -> Due {
        Due {
            email_id: email.to_owned().into(),
            space_id: space.to_owned().into(),
            contact_id: contact.to_owned().into(),
            template_id: "tpl_1".to_owned(),
            topic_id: None,
            origin: Default::default(),
        }
    }

    #[test]
    fn a_steps_chunks_keep_one_space_each_contacts_emails_together_and_in_order_and_stay_bounded() {
        let mut emails = vec![due("spc_b", "con_1", "em_b1")];
        for index in 0..CHUNK {
            emails.push(due("spc_a", &format!("con_{index:04}"), &format!("em_{index:04}")));
        }
        emails.push(due("spc_a", "con_0000", "em_again"));
        let chunks = chunks(emails);
        let sizes: Vec<(&str, usize)> = chunks.iter().map(|(space, emails)| (space.as_str(), emails.len())).collect();
        assert_eq!(sizes, [("spc_a", CHUNK), ("spc_a", 1), ("spc_b", 1)], "bounded, and one space each");
        let first: Vec<&str> = chunks[0].1.iter().take(2).map(|email| email.email_id.as_str()).collect();
        assert_eq!(first, ["em_0000", "em_again"], "in their order");
        let many: Vec<Due> = (0..CHUNK * 2 + 1).map(|i| due("spc_a", &format!("c{i:05}"), &format!("e{i}"))).collect();
        let sizes: Vec<usize> = super::chunks(many).iter().map(|(_, emails)| emails.len()).collect();
        assert_eq!(sizes, [CHUNK, CHUNK, 1]);
    }

    /// A held email `email` of `con_1` of topic [`TOPIC`].
    fn held(email: &str) -> Due {
        Due { topic_id: Some(TOPIC.to_owned()), ..due("spc_1", "con_1", email) }
    }

    /// Given `con_1` consenting and subscribed, at `ada@example.test`.
    fn consenting() -> Recipients {
        given(json!({"email": "ada@example.test", "emailOk": true}), Some("subscribed"))
    }

    /// The marketing template of the emails, under `policy` (none: no send policy).
    fn templates(policy: Option<Value>) -> HashMap<&'static str, Option<Authored>> {
        let mut template = authored(Some(TOPIC));
        template.policy = policy.map(|policy| serde_json::from_value(policy).expect("a send policy"));
        HashMap::from([("tpl_1", Some(template))])
    }

    fn gates(decided: &[Outcome<'_>]) -> Vec<String> {
        decided
            .iter()
            .map(|(email, outcome, _)| match outcome {
                Decided::Release { seq } => format!("{} released at {seq}", email.email_id),
                Decided::Hold { until_ms, gate } => {
                    format!("{} held by {} until {until_ms}", email.email_id, gate.as_str())
                }
                Decided::Skip { gate, .. } => format!("{} skipped by {}", email.email_id, gate.as_str()),
            })
            .collect()
    }

    fn types(appends: &Appends) -> Vec<String> {
        appends
            .streams
            .iter()
            .flat_map(|stream| stream.events.iter().map(|new| new.event.event_type().to_owned()))
            .collect()
    }

    #[test]
    fn given_a_consenting_contact_and_no_policy_when_decided_then_the_email_is_released_and_the_row_goes_back_to_pending()
     {
        let emails = [held("em_1")];
        let mut recipients = consenting();
        let decided = decide(&emails, &templates(None), &mut recipients, NOW);
        assert_eq!(gates(&decided), ["em_1 released at 0"]);
        let appends = appends("spc_1", &decided, Vec::new(), (Uuid::nil(), 10_000), NOW);
        assert_eq!(types(&appends), ["EmailReleased.v1"]);
        assert_eq!(appends.released, ["em_1"]);
        assert!(appends.guards[0].sql.contains("SET state = 'pending'"), "{}", appends.guards[0].sql);
        assert!(appends.guards.iter().any(|guard| guard.sql.contains("INSERT INTO marketing_sends")));
    }

    #[test]
    fn given_quiet_hours_now_when_decided_then_the_email_is_held_again_until_they_end() {
        let policy = json!({"timeZone": {"default": "UTC"},
            "quietHours": {"fromMinute": 540, "toMinute": 720, "outcome": "hold"}});
        let emails = [held("em_1")];
        let decided = decide(&emails, &templates(Some(policy)), &mut consenting(), NOW);
        let noon = NOW + 2 * 3_600_000;
        assert_eq!(gates(&decided), [format!("em_1 held by quiet_hours until {noon}")]);
        let appends = appends("spc_1", &decided, Vec::new(), (Uuid::nil(), 10_000), NOW);
        assert_eq!(types(&appends), ["EmailHeld.v1"]);
        assert!(appends.released.is_empty());
        assert!(appends.guards[0].sql.contains("SET next_attempt_at"), "the row's time moves on");
    }

    #[test]
    fn given_a_suppressed_address_when_decided_then_the_email_is_skipped_and_only_its_story_is_appended() {
        let mut recipients = consenting();
        recipients.suppressed.insert("ada@example.test".to_owned());
        let emails = [held("em_1")];
        let decided = decide(&emails, &templates(None), &mut recipients, NOW);
        assert_eq!(gates(&decided), ["em_1 skipped by suppressed"]);
        let appends = appends("spc_1", &decided, Vec::new(), (Uuid::nil(), 10_000), NOW);
        assert!(types(&appends).is_empty(), "the shell loads and appends the EmailSkipped story");
        assert!(appends.guards[0].sql.contains("SET state = 'skipped'"));
    }

    #[test]
    fn given_a_cap_of_one_a_day_and_two_held_emails_of_one_contact_when_decided_then_the_first_takes_the_place_and_the_second_is_capped()
     {
        let policy = json!({"timeZone": {"default": "UTC"},
            "frequencyCaps": [{"max": 1, "window": {"days": 1}, "outcome": "skip"}]});
        let emails = [held("em_1"), held("em_2")];
        let decided = decide(&emails, &templates(Some(policy)), &mut consenting(), NOW);
        assert_eq!(gates(&decided), ["em_1 released at 1", "em_2 skipped by frequency_cap"]);
    }

    #[test]
    fn given_a_template_deleted_since_the_hold_when_decided_then_the_email_goes_as_it_was_held_for() {
        let emails = [held("em_1")];
        let decided = decide(&emails, &HashMap::from([("tpl_1", None)]), &mut consenting(), NOW);
        assert_eq!(gates(&decided), ["em_1 released at 0"]);
    }
}
