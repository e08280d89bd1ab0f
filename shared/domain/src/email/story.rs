//! An email's story, folded from its stream (pure): what sent it, to whom, what became of
//! it (scheduled, sent or failed with the relay's answer, bounced, complained, unsubscribed)
//! and what the recipient did (opens and clicks, people's and machines' apart). The `emails`
//! read model keeps it; `GET /emails/{id}` answers it.

use kernel::events::LogEvent;
use kernel::time::format_millis;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Opens and clicks of one email.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Engagement {
    pub opens: i64,
    pub human_opens: i64,
    pub clicks: i64,
    pub human_clicks: i64,
    /// A person's first open and first click.
    pub first_opened_at: Option<String>,
    pub first_clicked_at: Option<String>,
}

/// The story of one email, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Story {
    pub id: String,
    pub template_id: String,
    pub template_revision: i64,
    /// The locale of the variant it was rendered in, `{tag, source}` (`source`: `exact`,
    /// `language`, `default` or `invalid`); null when its template names no locale, and for a
    /// send refused before it was rendered.
    #[serde(default)]
    pub locale: Option<Value>,
    /// The layout and partials it was rendered with: `{kind, id, slug, revision}` each.
    #[serde(default)]
    pub parts: Vec<Value>,
    /// `transactional` or `marketing`.
    pub kind: String,
    pub topic_id: Option<String>,
    pub contact_id: String,
    /// What sent it: `{type}` with the form, broadcast and run, or workflow, run and step.
    pub origin: Value,
    /// `scheduled`, `sent`, `failed`, `outcome_unknown`, `bounced` or `complained`; `skipped`
    /// for a send a gate refused (then `scheduled_at` is when it was refused, unless it was
    /// held first); `held` for a send the send policy holds until `not_before`.
    pub status: String,
    pub scheduled_at: String,
    /// When a held send is decided again; `None` unless `held`.
    #[serde(default)]
    pub not_before: Option<String>,
    pub sent_at: Option<String>,
    pub unsubscribed: bool,
    pub engagement: Engagement,
    /// What happened, in log order: each status change, the unsubscription, and the first
    /// open and first click of each link by a person and by a machine.
    pub timeline: Vec<Value>,
}

/// A layout or partial an email was rendered with, as its story (and a preview) shows it.
pub fn part_document(part: &kernel::proto::PartRevision) -> Value {
    json!({"kind": part.kind, "id": part.id, "slug": part.slug, "revision": part.revision})
}

fn some(text: &str) -> Option<&str> {
    Some(text).filter(|text| !text.is_empty())
}

/// A timeline entry of `kind` at `at_ms`, with the zone the send policy decided in when it
/// read one (`source` `invalid` flags a contact value that is not a time zone).
fn decision_entry(kind: &str, at_ms: i64, zone: Option<&kernel::proto::PolicyZone>) -> Value {
    let mut entry = json!({"type": kind, "at": format_millis(at_ms)});
    if let Some(zone) = zone {
        entry["zone"] = json!({"name": zone.name, "source": zone.source});
    }
    entry
}

fn origin(scheduled: &kernel::proto::EmailScheduled) -> Value {
    let variant = (scheduled.variant.as_str(), scheduled.experiment_winner);
    origin_of(&scheduled.origin, &scheduled.form_id, &scheduled.parent_id, &scheduled.step_id, variant)
}

fn origin_of(kind: &str, source: &str, parent: &str, step: &str, (variant, winner): (&str, bool)) -> Value {
    let (source, parent, step) = (some(source), some(parent), some(step));
    match kind {
        "form_confirmation" => json!({"type": kind, "formId": source}),
        // A run with an experiment names the variant each email was sent, and whether in the
        // test or as the winner to the rest (`cohort`).
        "broadcast" if !variant.is_empty() => {
            let cohort = if winner { "winner" } else { "test" };
            json!({"type": kind, "broadcastId": parent, "broadcastRunId": source, "variant": variant, "cohort": cohort})
        }
        "broadcast" => json!({"type": kind, "broadcastId": parent, "broadcastRunId": source}),
        "workflow" => json!({"type": kind, "workflowId": parent, "workflowRunId": source, "stepId": step}),
        _ => json!({"type": if kind.is_empty() { "template" } else { kind }}),
    }
}

