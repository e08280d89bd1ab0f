//! Sends a gate refused: the story such a send leaves (`EmailSkipped`, which begins its
//! email's stream) and the fact that decided, read from the log. A journey's send step and a
//! broadcast's recipient both leave one, so `GET /emails/{id}` can say which gate refused the
//! send and since which log event the refusing state held.

use std::collections::HashMap;

use deadpool_postgres::GenericClient;
use platform::crypto::{DataKey, Keys};
use platform::events::LogEvent;
use platform::log::{ExpectedVersion, NewEvent, StoredEvent, StreamAppend};
use platform::proto;

use crate::send::{Authored, Gate, Origin};

/// The log event from which a refusing state held: its position, type and recording time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecidedBy {
    pub position: i64,
    pub event_type: String,
    pub at_ms: i64,
}

impl DecidedBy {
    fn of(stored: &StoredEvent) -> Self {
        Self {
            position: stored.position,
            event_type: stored.event_type.clone(),
            at_ms: stored.recorded_at.timestamp_millis(),
        }
    }
}

/// A send a gate refused, as its story records it.
pub struct Skip<'a> {
    pub email_id: &'a str,
    pub space_id: &'a str,
    pub authored: &'a Authored,
    pub contact_id: &'a str,
    pub origin: Origin<'a>,
    pub gate: Gate,
    pub decided_by: Option<&'a DecidedBy>,
    /// The address the send was refused for and the contact's data key that seals it; `None`
    /// when either is missing (the delivery log then shows no address).
    pub recipient: Option<(&'a str, &'a DataKey)>,
    /// The zone the send policy read (`send::zone_used`), recorded for its gates.
    pub zone: Option<&'a crate::send::ZoneUsed>,
    pub at_ms: i64,
}

/// The append that records `skip`: `EmailSkipped` at the start of its email's stream (a
/// second attempt at the same email fails its expected version, so it is recorded once).
pub fn skipped(skip: Skip<'_>) -> StreamAppend {
    StreamAppend { expected: ExpectedVersion::NoStream, ..skipped_after(skip) }
}

/// The append that ends a held email's stream with `skip` (decided again at its time and
/// refused); the held sends worker's lease on its outbox row makes it happen once.
pub fn skipped_after(skip: Skip<'_>) -> StreamAppend {
    let (authored, origin) = (skip.authored, skip.origin);
    let (decided_by_position, decided_by_type, decided_by_at_ms) =
        skip.decided_by.map_or((0, String::new(), 0), |by| (by.position, by.event_type.clone(), by.at_ms));
    let event = proto::EmailSkipped {
        email_id: skip.email_id.to_owned(),
        space_id: skip.space_id.to_owned(),
        template_id: authored.template_id.clone(),
        template_revision: authored.revision,
        kind: authored.template.kind.clone(),
        contact_id: skip.contact_id.to_owned(),
        topic_id: authored.template.topic_id.clone().unwrap_or_default(),
        source: Some(proto::EmailSource {
            template_id: authored.template_id.clone(),
            origin: origin.kind.to_owned(),
            source_id: origin.source_id.to_owned(),
            parent_id: origin.parent_id.to_owned(),
            step_id: origin.step_id.to_owned(),
            variant: origin.variant.to_owned(),
            experiment_winner: origin.winner,
        }),
        gate: skip.gate.as_str().to_owned(),
        code: skip.gate.code().as_str().to_owned(),
        message: skip.gate.reason().to_owned(),
        decided_by_position,
        decided_by_type,
        decided_by_at_ms,
        at_ms: skip.at_ms,
        recipient: skip.recipient.and_then(|(address, key)| sealed_recipient(skip.contact_id, address, key)),
        zone: skip
            .zone
            .filter(|_| matches!(skip.gate, Gate::FrequencyCap | Gate::QuietHours))
            .map(crate::send::ZoneUsed::to_proto),
    };
    StreamAppend {
        stream_id: domain::email::stream_id(skip.email_id),
        expected: ExpectedVersion::Any,
        events: vec![NewEvent {
            event: LogEvent::EmailSkipped(event),
            subject_id: Some(skip.contact_id.to_owned()),
            occurred_at: platform::time::from_millis(skip.at_ms),
        }],
    }
}

