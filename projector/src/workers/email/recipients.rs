//! What the send decision reads about a batch of recipients, loaded once per batch: a
//! broadcast run's step and the held sends worker both decide from it.

use std::collections::{BTreeMap, HashMap, HashSet};

use deadpool_postgres::GenericClient;
use mail::facts::{Asked, SendFacts};
use mail::send::{Authored, Facts, Kind};
use platform::crypto::{DataKey, Keys};
use serde_json::Value;

/// A recipient's contact as the checks and the rendering need it.
pub(crate) struct Contact {
    pub(crate) schema_id: String,
    pub(crate) document: Value,
}

/// What a batch's checks read about its recipients, loaded once per batch.
#[derive(Default)]
pub(crate) struct Recipients {
    /// The contacts as the segments read model holds them (none: deleted since the snapshot).
    pub(crate) contacts: HashMap<String, Contact>,
    /// Each contact's topic statuses.
    pub(crate) subscriptions: HashMap<String, BTreeMap<String, String>>,
    /// The email consent attributes of each schema.
    pub(crate) consent_keys: HashMap<String, Vec<String>>,
    /// The addresses among them suppressed in the space or globally.
    pub(crate) suppressed: HashSet<String>,
    /// The contacts' data keys (none: erased).
    pub(crate) keys: Keys,
    /// Each contact's marketing sends within the send policy's caps' windows.
    pub(crate) sent: HashMap<String, Vec<mail::send::Sent>>,
}

/// A recipient the checks let through, with what its email is built from.
pub(crate) struct Allowed<'a> {
    pub(crate) contact: &'a Contact,
    pub(crate) address: &'a str,
    pub(crate) key: &'a DataKey,
}

impl Recipients {
    /// What the send decision reads about `contact_ids` of `space_id`, in a few statements
    /// whatever their number: the contacts as the `segments` read model (version schema
    /// `segments`) holds them, their topic statuses, the consent attributes of their schemas
    /// (from `catalog`), which of their addresses are suppressed, their data keys and, when
    /// the send policy has caps (`lookback_ms`), their marketing sends within its windows.
    pub(crate) async fn load(
        client: &impl GenericClient,
        (catalog, segments): (&str, &str),
        space_id: &str,
        contact_ids: &[String],
        lookback_ms: Option<i64>,
    ) -> anyhow::Result<Self> {
        // The contacts as the segments read model holds them: where the audience was taken
        // from, so a recipient of the snapshot is there unless it was deleted since.
        let mut recipients = Recipients::default();
        for row in client
            .query(
                &format!(
                    "SELECT contact_id, schema_id, doc, subscriptions FROM {segments}.contacts
                 WHERE contact_id = ANY($1) AND doc IS NOT NULL"
                ),
                &[&contact_ids],
            )
            .await?
        {
            let contact_id: String = row.get(0);
            recipients.subscriptions.insert(contact_id.clone(), serde_json::from_value(row.get(3)).unwrap_or_default());
            recipients.contacts.insert(
                contact_id,
                Contact { schema_id: row.get::<_, Option<String>>(1).unwrap_or_default(), document: row.get(2) },
            );
        }
        let schema_ids: Vec<&str> = recipients.contacts.values().map(|contact| contact.schema_id.as_str()).collect();
        recipients.consent_keys = mail::facts::consent_keys(client, catalog, &schema_ids).await?;
        let addresses: Vec<&str> = recipients
            .contacts
            .values()
            .filter_map(|contact| contact.document.get("email").and_then(Value::as_str))
            .collect();
        // Their topic statuses came with the documents: the facts read the rest.
        let asked = Asked {
            space_id,
            contact_ids,
            addresses: &addresses,
            subscriptions: false,
            sends_since_ms: lookback_ms.map(|lookback| platform::time::now_millis() - lookback),
        };
        let SendFacts { suppressed, sent, .. } = SendFacts::load(client, asked).await?;
        (recipients.suppressed, recipients.sent) = (suppressed, sent);
        recipients.keys = platform::crypto::load_keys(client, contact_ids).await?;
        Ok(recipients)
    }