/// The story after `event`; `None` before the email's `EmailScheduled` (an email's stream
/// begins with it) or for an event that is not an email's.
pub fn apply(story: Option<Story>, event: &LogEvent) -> Option<Story> {
    if let LogEvent::EmailScheduled(scheduled) = event {
        let at = format_millis(scheduled.scheduled_at_ms);
        return Some(Story {
            id: scheduled.email_id.clone(),
            template_id: scheduled.template_id.clone(),
            template_revision: scheduled.template_revision,
            locale: some(&scheduled.locale)
                .map(|tag| json!({"tag": tag, "source": some(&scheduled.locale_source).unwrap_or("default")})),
            parts: scheduled.parts.iter().map(part_document).collect(),
            kind: scheduled.kind.clone(),
            topic_id: some(&scheduled.topic_id).map(str::to_owned),
            contact_id: scheduled.contact_id.clone(),
            origin: origin(scheduled),
            status: "scheduled".to_owned(),
            scheduled_at: at.clone(),
            not_before: None,
            sent_at: None,
            unsubscribed: false,
            engagement: Engagement::default(),
            timeline: vec![decision_entry("scheduled", scheduled.scheduled_at_ms, scheduled.zone.as_ref())],
        });
    }
    let mut story = match (story, event) {
        // A send refused at once begins its stream; a held one refused at its time ends it.
        (Some(mut held), LogEvent::EmailSkipped(skipped)) if held.status == "held" => {
            held.status = "skipped".to_owned();
            held.not_before = None;
            held.timeline.push(skipped_entry(skipped));
            return Some(held);
        }
        (Some(story), LogEvent::EmailSkipped(_)) => return Some(story),
        (None, LogEvent::EmailSkipped(skipped)) => return Some(skipped_story(skipped)),
        (story, _) => story?,
    };
    if story.status == "skipped" {
        // Nothing follows a refused send; a later event of its stream changes nothing.
        return Some(story);
    }
    match event {
        LogEvent::EmailHeld(held) if matches!(story.status.as_str(), "scheduled" | "held") => {
            let not_before = format_millis(held.not_before_ms);
            story.status = "held".to_owned();
            story.not_before = Some(not_before.clone());
            let mut entry = decision_entry("held", held.at_ms, held.zone.as_ref());
            entry["gate"] = json!(held.gate);
            entry["notBefore"] = json!(not_before);
            story.timeline.push(entry);
            return Some(story);
        }
        LogEvent::EmailReleased(released) if story.status == "held" => {
            story.status = "scheduled".to_owned();
            story.not_before = None;
            story.timeline.push(decision_entry("released", released.at_ms, released.zone.as_ref()));
            return Some(story);
        }
        _ => {}
    }
    let (status, entry) = match event {
        LogEvent::EmailSent(sent) => {
            story.sent_at = Some(format_millis(sent.sent_at_ms));
            (
                Some("sent"),
                Some(json!({"type": "sent", "at": format_millis(sent.sent_at_ms), "relayReply": sent.relay_reply})),
            )
        }
        LogEvent::EmailFailed(failed) => (
            Some("failed"),
            Some(json!({"type": "failed", "at": format_millis(failed.failed_at_ms),
                        "error": {"code": failed.code, "message": failed.message}})),
        ),
        LogEvent::EmailOutcomeUnknown(unknown) => (
            Some("outcome_unknown"),
            Some(json!({"type": "outcome_unknown", "at": format_millis(unknown.at_ms), "reason": unknown.reason})),
        ),
        LogEvent::EmailBounced(bounced) => (
            Some("bounced"),
            Some(json!({"type": "bounced", "at": format_millis(bounced.at_ms), "bounceKind": bounced.kind,
                        "status": some(&bounced.status), "diagnostic": bounced.diagnostic,
                        "source": some(&bounced.source).unwrap_or("relay")})),
        ),
        LogEvent::EmailComplained(complained) => (
            Some("complained"),
            Some(json!({"type": "complained", "at": format_millis(complained.at_ms),
                        "feedbackType": complained.feedback_type})),
        ),
        LogEvent::EmailUnsubscribed(unsubscribed) => {
            story.unsubscribed = true;
            (
                None,
                Some(json!({"type": "unsubscribed", "at": format_millis(unsubscribed.at_ms),
                            "topicId": some(&unsubscribed.topic_id)})),
            )
        }
        LogEvent::EmailOpened(opened) => {
            let at = format_millis(opened.at_ms);
            let engagement = &mut story.engagement;
            engagement.opens += 1;
            if opened.machine.is_empty() {
                engagement.human_opens += 1;
                engagement.first_opened_at.get_or_insert_with(|| at.clone());
            }
            let entry = json!({"type": "opened", "at": at, "machine": some(&opened.machine)});
            (None, opened.first.then_some(entry))
        }
        LogEvent::EmailClicked(clicked) => {
            let at = format_millis(clicked.at_ms);
            let engagement = &mut story.engagement;
            engagement.clicks += 1;
            if clicked.machine.is_empty() {
                engagement.human_clicks += 1;
                engagement.first_clicked_at.get_or_insert_with(|| at.clone());
            }
            // `link`: the link's position among the email's tracked links (null for a link sent
            // before positions were numbered).
            let link = (clicked.link_position > 0).then_some(clicked.link_position);
            let entry = json!({"type": "clicked", "at": at, "linkId": clicked.link_id, "link": link,
                               "machine": some(&clicked.machine)});
            (None, clicked.first.then_some(entry))
        }
        _ => (None, None),
    };
    // A bounce or a complaint after the message was sent is what became of it; a later
    // report does not turn a bounce back into `sent`.
    if let Some(status) = status {
        let settled = matches!(story.status.as_str(), "bounced" | "complained");
        if !settled || matches!(status, "bounced" | "complained") {
            story.status = status.to_owned();
        }
    }
    story.timeline.extend(entry);
    Some(story)
}

