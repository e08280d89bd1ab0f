//! Record state and identity owners for decisions.

pub use domain::records::write::{claim, release, store_key};
pub use domain::records::{Loaded, stream_id};
pub use reads::records::{identity_owners, load_records};

use platform::error::Code;
use platform::log::{AppendError, Guard};

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
        // An import's result names the key the row was matched by: its value leaves too.
        Guard::unique(
            "UPDATE import_rows SET key_value = NULL WHERE record_id = $1",
            vec![Box::new(record_id.clone())],
            AppendError::Conflict { code: Code::RecordDeletionPending, message: String::new() },
        ),
        // The eraser is told in the same transaction (the channel is
        // `domain::records::DELETIONS_CHANNEL`): a notification is delivered on commit or not
        // at all. Deletions are rare, so the commit's notification lock costs the log nothing.
        Guard::exactly_one(
            "WITH requested AS (
                 INSERT INTO record_deletions (operation_id, record_id, space_id, schema_id, state)
                 VALUES ($1, $2, $3, $4, 'pending') ON CONFLICT (record_id) DO NOTHING RETURNING operation_id)
             SELECT pg_notify('record_deletion_requested', operation_id) FROM requested",
            vec![Box::new(operation_id), Box::new(record_id.clone()), Box::new(space_id), Box::new(schema_id)],
            AppendError::Conflict {
                code: Code::RecordDeletionPending,
                message: format!("record {record_id:?} is already being deleted"),
            },
        ),
    ]
}