/// `address` sealed under the contact's key; `None` for an empty address, or when it cannot
/// be sealed (a key that does not encrypt: the story then names no address rather than keep
/// it in the clear).
fn sealed_recipient(contact_id: &str, address: &str, key: &DataKey) -> Option<proto::Sealed> {
    if address.is_empty() {
        return None;
    }
    let mut sealed = platform::events::seal(contact_id, &proto::EmailRecipient { address: address.to_owned() });
    platform::events::encrypt(&mut sealed, key).ok()?;
    Some(sealed)
}

/// What to look up for one refusal: the contact, the gate that refused, the address, the
/// template's topic and the keys of the contact's email consent attributes.
#[derive(Debug, Clone, Copy)]
pub struct Refused<'a> {
    pub contact_id: &'a str,
    pub gate: Gate,
    pub address: &'a str,
    pub topic_id: Option<&'a str>,
    pub consent_keys: &'a [String],
    /// A frequency cap's: the log position of the send that filled it, as the decision named it.
    pub filled_by: Option<i64>,
}

/// For each refusal, the log event from which the refusing state held: the suppression's
/// addition (the earliest in force for the address, in the space or global); the record event
/// since which the contact's email consent has not been given; the last change of the
/// contact's status in the topic; the `EmailScheduled` of the send that filled a frequency cap.
/// `None` where no event decided: a topic never subscribed to, a schema without consent
/// attributes, the allowance (a count), quiet hours (a clock). Four statements at most,
/// whatever the number of refusals; `keys` opens the contacts' records.
pub async fn decided_by(
    client: &impl GenericClient,
    space_id: &str,
    refused: &[Refused<'_>],
    keys: &Keys,
) -> anyhow::Result<Vec<Option<DecidedBy>>> {
    let of_gate = |gate: Gate| refused.iter().filter(move |refusal| refusal.gate == gate);
    let addresses: Vec<&str> = of_gate(Gate::Suppressed).map(|refusal| refusal.address).collect();
    let mut suppressions: HashMap<String, DecidedBy> = HashMap::new();
    if !addresses.is_empty() {
        let statement = client
            .prepare_cached(
                "SELECT DISTINCT ON (k.identifier) k.identifier, e.position, e.event_type, e.recorded_at
                 FROM suppression_keys k
                 CROSS JOIN LATERAL (SELECT position, event_type, recorded_at FROM events
                                     WHERE stream_id = 'suppression/' || k.suppression_id
                                     ORDER BY stream_version LIMIT 1) e
                 WHERE k.scope IN ($1, 'global') AND k.identifier = ANY($2)
                 ORDER BY k.identifier, e.position",
            )
            .await?;
        for row in client.query(&statement, &[&space_id, &addresses]).await? {
            let at: chrono::DateTime<chrono::Utc> = row.get(3);
            let by = DecidedBy { position: row.get(1), event_type: row.get(2), at_ms: at.timestamp_millis() };
            suppressions.insert(row.get(0), by);
        }
    }
    let record_streams: Vec<String> = of_gate(Gate::Consent)
        .filter(|refusal| !refusal.consent_keys.is_empty())
        .map(|refusal| domain::records::stream_id(refusal.contact_id))
        .collect();
    let mut records: HashMap<String, Vec<StoredEvent>> = HashMap::new();
    for stored in read(client, &record_streams).await? {
        records.entry(stored.stream_id.clone()).or_default().push(stored);
    }
    let subscription_streams: Vec<String> =
        of_gate(Gate::Topic).map(|refusal| domain::email::subscriptions_stream(refusal.contact_id)).collect();
    let mut subscriptions: HashMap<String, Vec<StoredEvent>> = HashMap::new();
    for stored in read(client, &subscription_streams).await? {
        subscriptions.entry(stored.stream_id.clone()).or_default().push(stored);
    }
    let positions: Vec<i64> = of_gate(Gate::FrequencyCap).filter_map(|refusal| refusal.filled_by).collect();
    let mut filling: HashMap<i64, DecidedBy> = HashMap::new();
    if !positions.is_empty() {
        let statement = client
            .prepare_cached("SELECT position, event_type, recorded_at FROM events WHERE position = ANY($1)")
            .await?;
        for row in client.query(&statement, &[&positions]).await? {
            let at: chrono::DateTime<chrono::Utc> = row.get(2);
            filling.insert(
                row.get(0),
                DecidedBy { position: row.get(0), event_type: row.get(1), at_ms: at.timestamp_millis() },
            );
        }
    }
    let none = Vec::new();
    refused
        .iter()
        .map(|refusal| match refusal.gate {
            Gate::Suppressed => Ok(suppressions.get(refusal.address).cloned()),
            Gate::Consent => {
                let stream = records.get(&domain::records::stream_id(refusal.contact_id)).unwrap_or(&none);
                consent_withheld_since(stream, refusal.consent_keys, keys)
            }
            Gate::Topic => {
                let stream =
                    subscriptions.get(&domain::email::subscriptions_stream(refusal.contact_id)).unwrap_or(&none);
                last_topic_change(stream, refusal.topic_id)
            }
            Gate::FrequencyCap => Ok(refusal.filled_by.and_then(|position| filling.get(&position).cloned())),
            // A count, a clock or an absence: no event decided.
            Gate::Allowance | Gate::Gone | Gate::NoAddress | Gate::QuietHours => Ok(None),
        })
        .collect()
}

async fn read(client: &impl GenericClient, streams: &[String]) -> anyhow::Result<Vec<StoredEvent>> {
    if streams.is_empty() {
        return Ok(Vec::new());
    }
    Ok(platform::log::read_streams(client, streams).await?)
}

/// The record event since which the consent attributes `consent_keys` have not all been
/// true (`None` when they are, or when there are none).
fn consent_withheld_since(
    stream: &[StoredEvent],
    consent_keys: &[String],
    keys: &Keys,
) -> anyhow::Result<Option<DecidedBy>> {
    if consent_keys.is_empty() {
        return Ok(None);
    }
    let mut since: Option<(bool, &StoredEvent)> = None;
    for stored in stream {
        let state = match stored.decode()? {
            LogEvent::RecordCreated(created) => domain::records::RecordState::from_created(&created, keys)?,
            LogEvent::RecordUpdated(updated) => domain::records::RecordState::from_updated(&updated, keys)?,
            _ => continue,
        };
        let values = state.values();
        let consented = crate::send::email_consent(consent_keys, |key| values.get(key)) == Some(true);
        if since.is_none_or(|(was, _)| was != consented) {
            since = Some((consented, stored));
        }
    }
    Ok(since.filter(|(consented, _)| !consented).map(|(_, stored)| DecidedBy::of(stored)))
}

/// The last change of the contact's status in `topic_id` (`None`: never changed).
fn last_topic_change(stream: &[StoredEvent], topic_id: Option<&str>) -> anyhow::Result<Option<DecidedBy>> {
    let Some(topic_id) = topic_id else { return Ok(None) };
    let mut last = None;
    for stored in stream {
        if let LogEvent::SubscriptionChanged(changed) = stored.decode()?
            && changed.topic_id == topic_id
        {
            last = Some(DecidedBy::of(stored));
        }
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn stored(position: i64, event: LogEvent) -> StoredEvent {
        StoredEvent {
            position,
            event_id: uuid::Uuid::nil(),
            stream_id: "record/con_1".into(),
            stream_version: position,
            event_type: event.event_type().to_owned(),
            payload: event.encode(),
            space_id: None,
            actor_key_id: None,
            subject_id: Some("con_1".into()),
            occurred_at: platform::time::from_millis(position * 1_000),
            recorded_at: platform::time::from_millis(position * 1_000),
        }
    }

    fn written(position: i64, values: Value) -> StoredEvent {
        let personal = proto::RecordPersonal { values_json: values.to_string(), ..Default::default() };
        let personal = Some(platform::events::seal("con_1", &personal));
        let event = if position == 1 {
            LogEvent::RecordCreated(proto::RecordCreated { record_id: "con_1".into(), personal, ..Default::default() })
        } else {
            LogEvent::RecordUpdated(proto::RecordUpdated { record_id: "con_1".into(), personal, ..Default::default() })
        };
        stored(position, event)
    }

    fn position(by: anyhow::Result<Option<DecidedBy>>) -> Option<i64> {
        by.expect("reads").map(|by| by.position)
    }

    #[test]
    fn a_skipped_sends_address_is_sealed_under_the_contacts_key_and_opens_only_with_it() {
        let keyring = platform::crypto::Keyring::from_hex(&"11".repeat(32)).expect("a keyring");
        let key = keyring.system_key("test");
        let sealed = sealed_recipient("con_1", "ada@example.com", &key).expect("sealed");
        assert!(matches!(sealed.body, Some(proto::sealed::Body::Ciphertext(_))), "never in the clear");
        let mut keys = Keys::default();
        keys.insert("con_1".into(), key);
        let opened: Option<proto::EmailRecipient> = platform::events::open(Some(&sealed), &keys).expect("opens");
        assert_eq!(opened.map(|recipient| recipient.address).as_deref(), Some("ada@example.com"));
        let erased: Option<proto::EmailRecipient> =
            platform::events::open(Some(&sealed), &Keys::default()).expect("no error");
        assert_eq!(erased, None, "an erased contact's address is gone");
        assert_eq!(sealed_recipient("con_1", "", &keyring.system_key("test")), None, "no address, nothing sealed");
    }

    #[test]
    fn consent_was_withheld_since_the_write_that_last_took_it_away() {
        let consent = ["news".to_owned()];
        let keys = Keys::default();
        let given = |values: &[Value]| -> Vec<StoredEvent> {
            values
                .iter()
                .enumerate()
                .map(|(at, values)| written(i64::try_from(at).unwrap_or(0) + 1, values.clone()))
                .collect()
        };
        let never = given(&[serde_json::json!({}), serde_json::json!({"name": "Ada"})]);
        assert_eq!(position(consent_withheld_since(&never, &consent, &keys)), Some(1), "never given: the creation");
        let withdrawn = given(&[
            serde_json::json!({"news": true}),
            serde_json::json!({"news": true, "name": "Ada"}),
            serde_json::json!({"news": false}),
            serde_json::json!({"news": false, "name": "Bea"}),
        ]);
        assert_eq!(position(consent_withheld_since(&withdrawn, &consent, &keys)), Some(3), "the withdrawal");
        let regiven = given(&[serde_json::json!({"news": false}), serde_json::json!({"news": true})]);
        assert_eq!(position(consent_withheld_since(&regiven, &consent, &keys)), None, "consent is given now");
        assert_eq!(position(consent_withheld_since(&never, &[], &keys)), None, "no consent attribute");
        let by = consent_withheld_since(&withdrawn, &consent, &keys).expect("reads").expect("an event");
        assert_eq!((by.event_type.as_str(), by.at_ms), ("RecordUpdated.v1", 3_000));
    }

    #[test]
    fn a_topic_status_was_decided_by_its_last_change() {
        let changed = |position: i64, topic: &str, status: &str| {
            stored(
                position,
                LogEvent::SubscriptionChanged(proto::SubscriptionChanged {
                    topic_id: topic.into(),
                    status: status.into(),
                    ..Default::default()
                }),
            )
        };
        let stream = [
            changed(1, "top_news", "subscribed"),
            changed(2, "top_news", "unsubscribed"),
            changed(3, "top_x", "subscribed"),
        ];
        assert_eq!(position(last_topic_change(&stream, Some("top_news"))), Some(2));
        assert_eq!(position(last_topic_change(&stream, Some("top_never"))), None, "never subscribed");
        assert_eq!(position(last_topic_change(&stream, None)), None);
    }
}