/// The story of a test send (`POST /templates/{id}/test`), from its stream: origin `test`
/// with the key that asked and the masked address, then what the relay answered. Never in the
/// emails read model; the query service folds it from the log.
pub fn test_story(events: &[LogEvent]) -> Option<Story> {
    let mut story = None;
    for event in events {
        match (event, &mut story) {
            (LogEvent::EmailTestRequested(requested), None) => {
                story = Some(Story {
                    id: requested.email_id.clone(),
                    template_id: requested.template_id.clone(),
                    template_revision: requested.template_revision,
                    locale: some(&requested.locale)
                        .map(|tag| json!({"tag": tag, "source": some(&requested.locale_source).unwrap_or("default")})),
                    parts: requested.parts.iter().map(part_document).collect(),
                    kind: requested.kind.clone(),
                    topic_id: some(&requested.topic_id).map(str::to_owned),
                    contact_id: requested.contact_id.clone(),
                    origin: json!({"type": "test", "keyId": some(&requested.key_id), "to": requested.to_masked}),
                    status: "scheduled".to_owned(),
                    scheduled_at: format_millis(requested.at_ms),
                    not_before: None,
                    sent_at: None,
                    unsubscribed: false,
                    engagement: Engagement::default(),
                    timeline: vec![json!({"type": "scheduled", "at": format_millis(requested.at_ms)})],
                });
            }
            (LogEvent::EmailTestSent(sent), Some(story)) if story.status == "scheduled" => {
                let at = format_millis(sent.at_ms);
                story.status.clone_from(&sent.status);
                let mut entry = json!({"type": sent.status, "at": at});
                if sent.status == "sent" {
                    story.sent_at = Some(at);
                } else {
                    entry["error"] = json!({"code": sent.error_code, "message": sent.error_message});
                }
                story.timeline.push(entry);
            }
            _ => {}
        }
    }
    story
}

