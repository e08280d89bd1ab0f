//! Record state and identity owners for decisions.

use deadpool_postgres::GenericClient;
pub use domain::records::{Loaded, load_records, stream_id};
use tokio_postgres::types::ToSql;

use platform::error::Code;
use platform::log::{AppendError, Guard, SetValue};

use crate::records::decide::{Identity, Owners};

/// Who holds each of `identities` (`(key, value)`) in the schema.
pub(crate) async fn identity_owners(
    client: &impl GenericClient,
    space_id: &str,
    schema_id: &str,
    identities: &[(&str, String)],
) -> Result<Owners, tokio_postgres::Error> {
    if identities.is_empty() {
        return Ok(Owners::new());
    }
    let kinds: Vec<&str> = identities.iter().map(|(kind, _)| *kind).collect();
    let values: Vec<&str> = identities.iter().map(|(_, value)| value.as_str()).collect();
    // One primary-key probe per identity: the fence (OFFSET 0) keeps the planner from
    // probing on (space, schema) alone and filtering, as it does while the table has no
    // statistics.
    let statement = client
        .prepare_cached(
            "SELECT i.kind, i.value, i.record_id FROM unnest($3::text[], $4::text[]) AS q(kind, value)
             CROSS JOIN LATERAL (SELECT * FROM record_identities i WHERE i.space_id = $1 AND i.schema_id = $2
                                 AND i.kind = q.kind AND i.value = q.value OFFSET 0) i",
        )
        .await?;
    let rows = client.query(&statement, &[&space_id, &schema_id, &kinds, &values]).await?;
    Ok(rows.into_iter().map(|row| ((row.get(0), row.get(1)), row.get(2))).collect())
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
fn identity_params(
    space_id: &str,
    schema_id: &str,
    record_id: &str,
    identity: &Identity,
) -> Vec<Box<dyn ToSql + Sync + Send>> {
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

/// The guards of a deletion request: the record's identities are free at once, its recorded
/// idempotent responses leave with the request, and exactly one operation starts.
pub(crate) fn deletion_guards(operation_id: &str, record_id: &str, space_id: &str, schema_id: &str) -> Vec<Guard> {
    let (operation_id, record_id, space_id, schema_id) =
        (operation_id.to_owned(), record_id.to_owned(), space_id.to_owned(), schema_id.to_owned());
    vec![
        // The identities are free again at once; their values leave the write side.
        Guard::unique(
            "DELETE FROM record_identities WHERE record_id = $1",
            vec![Box::new(record_id.clone())],
            AppendError::Conflict { code: Code::RecordDeletionPending, message: String::new() },
        ),
        // A replay of the record's create or upsert is a read of its personal data: it
        // leaves with the request, in the same transaction.
        Guard::unique(
            domain::records::BLANK_IDEMPOTENT_RESPONSES,
            vec![Box::new(record_id.clone())],
            AppendError::Conflict { code: Code::RecordDeletionPending, message: String::new() },
        ),
        Guard::exactly_one(
            "INSERT INTO record_deletions (operation_id, record_id, space_id, schema_id, state)
             VALUES ($1, $2, $3, $4, 'pending') ON CONFLICT (record_id) DO NOTHING",
            vec![Box::new(operation_id), Box::new(record_id.clone()), Box::new(space_id), Box::new(schema_id)],
            AppendError::Conflict {
                code: Code::RecordDeletionPending,
                message: format!("record {record_id:?} is already being deleted"),
            },
        ),
    ]
}

/// The guard that stores a new subject's wrapped key in the transaction of its first event,
/// so the key and the data it protects commit together. If the subject already has a key (a
/// concurrent first write won), the command fails as a lost race and is decided again.
pub(crate) fn store_key(subject_id: &str, space_id: &str, wrapped: Vec<u8>) -> Guard {
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
