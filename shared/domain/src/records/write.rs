//! The write assembly of record writes, shared by the command service's record writes and
//! the import worker: the streams and guards of a create or an update (with the subject's data
//! key and its personal data sealed), and the identity claims that keep identities unique.

use kernel::crypto::DataKey;
use kernel::error::Code;
use kernel::events::LogEvent;
use kernel::fresh::Fresh;
use kernel::log::{AppendError, ExpectedVersion, Guard, NewEvent, Param, SetValue, StreamAppend};
use kernel::proto::Sealed;

use super::decide::{Change, CreateDecision, Identity, Input};
use super::stream_id;

/// Identity values of the input, to look up their holders.
pub fn identity_values(input: &Input) -> Vec<(&'static str, String)> {
    input.identities.iter().filter_map(|(key, value)| value.clone().map(|value| (*key, value))).collect()
}

/// A record write ready to append: its stream and guards.
pub struct Write {
    pub stream: StreamAppend,
    pub guards: Vec<Guard>,
    /// The data key the record's personal data is encrypted under.
    pub key: DataKey,
}

impl Write {
    /// The write as carried by `source` (`form`, `confirmation`, `preferences`,
    /// `unsubscribe`, ...) and the id of what carried it (the form, the email): a creation's
    /// source, an update's change source, so the audit trail says where a consent came from.
    pub fn carried_by(mut self, source: &str, source_id: &str) -> Self {
        for new in &mut self.stream.events {
            match &mut new.event {
                LogEvent::RecordCreated(created) => {
                    source.clone_into(&mut created.source);
                    source_id.clone_into(&mut created.source_id);
                }
                LogEvent::RecordUpdated(updated) => {
                    source.clone_into(&mut updated.change_source);
                    source_id.clone_into(&mut updated.change_source_id);
                }
                _ => {}
            }
        }
        self
    }
}

/// The write of a new record (its personal data encrypted under a fresh key).
pub fn create_write(
    space_id: &str,
    schema_id: &str,
    decision: CreateDecision,
    fresh: &mut dyn Fresh,
) -> Result<Write, AppendError> {
    let mut decision = decision;
    let record_id = decision.event.record_id.clone();
    let (key, key_guard) = encrypt_personal(&mut decision.event.personal, (None, fresh), &record_id, space_id)?;
    let guards = decision
        .identities
        .iter()
        .map(|identity| claim(space_id, schema_id, &record_id, identity))
        .chain(key_guard)
        .collect();
    let occurred_at = kernel::time::from_millis(decision.event.created_at_ms);
    let stream = StreamAppend {
        stream_id: stream_id(&record_id),
        expected: ExpectedVersion::NoStream,
        events: vec![NewEvent {
            event: LogEvent::RecordCreated(decision.event),
            subject_id: Some(record_id),
            occurred_at,
        }],
    };
    Ok(Write { stream, guards, key })
}

/// The write of an update at `version`.
pub fn update_write(
    space_id: &str,
    schema_id: &str,
    (version, key): (i64, Option<DataKey>),
    change: Change,
    fresh: &mut dyn Fresh,
) -> Result<Write, AppendError> {
    let Change { mut event, state: new_state, claims, releases, .. } = change;
    let record_id = new_state.record_id.clone();
    let (key, key_guard) = encrypt_personal(&mut event.personal, (key, fresh), &record_id, space_id)?;
    let guards = releases
        .iter()
        .map(|identity| release(space_id, schema_id, &record_id, identity))
        .chain(claims.iter().map(|identity| claim(space_id, schema_id, &record_id, identity)))
        .chain(key_guard)
        .collect();
    let occurred_at = kernel::time::from_millis(event.updated_at_ms);
    let stream = StreamAppend {
        stream_id: stream_id(&record_id),
        expected: ExpectedVersion::Exactly(version),
        events: vec![NewEvent { event: LogEvent::RecordUpdated(event), subject_id: Some(record_id), occurred_at }],
    };
    Ok(Write { stream, guards, key })
}