/// The story of a send a gate refused: `skipped`, with the gate, the refusal and the fact
/// that decided (its log position, type and time; null when no event decided).
fn skipped_story(skipped: &kernel::proto::EmailSkipped) -> Story {
    let at = format_millis(skipped.at_ms);
    let source = skipped.source.clone().unwrap_or_default();
    Story {
        id: skipped.email_id.clone(),
        template_id: skipped.template_id.clone(),
        template_revision: skipped.template_revision,
        locale: None,
        parts: Vec::new(),
        kind: skipped.kind.clone(),
        topic_id: some(&skipped.topic_id).map(str::to_owned),
        contact_id: skipped.contact_id.clone(),
        origin: origin_of(
            &source.origin,
            &source.source_id,
            &source.parent_id,
            &source.step_id,
            (&source.variant, source.experiment_winner),
        ),
        status: "skipped".to_owned(),
        scheduled_at: at,
        not_before: None,
        sent_at: None,
        unsubscribed: false,
        engagement: Engagement::default(),
        timeline: vec![skipped_entry(skipped)],
    }
}

/// The timeline's entry of a refusal: the gate, the refusal and the fact that decided.
fn skipped_entry(skipped: &kernel::proto::EmailSkipped) -> Value {
    let decided_by = (skipped.decided_by_position > 0).then(|| {
        json!({
            "position": skipped.decided_by_position,
            "type": skipped.decided_by_type.strip_suffix(".v1").unwrap_or(&skipped.decided_by_type),
            "at": format_millis(skipped.decided_by_at_ms),
        })
    });
    let mut entry = decision_entry("skipped", skipped.at_ms, skipped.zone.as_ref());
    entry["gate"] = json!(skipped.gate);
    entry["error"] = json!({"code": skipped.code, "message": skipped.message});
    entry["decidedBy"] = json!(decided_by);
    entry
}

/// What one email adds to the counts of what sent it: each field 0 or 1. The `emails` read
/// model adds the difference a log event makes to an email's tally to the counts of its
/// bucket, so each email counts once per field whatever comes later.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub scheduled: i64,
    pub sent: i64,
    pub failed: i64,
    pub outcome_unknown: i64,
    pub bounced: i64,
    pub complained: i64,
    pub unsubscribed: i64,
    /// Opened by a person (a machine's open is not counted).
    pub opened: i64,
    /// A link followed by a person.
    pub clicked: i64,
    /// Held by the send policy, not decided again yet.
    pub held: i64,
}

impl Tally {
    /// The names of the fields, in the order of [`Tally::values`].
    pub const FIELDS: [&'static str; 10] = [
        "scheduled",
        "sent",
        "failed",
        "outcome_unknown",
        "bounced",
        "complained",
        "unsubscribed",
        "opened",
        "clicked",
        "held",
    ];

    /// An email's tally: `None` (no story yet) counts nothing.
    pub fn of(story: Option<&Story>) -> Self {
        // A skipped send is counted by its step's skips, not as an email.
        let Some(story) = story.filter(|story| story.status != "skipped") else { return Self::default() };
        let had = |kind: &str| i64::from(story.timeline.iter().any(|entry| entry["type"] == kind));
        Self {
            scheduled: 1,
            sent: i64::from(story.sent_at.is_some()),
            failed: i64::from(story.status == "failed"),
            outcome_unknown: i64::from(story.status == "outcome_unknown"),
            bounced: had("bounced"),
            complained: had("complained"),
            unsubscribed: i64::from(story.unsubscribed),
            opened: i64::from(story.engagement.human_opens > 0),
            clicked: i64::from(story.engagement.human_clicks > 0),
            held: i64::from(story.status == "held"),
        }
    }

    pub fn values(&self) -> [i64; 10] {
        [
            self.scheduled,
            self.sent,
            self.failed,
            self.outcome_unknown,
            self.bounced,
            self.complained,
            self.unsubscribed,
            self.opened,
            self.clicked,
            self.held,
        ]
    }

    /// `self - before`, field by field.
    pub fn minus(&self, before: &Self) -> [i64; 10] {
        let (after, before) = (self.values(), before.values());
        std::array::from_fn(|index| after[index] - before[index])
    }
}

