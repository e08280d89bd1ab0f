//! An email's story, folded from its stream (pure): what sent it, to whom, what became of
//! it (scheduled, sent or failed with the relay's answer, bounced, complained, unsubscribed)
//! and what the recipient did (opens and clicks, people's and machines' apart). The `emails`
//! read model keeps it; `GET /emails/{id}` answers it.

use platform::events::LogEvent;
use platform::time::format_millis;
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
    /// `transactional` or `marketing`.
    pub kind: String,
    pub topic_id: Option<String>,
    pub contact_id: String,
    /// What sent it: `{type}` with the form, broadcast and run, or workflow, run and step.
    pub origin: Value,
    /// `scheduled`, `sent`, `failed`, `outcome_unknown`, `bounced` or `complained`.
    pub status: String,
    pub scheduled_at: String,
    pub sent_at: Option<String>,
    pub unsubscribed: bool,
    pub engagement: Engagement,
    /// What happened, in log order: each status change, the unsubscription, and the first
    /// open and first click of each link by a person and by a machine.
    pub timeline: Vec<Value>,
}

fn some(text: &str) -> Option<&str> {
    Some(text).filter(|text| !text.is_empty())
}

fn origin(scheduled: &platform::proto::EmailScheduled) -> Value {
    let (kind, source, parent, step) =
        (scheduled.origin.as_str(), some(&scheduled.form_id), some(&scheduled.parent_id), some(&scheduled.step_id));
    match kind {
        "form_confirmation" => json!({"type": kind, "formId": source}),
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
            kind: scheduled.kind.clone(),
            topic_id: some(&scheduled.topic_id).map(str::to_owned),
            contact_id: scheduled.contact_id.clone(),
            origin: origin(scheduled),
            status: "scheduled".to_owned(),
            scheduled_at: at.clone(),
            sent_at: None,
            unsubscribed: false,
            engagement: Engagement::default(),
            timeline: vec![json!({"type": "scheduled", "at": at})],
        });
    }
    let mut story = story?;
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
            let entry =
                json!({"type": "clicked", "at": at, "linkId": clicked.link_id, "machine": some(&clicked.machine)});
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

#[cfg(test)]
mod tests {
    use platform::proto;

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
}
