//! A suppression's current state for decisions: its addition, and whether it was removed.

use deadpool_postgres::GenericClient;
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{AppendError, Guard};
use platform::proto;

use super::NewSuppression;

pub fn stream_id(suppression_id: &str) -> String {
    format!("suppression/{suppression_id}")
}

/// The stream of a suppression authored in the workspace file.
pub(crate) fn authored_stream_id(suppression_id: &str) -> String {
    format!("authoring/suppression/{suppression_id}")
}

/// `(stream version, the addition)` of a live suppression; `None` if unknown or removed.
pub async fn load(
    client: &impl GenericClient,
    suppression_id: &str,
) -> anyhow::Result<Option<(i64, proto::SuppressionAdded)>> {
    let statement = client
        .prepare_cached(
            "SELECT stream_version, event_type, payload FROM events WHERE stream_id = ANY($1) ORDER BY stream_version",
        )
        .await?;
    let streams = vec![stream_id(suppression_id), authored_stream_id(suppression_id)];
    let rows = client.query(&statement, &[&streams]).await?;
    let mut current = None;
    for row in rows {
        match LogEvent::decode(row.get(1), row.get(2))? {
            LogEvent::SuppressionAdded(added) => current = Some((row.get(0), added)),
            LogEvent::SuppressionRemoved(_) => current = None,
            _ => {}
        }
    }
    Ok(current)
}

/// [`load`] for many suppressions in one statement: the live ones by id.
pub(crate) async fn load_many(
    client: &impl GenericClient,
    suppression_ids: &[String],
) -> anyhow::Result<std::collections::HashMap<String, (i64, proto::SuppressionAdded)>> {
    let mut current = std::collections::HashMap::new();
    if suppression_ids.is_empty() {
        return Ok(current);
    }
    let streams: Vec<String> = suppression_ids.iter().flat_map(|id| [stream_id(id), authored_stream_id(id)]).collect();
    let statement = client
        .prepare_cached(
            "SELECT stream_version, event_type, payload FROM events WHERE stream_id = ANY($1)
             ORDER BY stream_id, stream_version",
        )
        .await?;
    for row in client.query(&statement, &[&streams]).await? {
        match LogEvent::decode(row.get(1), row.get(2))? {
            LogEvent::SuppressionAdded(added) => {
                current.insert(added.suppression_id.clone(), (row.get(0), added));
            }
            LogEvent::SuppressionRemoved(removed) => {
                current.remove(&removed.suppression_id);
            }
            _ => {}
        }
    }
    Ok(current)
}

/// The uniqueness claim of a new suppression: one per (space or global, identifier, reason).
pub(crate) fn key_guard(scope: &str, new: &NewSuppression, suppression_id: &str) -> Guard {
    Guard::unique(
        "INSERT INTO suppression_keys (scope, identifier, reason, suppression_id) VALUES ($1, $2, $3, $4)",
        vec![
            Box::new(scope.to_owned()),
            Box::new(new.identifier.clone()),
            Box::new(new.reason.clone()),
            Box::new(suppression_id.to_owned()),
        ],
        AppendError::Conflict {
            code: Code::SuppressionAlreadyExists,
            message: format!("{} is already suppressed with reason {}", new.identifier, new.reason),
        },
    )
}

/// The claim of a suppression authored in the workspace file: applying the file again finds
/// it taken and changes nothing.
pub(crate) fn authored_key_guard(scope: &str, new: &NewSuppression, suppression_id: &str) -> Guard {
    Guard::unique(
        "INSERT INTO suppression_keys (scope, identifier, reason, suppression_id) VALUES ($1, $2, $3, $4)
         ON CONFLICT DO NOTHING",
        vec![
            Box::new(scope.to_owned()),
            Box::new(new.identifier.clone()),
            Box::new(new.reason.clone()),
            Box::new(suppression_id.to_owned()),
        ],
        AppendError::Conflict { code: Code::SuppressionAlreadyExists, message: String::new() },
    )
}

/// Releases a removed suppression's claim; refused when it was removed meanwhile.
pub(crate) fn removal_guard(suppression_id: &str) -> Guard {
    Guard::unique(
        "DELETE FROM suppression_keys WHERE suppression_id = $1",
        vec![Box::new(suppression_id.to_owned())],
        AppendError::Conflict { code: Code::SuppressionNotFound, message: String::new() },
    )
}

/// Which of `wanted` (identifier, reason) already exist in `scope`.
pub(crate) async fn existing_keys(
    client: &impl GenericClient,
    scope: &str,
    wanted: &[&NewSuppression],
) -> Result<std::collections::HashSet<(String, String)>, tokio_postgres::Error> {
    let identifiers: Vec<&str> = wanted.iter().map(|new| new.identifier.as_str()).collect();
    let reasons: Vec<&str> = wanted.iter().map(|new| new.reason.as_str()).collect();
    let rows = client
        .query(
            "SELECT k.identifier, k.reason FROM suppression_keys k
             JOIN unnest($2::text[], $3::text[]) AS w(identifier, reason)
               ON w.identifier = k.identifier AND w.reason = k.reason
             WHERE k.scope = $1",
            &[&scope, &identifiers, &reasons],
        )
        .await?;
    Ok(rows.into_iter().map(|row| (row.get(0), row.get(1))).collect())
}
