//! Outgoing webhooks: the pieces the command service, the delivery worker and the tests share.
//! Triggers and their delivery type names ([`Trigger`]), the email event types a webhook may
//! ask for, signing by Standard Webhooks ([`signing`], decision D4) and the rules for delivery
//! targets ([`target`]).

pub mod attempt;
pub mod signing;
pub mod state;
pub mod target;

/// What makes a webhook fire (the contract's six triggers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    ContactUpserted,
    ContactDeleted,
    ObjectUpserted,
    ObjectDeleted,
    EventFired,
    EmailEvent,
}

impl Trigger {
    pub const ALL: [Trigger; 6] = [
        Trigger::ContactUpserted,
        Trigger::ContactDeleted,
        Trigger::ObjectUpserted,
        Trigger::ObjectDeleted,
        Trigger::EventFired,
        Trigger::EmailEvent,
    ];

    /// The trigger as the API spells it (`contact upserted`).
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::ContactUpserted => "contact upserted",
            Trigger::ContactDeleted => "contact deleted",
            Trigger::ObjectUpserted => "object upserted",
            Trigger::ObjectDeleted => "object deleted",
            Trigger::EventFired => "event fired",
            Trigger::EmailEvent => "email event",
        }
    }

    pub fn parse(text: &str) -> Option<Trigger> {
        Trigger::ALL.into_iter().find(|trigger| trigger.as_str() == text)
    }

    /// The type of schema the webhook's `schemaId` must name (`contact`, `object`, `event`),
    /// or `None` for `email event`, which takes no schema.
    pub fn schema_type(self) -> Option<&'static str> {
        match self {
            Trigger::ContactUpserted | Trigger::ContactDeleted => Some("contact"),
            Trigger::ObjectUpserted | Trigger::ObjectDeleted => Some("object"),
            Trigger::EventFired => Some("event"),
            Trigger::EmailEvent => None,
        }
    }

    /// The `type` of a delivery's body (D4: dot-separated). For `email event` this is only
    /// the prefix: a delivery is `email.<email event type>`, for example `email.bounced`.
    pub fn delivery_type(self) -> &'static str {
        match self {
            Trigger::ContactUpserted => "contact.upserted",
            Trigger::ContactDeleted => "contact.deleted",
            Trigger::ObjectUpserted => "object.upserted",
            Trigger::ObjectDeleted => "object.deleted",
            Trigger::EventFired => "event.fired",
            Trigger::EmailEvent => "email",
        }
    }
}

/// The id of the delivery of the log event at `position` to webhook `webhook_id`: stable, so
/// enqueuing again finds the same delivery, and receivers deduplicate on it (`webhook-id`).
pub fn delivery_id(position: i64, webhook_id: &str) -> String {
    kernel::ids::derived_id("msg", &[&position.to_string(), webhook_id])
}

/// The email event types an `email event` webhook may ask for: what the email pipeline
/// records about a message.
pub const EMAIL_EVENT_TYPES: [&str; 8] =
    ["scheduled", "sent", "failed", "bounced", "complained", "unsubscribed", "opened", "clicked"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triggers_round_trip_and_name_their_schema_type() {
        for trigger in Trigger::ALL {
            assert_eq!(Trigger::parse(trigger.as_str()), Some(trigger));
        }
        assert_eq!(Trigger::parse("contact_upserted"), None);
        assert_eq!(Trigger::parse("Contact upserted"), None);
        assert_eq!(Trigger::EventFired.schema_type(), Some("event"));
        assert_eq!(Trigger::ObjectDeleted.schema_type(), Some("object"));
        assert_eq!(Trigger::EmailEvent.schema_type(), None);
        assert_eq!(Trigger::ContactUpserted.delivery_type(), "contact.upserted");
    }
}
