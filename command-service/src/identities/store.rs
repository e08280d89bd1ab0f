//! What an identity change reads and the write-side claims it appends with.

use deadpool_postgres::GenericClient;
use domain::records::Loaded;
use platform::error::Code;
use platform::log::{AppendError, Guard};
use serde_json::Value;

use super::{Alias, Change, Contact, Recorded};
use crate::events::store::{load_subjects, subjects_guard};

/// Labels of the guards' refusals.
pub(crate) const OPERATION_TAKEN: Code = Code::OperationTaken;
pub(crate) const REVISION_MOVED: Code = Code::AliasRevisionConflict;
pub(crate) const CAPACITY: Code = Code::IdentityCapacityExhausted;

/// The contact schemas (ids) of the space's enabled contact tracks with `source_id`, read
/// from catalog version schema `catalog`.
pub(crate) async fn track_schemas(
    client: &impl GenericClient,
    catalog: &str,
    space_id: &str,
    source_id: &str,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT s.schema_id FROM {catalog}.resources r
             JOIN {catalog}.schemas s ON s.space_id = r.space_id
                 AND (s.schema_id = r.definition ->> 'subjectSchema' OR s.slug = r.definition ->> 'subjectSchema')
             WHERE r.kind = 'contact_track' AND r.space_id = $1 AND r.definition ->> 'sourceId' = $2
               AND COALESCE(r.definition ->> 'enabled', 'true') <> 'false' AND s.schema_type = 'contact'"
        ))
        .await?;
    let rows = client.query(&statement, &[&space_id, &source_id]).await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// The alias as the write side holds it (revision 0 when it does not exist yet).
pub(crate) async fn load_alias(
    client: &impl GenericClient,
    space_id: &str,
    digest: &str,
) -> Result<Alias, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(
            "SELECT contact_id, revision, erased FROM identity_aliases WHERE space_id = $1 AND alias_digest = $2",
        )
        .await?;
    Ok(client
        .query_opt(&statement, &[&space_id, &digest])
        .await?
        .map(|row| Alias { contact_id: row.get(0), revision: row.get(1), erased: row.get(2) })
        .unwrap_or_default())
}

/// The recorded result of an operation already applied, if any.
pub(crate) async fn load_operation(
    client: &impl GenericClient,
    space_id: &str,
    operation_id: &str,
) -> Result<Option<Recorded>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached("SELECT body_digest, result FROM identity_operations WHERE space_id = $1 AND operation_id = $2")
        .await?;
    Ok(client
        .query_opt(&statement, &[&space_id, &operation_id])
        .await?
        .map(|row| Recorded { body_digest: row.get(0), result: row.get(1) }))
}

/// What the write side knows of `contact_id`.
pub(crate) async fn load_contact(client: &impl GenericClient, contact_id: &str) -> anyhow::Result<Contact> {
    let subjects = load_subjects(client, &[contact_id.to_owned()]).await?;
    Ok(match subjects.get(contact_id) {
        Some(Loaded::Live { state, .. }) => {
            Contact::Live { space_id: state.space_id.clone(), schema_id: state.schema_id.clone() }
        }
        Some(Loaded::Deleting { .. }) => Contact::Deleting,
        Some(Loaded::Deleted { .. }) | None => Contact::Missing,
    })
}

/// The write-side claims of one change: the operation (with its result), the alias row at
/// `revision`, the capacity counts and (when binding) that the contact's deletion has not
/// started.
pub fn guards(
    capacity: platform::settings::IdentityCapacity,
    space_id: &str,
    change: &Change,
    alias: &str,
    body_digest: &str,
    result: &Value,
    revision: i64,
) -> Vec<Guard> {
    let new_alias = i64::from(revision == 0);
    let mut guards = vec![
        Guard::unique(
            "INSERT INTO identity_operations (space_id, operation_id, body_digest, result) VALUES ($1, $2, $3, $4)",
            vec![
                Box::new(space_id.to_owned()),
                Box::new(change.operation_id.clone()),
                Box::new(body_digest.to_owned()),
                Box::new(result.clone()),
            ],
            AppendError::Conflict { code: OPERATION_TAKEN, message: String::new() },
        ),
        Guard::exactly_one(
            "INSERT INTO identity_aliases (space_id, alias_digest, contact_id, revision)
             VALUES ($1, $2, $3, $4::bigint + 1)
             ON CONFLICT (space_id, alias_digest) DO UPDATE SET contact_id = EXCLUDED.contact_id,
                 revision = EXCLUDED.revision
             WHERE identity_aliases.revision = $4::bigint AND NOT identity_aliases.erased",
            vec![
                Box::new(space_id.to_owned()),
                Box::new(alias.to_owned()),
                Box::new(change.contact_id.clone()),
                Box::new(revision),
            ],
            AppendError::Conflict { code: REVISION_MOVED, message: String::new() },
        ),
        Guard::exactly_one(
            "INSERT INTO identity_capacity AS c (space_id, aliases, changes)
             SELECT $1::text, $2::bigint, 1 WHERE $2::bigint <= $3::bigint AND 1 <= $4::bigint
             ON CONFLICT (space_id) DO UPDATE SET aliases = c.aliases + $2::bigint, changes = c.changes + 1
             WHERE c.aliases + $2::bigint <= $3::bigint AND c.changes + 1 <= $4::bigint",
            vec![
                Box::new(space_id.to_owned()),
                Box::new(new_alias),
                Box::new(capacity.aliases),
                Box::new(capacity.changes),
            ],
            AppendError::Conflict { code: CAPACITY, message: String::new() },
        ),
    ];
    if let Some(contact_id) = &change.contact_id {
        guards.push(subjects_guard(vec![contact_id.clone()]));
    }
    guards
}