/// Where an email's counts go: a broadcast run (`broadcast_run`, its id) or a workflow's send
/// step (`workflow_step`, `<workflowId>/<stepId>`); `None` for an email sent otherwise.
pub fn bucket(story: &Story) -> Option<(&'static str, String)> {
    let text = |key: &str| story.origin[key].as_str().unwrap_or_default();
    match text("type") {
        "broadcast" if !text("broadcastRunId").is_empty() => Some(("broadcast_run", text("broadcastRunId").to_owned())),
        "workflow" if !text("workflowId").is_empty() && !text("stepId").is_empty() => {
            Some(("workflow_step", format!("{}/{}", text("workflowId"), text("stepId"))))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use kernel::proto;

    use super::*;

    fn scheduled(origin: &str) -> LogEvent {
        LogEvent::EmailScheduled(proto::EmailScheduled {
            email_id: "em_1".into(),
            template_id: "tpl_1".into(),
            kind: "marketing".into(),
            contact_id: "con_1".into(),
            scheduled_at_ms: 1_000,
            origin: origin.into(),
            form_id: "bcr_1".into(),
            parent_id: "bc_1".into(),
            ..Default::default()
        })
    }

    fn fold(events: &[LogEvent]) -> Option<Story> {
        events.iter().fold(None, apply)
    }

    #[test]
    fn an_email_is_sent_bounced_and_its_status_stays_bounced() {
        let story = fold(&[
            scheduled("broadcast"),
            LogEvent::EmailSent(proto::EmailSent {
                sent_at_ms: 2_000,
                relay_reply: "250 ok".into(),
                ..Default::default()
            }),
            LogEvent::EmailBounced(proto::EmailBounced { kind: "hard".into(), at_ms: 3_000, ..Default::default() }),
            LogEvent::EmailComplained(proto::EmailComplained { at_ms: 4_000, ..Default::default() }),
        ])
        .expect("a story");
        assert_eq!(story.origin, json!({"type": "broadcast", "broadcastId": "bc_1", "broadcastRunId": "bcr_1"}));
        assert_eq!(story.status, "complained");
        assert_eq!(story.sent_at.as_deref(), Some("1970-01-01T00:00:02.000Z"));
        let types: Vec<&str> = story.timeline.iter().filter_map(|entry| entry["type"].as_str()).collect();
        assert_eq!(types, ["scheduled", "sent", "bounced", "complained"]);
        assert_eq!(story.timeline[1]["relayReply"], "250 ok");
        assert!(fold(&[LogEvent::EmailSent(proto::EmailSent::default())]).is_none(), "no story before scheduling");
    }

    #[test]
    fn opens_and_clicks_are_counted_and_only_firsts_enter_the_timeline() {
        let opened = |machine: &str, first: bool, at_ms: i64| {
            LogEvent::EmailOpened(proto::EmailOpened { machine: machine.into(), first, at_ms, ..Default::default() })
        };
        let clicked = |machine: &str, first: bool, at_ms: i64| {
            LogEvent::EmailClicked(proto::EmailClicked {
                link_id: "l1".into(),
                machine: machine.into(),
                first,
                at_ms,
                ..Default::default()
            })
        };
        let story = fold(&[
            scheduled("template"),
            opened("privacy_proxy", true, 2_000),
            opened("", true, 3_000),
            opened("", false, 4_000),
            clicked("right_after_delivery", true, 2_500),
            clicked("", true, 5_000),
        ])
        .expect("a story");
        assert_eq!(story.origin, json!({"type": "template"}));
        let engagement = &story.engagement;
        assert_eq!(
            (engagement.opens, engagement.human_opens, engagement.clicks, engagement.human_clicks),
            (3, 2, 2, 1)
        );
        assert_eq!(engagement.first_opened_at.as_deref(), Some("1970-01-01T00:00:03.000Z"));
        assert_eq!(engagement.first_clicked_at.as_deref(), Some("1970-01-01T00:00:05.000Z"));
        assert_eq!(story.timeline.len(), 5, "scheduled and four firsts: {:?}", story.timeline);
        assert_eq!(story.status, "scheduled", "engagement is not a status");
    }

    #[test]
    fn a_skipped_send_tells_its_gate_and_the_fact_that_decided_and_counts_nothing() {
        let skipped = |position: i64| {
            LogEvent::EmailSkipped(proto::EmailSkipped {
                email_id: "em_2".into(),
                template_id: "tpl_1".into(),
                kind: "marketing".into(),
                contact_id: "con_1".into(),
                source: Some(proto::EmailSource {
                    origin: "workflow".into(),
                    source_id: "run_1".into(),
                    parent_id: "wf_1".into(),
                    step_id: "send".into(),
                    ..Default::default()
                }),
                gate: "suppressed".into(),
                code: "recipient_suppressed".into(),
                message: "the recipient's address is suppressed".into(),
                decided_by_position: position,
                decided_by_type: "SuppressionAdded.v1".into(),
                decided_by_at_ms: 500,
                at_ms: 1_000,
                ..Default::default()
            })
        };
        let story = fold(&[skipped(42)]).expect("a story");
        assert_eq!((story.status.as_str(), story.scheduled_at.as_str()), ("skipped", "1970-01-01T00:00:01.000Z"));
        assert_eq!(story.origin["stepId"], "send");
        assert_eq!(
            story.timeline,
            [json!({"type": "skipped", "at": "1970-01-01T00:00:01.000Z", "gate": "suppressed",
                    "error": {"code": "recipient_suppressed", "message": "the recipient's address is suppressed"},
                    "decidedBy": {"position": 42, "type": "SuppressionAdded", "at": "1970-01-01T00:00:00.500Z"}})]
        );
        assert_eq!(fold(&[skipped(0)]).expect("a story").timeline[0]["decidedBy"], Value::Null, "no deciding event");
        assert_eq!(Tally::of(Some(&story)), Tally::default(), "a skip is no email of its step's counts");
        let after = apply(Some(story.clone()), &LogEvent::EmailSent(proto::EmailSent::default()));
        assert_eq!(after, Some(story), "nothing follows a refused send");
    }

    #[test]
    fn a_held_send_shows_when_it_is_decided_again_and_ends_sent_or_skipped() {
        let held = |not_before_ms: i64| {
            LogEvent::EmailHeld(proto::EmailHeld {
                email_id: "em_1".into(),
                gate: "quiet_hours".into(),
                not_before_ms,
                at_ms: 1_000,
                ..Default::default()
            })
        };
        let story = fold(&[scheduled("broadcast"), held(9_000)]).expect("a story");
        assert_eq!((story.status.as_str(), story.not_before.as_deref()), ("held", Some("1970-01-01T00:00:09.000Z")));
        assert_eq!(Tally::of(Some(&story)).held, 1, "counted as held");
        assert_eq!(Tally::of(Some(&story)).scheduled, 1, "and as one of its run's emails");
        let again = apply(Some(story.clone()), &held(12_000)).expect("a story");
        assert_eq!(again.not_before.as_deref(), Some("1970-01-01T00:00:12.000Z"), "held once more");
        let released = LogEvent::EmailReleased(proto::EmailReleased { at_ms: 12_000, ..Default::default() });
        let sent = LogEvent::EmailSent(proto::EmailSent { sent_at_ms: 12_500, ..Default::default() });
        let story = fold(&[scheduled("broadcast"), held(9_000), released, sent]).expect("a story");
        assert_eq!((story.status.as_str(), story.not_before.as_deref()), ("sent", None));
        let types: Vec<&str> = story.timeline.iter().filter_map(|entry| entry["type"].as_str()).collect();
        assert_eq!(types, ["scheduled", "held", "released", "sent"]);
        assert_eq!(Tally::of(Some(&story)).held, 0);
        let refused = LogEvent::EmailSkipped(proto::EmailSkipped {
            email_id: "em_1".into(),
            gate: "suppressed".into(),
            code: "recipient_suppressed".into(),
            at_ms: 9_000,
            ..Default::default()
        });
        let story = fold(&[scheduled("broadcast"), held(9_000), refused.clone()]).expect("a story");
        assert_eq!((story.status.as_str(), story.not_before.as_deref()), ("skipped", None));
        assert_eq!(story.origin["broadcastRunId"], "bcr_1", "the story keeps what sent it");
        assert_eq!(story.timeline.last().expect("an entry")["gate"], "suppressed");
        assert_eq!(Tally::of(Some(&story)), Tally::default(), "counted by its run's skips instead");
        let sent_story = fold(&[scheduled("template"), LogEvent::EmailSent(proto::EmailSent::default())]);
        assert_eq!(
            apply(sent_story.clone(), &refused).map(|story| story.status),
            Some("sent".to_owned()),
            "only a held send can be refused later"
        );
        assert_eq!(apply(sent_story.clone(), &held(5)).map(|story| story.status), Some("sent".to_owned()));
    }

    #[test]
    fn each_decision_of_the_send_policy_names_the_zone_it_read_and_flags_a_value_that_is_no_zone() {
        let zone = |name: &str, source: &str| Some(proto::PolicyZone { name: name.into(), source: source.into() });
        let LogEvent::EmailScheduled(mut first) = scheduled("broadcast") else { panic!("scheduled") };
        first.zone = zone("Europe/Berlin", "invalid");
        let held = LogEvent::EmailHeld(proto::EmailHeld {
            gate: "quiet_hours".into(),
            not_before_ms: 9_000,
            at_ms: 1_000,
            zone: zone("Europe/Berlin", "invalid"),
            ..Default::default()
        });
        let released = LogEvent::EmailReleased(proto::EmailReleased {
            at_ms: 9_000,
            zone: zone("Asia/Kolkata", "contact"),
            ..Default::default()
        });
        let story = fold(&[LogEvent::EmailScheduled(first), held, released]).expect("a story");
        let zones: Vec<(&str, &str, &str)> = story
            .timeline
            .iter()
            .map(|entry| {
                (
                    entry["type"].as_str().unwrap_or_default(),
                    entry["zone"]["name"].as_str().unwrap_or_default(),
                    entry["zone"]["source"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            zones,
            [
                ("scheduled", "Europe/Berlin", "invalid"),
                ("held", "Europe/Berlin", "invalid"),
                ("released", "Asia/Kolkata", "contact")
            ]
        );
        let plain = fold(&[scheduled("template")]).expect("a story");
        assert_eq!(plain.timeline[0].get("zone"), None, "no policy, no zone");
    }

    #[test]
    fn a_tally_counts_each_fact_of_an_email_once_and_a_bucket_names_what_sent_it() {
        let sent = LogEvent::EmailSent(proto::EmailSent { sent_at_ms: 2_000, ..Default::default() });
        let opened = |machine: &str| {
            LogEvent::EmailOpened(proto::EmailOpened { machine: machine.into(), at_ms: 3_000, ..Default::default() })
        };
        let bounced = LogEvent::EmailBounced(proto::EmailBounced { at_ms: 4_000, ..Default::default() });
        let complained = LogEvent::EmailComplained(proto::EmailComplained { at_ms: 5_000, ..Default::default() });
        let mut story = None;
        let mut total = [0; 10];
        for event in
            [scheduled("broadcast"), sent, opened("privacy_proxy"), opened(""), opened(""), bounced, complained]
        {
            let before = Tally::of(story.as_ref());
            story = apply(story, &event);
            for (sum, delta) in total.iter_mut().zip(Tally::of(story.as_ref()).minus(&before)) {
                *sum += delta;
            }
        }
        assert_eq!(total, [1, 1, 0, 0, 1, 1, 0, 1, 0, 0], "{:?}", Tally::FIELDS);
        let story = story.expect("a story");
        assert_eq!(bucket(&story), Some(("broadcast_run", "bcr_1".to_owned())));
        let workflow = fold(&[LogEvent::EmailScheduled(proto::EmailScheduled {
            origin: "workflow".into(),
            form_id: "run_1".into(),
            parent_id: "wf_1".into(),
            step_id: "send".into(),
            ..Default::default()
        })])
        .expect("a story");
        assert_eq!(bucket(&workflow), Some(("workflow_step", "wf_1/send".to_owned())));
        assert_eq!(bucket(&fold(&[scheduled("template")]).expect("a story")), None);
    }
}
