//! Which webhooks want an event: the webhook and the occurrence as they are matched, the
//! trigger an event is, the trigger, schema and filter tests, and a segment condition's
//! membership.

use std::collections::HashMap;

use deadpool_postgres::Transaction;
use domain::webhooks::Trigger;
use filter::Filter;
use platform::events::LogEvent;
use platform::proto;
use serde_json::Value;

/// A webhook as the enqueue worker matches it.
#[derive(Debug, Clone)]
pub(super) struct Endpoint {
    pub(super) webhook_id: String,
    pub(super) trigger: String,
    pub(super) schema_id: Option<String>,
    pub(super) email_event_types: Vec<String>,
    pub(super) url: String,
    pub(super) filter: Option<Filter>,
    /// A segment condition: deliver only for contacts in this segment.
    pub(super) segment_id: Option<String>,
    pub(super) live: bool,
    pub(super) secret_version: i32,
}

/// What an event asks of webhooks: its trigger, schema, subject (whose key seals the body)
/// and the `data` of the body.
pub(super) struct Occurrence {
    pub(super) trigger: Trigger,
    /// `None` for email events, which name no schema.
    pub(super) schema_id: Option<String>,
    /// The email event type (`bounced`) of an `email event`.
    pub(super) email_type: Option<String>,
    pub(super) subject_id: Option<String>,
    pub(super) data: Value,
    /// What a custom filter reads when it is not `data` itself: an event's values beside
    /// its fields, so `amount is over 100` works on an event as on a record.
    pub(super) filter_view: Option<Value>,
}

impl Occurrence {
    /// The contact the occurrence is about, which a segment condition tests: the upserted
    /// contact, an event's contact, an email's recipient.
    pub(super) fn contact_id(&self) -> Option<&str> {
        match self.trigger {
            Trigger::ContactUpserted | Trigger::EmailEvent => self.subject_id.as_deref(),
            Trigger::EventFired => self.filter_view.as_ref()?.get("contactId")?.as_str(),
            _ => None,
        }
    }

    /// The delivery's `type`: the trigger's (`contact.upserted`), or `email.<type>` for an
    /// email event (`email.bounced`).
    pub(super) fn kind(&self) -> String {
        match &self.email_type {
            Some(email_type) => format!("email.{email_type}"),
            None => self.trigger.delivery_type().to_owned(),
        }
    }
}

/// The `segments` read model as the enqueue worker reads it: its live version's schema and
/// position, loaded when a segment condition first needs it.
#[derive(Default)]
pub(super) struct Membership {
    live: Option<Option<(String, i64)>>,
}

impl Membership {
    /// Whether `contact_id` is in `segment_id` as of `position` or later; `None` when the read
    /// model has not reached `position` yet.
    pub(super) async fn contains(
        &mut self,
        transaction: &Transaction<'_>,
        segment_id: &str,
        contact_id: &str,
        position: i64,
    ) -> anyhow::Result<Option<bool>> {
        if self.live.is_none() {
            let row = transaction
                .query_opt("SELECT version, position FROM projections WHERE name = 'segments' AND status = 'live'", &[])
                .await?;
            self.live = Some(row.map(|row| (platform::readmodel::schema_name("segments", row.get(0)), row.get(1))));
        }
        let Some(Some((schema, reached))) = &self.live else { return Ok(None) };
        if *reached < position {
            return Ok(None);
        }
        let statement = transaction
            .prepare_cached(&format!(
                "SELECT EXISTS (SELECT 1 FROM {schema}.members WHERE segment_id = $1 AND contact_id = $2)"
            ))
            .await?;
        Ok(Some(transaction.query_one(&statement, &[&segment_id, &contact_id]).await?.get(0)))
    }
}

/// The `email event` type (one of `EMAIL_EVENT_TYPES`) that `event` is, if it is one.
pub(super) fn email_event_type(event: &LogEvent) -> Option<&'static str> {
    Some(match event {
        LogEvent::EmailScheduled(_) => "scheduled",
        LogEvent::EmailSent(_) => "sent",
        LogEvent::EmailFailed(_) => "failed",
        LogEvent::EmailBounced(_) => "bounced",
        LogEvent::EmailComplained(_) => "complained",
        LogEvent::EmailUnsubscribed(_) => "unsubscribed",
        LogEvent::EmailOpened(_) => "opened",
        LogEvent::EmailClicked(_) => "clicked",
        _ => return None,
    })
}

/// Whether a live webhook of the space could want `event`, judged on its trigger and an
/// email event's type alone, so the occurrence (which may read the email's template or the
/// event's acceptance, and opens sealed data) is built only when one could. Events that make
/// no occurrence pass; `fits` has the last word.
pub(super) fn may_be_wanted(webhooks: &HashMap<String, Endpoint>, event: &LogEvent) -> bool {
    let email_type = email_event_type(event);
    let trigger = match event {
        LogEvent::RecordCreated(created) => upserted(&created.schema_type),
        LogEvent::RecordUpdated(updated) => upserted(&updated.schema_type),
        LogEvent::RecordDeletionRequested(requested) => deleted(&requested.schema_type),
        LogEvent::EventAccepted(_) | LogEvent::EventReadinessChanged(_) => Trigger::EventFired,
        _ if email_type.is_some() => Trigger::EmailEvent,
        _ => return true,
    };
    webhooks.values().any(|endpoint| {
        endpoint.live
            && endpoint.trigger == trigger.as_str()
            && email_type.is_none_or(|kind| endpoint.email_event_types.iter().any(|wanted| wanted == kind))
    })
}

/// The trigger of a record write of `schema_type`.
pub(super) fn upserted(schema_type: &str) -> Trigger {
    if schema_type == "contact" { Trigger::ContactUpserted } else { Trigger::ObjectUpserted }
}