    /// What the send decision is asked about `contact_id`, as this batch loaded it: a contact
    /// deleted since the snapshot, or erased (its data key destroyed), is gone.
    pub(crate) fn facts<'a>(&'a self, authored: &'a Authored, contact_id: &str, now_ms: i64) -> Facts<'a> {
        let template = &authored.template;
        let topic_id = template.topic_id.as_deref();
        let policy = authored.policy.as_ref();
        let zone_attribute = policy.and_then(|policy| policy.time_zone.attribute.as_deref());
        let contact = self.contacts.get(contact_id).filter(|_| self.keys.get(contact_id).is_some()).map(|contact| {
            let address = contact.document.get("email").and_then(Value::as_str);
            let consent_keys = self.consent_keys.get(&contact.schema_id).map(Vec::as_slice).unwrap_or_default();
            mail::send::Contact {
                address,
                suppressed: address.is_some_and(|address| self.suppressed.contains(address)),
                consent: mail::send::email_consent(consent_keys, |key| contact.document.get(key)),
                subscription: topic_id
                    .and_then(|topic_id| self.subscriptions.get(contact_id)?.get(topic_id))
                    .map(String::as_str),
                zone: zone_attribute.and_then(|attribute| contact.document.get(attribute)).and_then(Value::as_str),
                sent: self.sent.get(contact_id).map(Vec::as_slice).unwrap_or_default(),
            }
        });
        Facts { kind: Kind::of(&template.kind), topic_id, contact, policy, allowance_refused: false, now_ms }
    }

    /// The address of `contact_id` and its data key, to seal the address in a refused send's
    /// story; `None` without either.
    pub(crate) fn sealable(&self, contact_id: &str) -> Option<(&str, &DataKey)> {
        let address = self.contacts.get(contact_id)?.document.get("email").and_then(Value::as_str)?;
        Some((address, self.keys.get(contact_id)?))
    }

    /// What the email of a recipient the decision let through is built from.
    pub(crate) fn allowed(&self, contact_id: &str) -> Option<Allowed<'_>> {
        let contact = self.contacts.get(contact_id)?;
        let address = contact.document.get("email").and_then(Value::as_str)?;
        Some(Allowed { contact, address, key: self.keys.get(contact_id)? })
    }
}

/// What the decisions' tests of a batch are given: one contact and one marketing template.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::collections::BTreeMap;

    use domain::email::resources::{DomainDef, SenderDef};
    use mail::send::Authored;
    use platform::crypto::Keyring;
    use serde_json::Value;

    use super::{Contact, Recipients};

    pub(crate) const TOPIC: &str = "top_news";

    /// Given one contact `con_1` of schema `contacts` with `document`, consent attribute
    /// `emailOk`, topic status `status`, a data key, and no suppression.
    pub(crate) fn given(document: Value, status: Option<&str>) -> Recipients {
        let mut recipients = Recipients::default();
        recipients.contacts.insert("con_1".to_owned(), Contact { schema_id: "contacts".to_owned(), document });
        let topics = status.map(|status| (TOPIC.to_owned(), status.to_owned())).into_iter().collect();
        recipients.subscriptions.insert("con_1".to_owned(), topics);
        recipients.consent_keys.insert("contacts".to_owned(), vec!["emailOk".to_owned()]);
        let keyring = Keyring::from_hex(&"ab".repeat(32)).expect("a key");
        let (key, _) = keyring.generate("con_1").expect("a data key");
        recipients.keys.insert("con_1".to_owned(), key);
        recipients
    }

    pub(crate) fn authored(topic: Option<&str>) -> Authored {
        let template = domain::email::resources::TemplateDef {
            slug: "t".into(),
            name: "T".into(),
            kind: "marketing".into(),
            topic_id: topic.map(str::to_owned),
            sender_id: "snd_1".into(),
            subject: "S".into(),
            html: String::new(),
            text: String::new(),
            recipient: "contact".into(),
            data: BTreeMap::new(),
            tracking: None,
            ..Default::default()
        };
        let sender = SenderDef {
            slug: "s".into(),
            from_name: "S".into(),
            from_address: "s@example.test".into(),
            domain_id: "dom_1".into(),
            reply_to: None,
            postal_address: None,
        };
        let key = domain::email::resources::StoredKey {
            selector: "s1".into(),
            public_key: String::new(),
            wrapped_key: String::new(),
            private_key: String::new(),
        };
        let domain = DomainDef { slug: "d".into(), name: "example.test".into(), dkim: key, return_path: String::new() };
        Authored {
            template_id: "tpl_1".into(),
            revision: 1,
            template,
            sender_id: "snd_1".into(),
            sender,
            domain,
            topic: None,
            allowance: None,
            policy: None,
            parts: Default::default(),
            preheader: None,
        }
    }
}