/// Encrypts a record event's personal data under the record's data key. A record without a
/// key (a new one, or one written before encryption) gets a fresh key from `fresh`, stored by
/// the returned guard in the same transaction as the event.
pub fn encrypt_personal(
    personal: &mut Option<Sealed>,
    (key, fresh): (Option<DataKey>, &mut dyn Fresh),
    record_id: &str,
    space_id: &str,
) -> Result<(DataKey, Option<Guard>), AppendError> {
    // Drawing a key or sealing fails only for a defect of ours (no keyring, an input beyond GCM's limit).
    let failed = |error: anyhow::Error| AppendError::Failed(format!("{error:#}"));
    let (key, guard) = match key {
        Some(key) => (key, None),
        None => {
            let (key, wrapped) = fresh.data_key(record_id).map_err(failed)?;
            (key, Some(store_key(record_id, space_id, wrapped)))
        }
    };
    if let Some(personal) = personal.as_mut() {
        kernel::events::encrypt(personal, &key).map_err(failed)?;
    }
    Ok((key, guard))
}

/// The guard claiming `identity` for the record: its uniqueness within the schema.
pub fn claim(space_id: &str, schema_id: &str, record_id: &str, identity: &Identity) -> Guard {
    Guard::unique(
        "INSERT INTO record_identities (space_id, schema_id, kind, value, record_id) VALUES ($1, $2, $3, $4, $5)",
        identity_params(space_id, schema_id, record_id, identity),
        AppendError::Conflict {
            code: Code::IdentifierConflict,
            message: format!("a record with this {} already exists in the schema", identity.key),
        },
    )
    .with_set(
        "INSERT INTO record_identities (space_id, schema_id, kind, value, record_id)
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])",
        [space_id, schema_id, identity.key, &identity.value, record_id]
            .into_iter()
            .map(|value| SetValue::Text(Some(value.to_owned())))
            .collect(),
    )
}

/// The parameters of the identity guards: `(space, schema, kind, value, record)`.
fn identity_params(space_id: &str, schema_id: &str, record_id: &str, identity: &Identity) -> Vec<Param> {
    vec![
        Box::new(space_id.to_owned()),
        Box::new(schema_id.to_owned()),
        Box::new(identity.key.to_owned()),
        Box::new(identity.value.clone()),
        Box::new(record_id.to_owned()),
    ]
}

/// The guard releasing `identity` held by the record.
pub fn release(space_id: &str, schema_id: &str, record_id: &str, identity: &Identity) -> Guard {
    Guard::unique(
        "DELETE FROM record_identities WHERE space_id = $1 AND schema_id = $2 AND kind = $3 AND value = $4
         AND record_id = $5",
        identity_params(space_id, schema_id, record_id, identity),
        AppendError::Conflict { code: Code::IdentifierConflict, message: String::new() },
    )
}

/// The guard that stores a new subject's wrapped key in the transaction of its first event,
/// so the key and the data it protects commit together. If the subject already has a key (a
/// concurrent first write won), the command fails as a lost race and is decided again.
pub fn store_key(subject_id: &str, space_id: &str, wrapped: Vec<u8>) -> Guard {
    Guard::exactly_one(
        "INSERT INTO subject_keys (subject_id, space_id, wrapped_key) VALUES ($1, $2, $3)
         ON CONFLICT (subject_id) DO NOTHING",
        vec![Box::new(subject_id.to_owned()), Box::new(space_id.to_owned()), Box::new(wrapped.clone())],
        AppendError::Conflict { code: Code::IdentifierConflict, message: "the record id is already taken".to_owned() },
    )
    .with_set(
        "INSERT INTO subject_keys (subject_id, space_id, wrapped_key)
         SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[]) ON CONFLICT (subject_id) DO NOTHING",
        vec![
            SetValue::Text(Some(subject_id.to_owned())),
            SetValue::Text(Some(space_id.to_owned())),
            SetValue::Bytes(wrapped),
        ],
    )
}