/// The trigger of a record deletion of `schema_type`.
pub(super) fn deleted(schema_type: &str) -> Trigger {
    if schema_type == "contact" { Trigger::ContactDeleted } else { Trigger::ObjectDeleted }
}

/// Whether a live webhook wants an occurrence: its trigger and schema, and its filter over
/// the body's `data`.
pub(super) fn fits(endpoint: &Endpoint, occurrence: &Occurrence) -> bool {
    endpoint.live
        && endpoint.trigger == occurrence.trigger.as_str()
        && endpoint.schema_id == occurrence.schema_id
        && occurrence.email_type.as_ref().is_none_or(|kind| endpoint.email_event_types.contains(kind))
        && endpoint
            .filter
            .as_ref()
            .is_none_or(|filter| filter::matches(filter, occurrence.filter_view.as_ref().unwrap_or(&occurrence.data)))
}

/// The filter a condition stores, if it is a custom filter.
pub(super) fn filter_of(condition: Option<&proto::WebhookCondition>) -> Option<Filter> {
    let condition = condition.filter(|condition| condition.r#type == "custom filter")?;
    let expression: Value = serde_json::from_str(&condition.expression).ok()?;
    filter::from_json(&expression).ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn endpoint(filter: Option<Filter>) -> Endpoint {
        Endpoint {
            webhook_id: "wh_1".into(),
            trigger: "contact upserted".into(),
            schema_id: Some("sch_1".into()),
            email_event_types: Vec::new(),
            url: "https://example.com".into(),
            filter,
            segment_id: None,
            live: true,
            secret_version: 1,
        }
    }

    fn contact(plan: &str) -> Occurrence {
        Occurrence {
            trigger: Trigger::ContactUpserted,
            schema_id: Some("sch_1".into()),
            email_type: None,
            subject_id: None,
            data: json!({"id": "con_1", "plan": plan}),
            filter_view: None,
        }
    }

    #[test]
    fn an_email_event_delivery_is_typed_by_its_email_event_type() {
        let mut bounced = contact("pro");
        (bounced.trigger, bounced.schema_id, bounced.email_type) = (Trigger::EmailEvent, None, Some("bounced".into()));
        assert_eq!(bounced.kind(), "email.bounced");
        assert_eq!(contact("pro").kind(), "contact.upserted");
        let mut email_hook = endpoint(None);
        (email_hook.trigger, email_hook.schema_id) = ("email event".into(), None);
        email_hook.email_event_types = vec!["sent".into()];
        assert!(!fits(&email_hook, &bounced), "only the email event types the webhook asked for");
        email_hook.email_event_types.push("bounced".into());
        assert!(fits(&email_hook, &bounced));
    }

    #[test]
    fn an_event_is_looked_at_only_when_a_live_webhook_listens_for_its_trigger() {
        let sent = LogEvent::EmailSent(proto::EmailSent::default());
        let contact_created =
            LogEvent::RecordCreated(proto::RecordCreated { schema_type: "contact".into(), ..Default::default() });
        let contacts = HashMap::from([("wh_1".to_owned(), endpoint(None))]);
        assert!(may_be_wanted(&contacts, &contact_created));
        assert!(!may_be_wanted(&contacts, &sent), "no email event webhook: the email's template is not read");
        let mut email_hook = endpoint(None);
        (email_hook.trigger, email_hook.schema_id) = ("email event".into(), None);
        email_hook.email_event_types = vec!["bounced".into()];
        let mut hooks = HashMap::from([("wh_2".to_owned(), email_hook)]);
        assert!(!may_be_wanted(&hooks, &sent), "a webhook for other email event types");
        if let Some(hook) = hooks.get_mut("wh_2") {
            hook.email_event_types.push("sent".into());
        }
        assert!(may_be_wanted(&hooks, &sent));
        if let Some(hook) = hooks.get_mut("wh_2") {
            hook.live = false;
        }
        assert!(!may_be_wanted(&hooks, &sent), "a paused webhook");
        assert!(!may_be_wanted(&hooks, &contact_created));
    }

    #[test]
    fn every_email_event_is_a_type_a_webhook_can_name() {
        let events = [
            LogEvent::EmailScheduled(Default::default()),
            LogEvent::EmailSent(Default::default()),
            LogEvent::EmailFailed(Default::default()),
            LogEvent::EmailBounced(Default::default()),
            LogEvent::EmailComplained(Default::default()),
            LogEvent::EmailUnsubscribed(Default::default()),
            LogEvent::EmailOpened(Default::default()),
            LogEvent::EmailClicked(Default::default()),
        ];
        let types: Vec<_> = events.iter().filter_map(email_event_type).collect();
        assert_eq!(types, domain::webhooks::EMAIL_EVENT_TYPES, "each once, in the contract's order");
    }

    #[test]
    fn given_a_webhook_then_only_its_trigger_schema_and_filter_match() {
        assert!(fits(&endpoint(None), &contact("pro")));
        let mut paused = endpoint(None);
        paused.live = false;
        assert!(!fits(&paused, &contact("pro")), "a paused webhook enqueues nothing");
        let mut other_schema = contact("pro");
        other_schema.schema_id = Some("sch_2".into());
        assert!(!fits(&endpoint(None), &other_schema));
        let mut deleted = contact("pro");
        deleted.trigger = Trigger::ContactDeleted;
        assert!(!fits(&endpoint(None), &deleted));
        let filter = filter::parse_plain("plan is pro").expect("parses");
        assert!(fits(&endpoint(Some(filter.clone())), &contact("pro")));
        assert!(!fits(&endpoint(Some(filter)), &contact("free")), "the filter rejects: not enqueued");
    }
}
