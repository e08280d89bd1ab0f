//! An import as `GET /imports/{importId}` and the intake's answers show it: its settings, its
//! status (`receiving` until completed, then `processing` until every part's rows have
//! results, then `completed`), its parts and its rows counted by result.

use deadpool_postgres::GenericClient;
use platform::time::format_millis;
use serde_json::{Value, json};

/// The columns of an import's document: its row and its parts' sums (`$1` the space).
const COLUMNS: &str = "SELECT i.schema_id, i.settings, i.created_at_ms, i.parts_total, i.closed_at_ms,
        count(p.part), count(p.part) FILTER (WHERE p.body IS NULL),
        COALESCE(sum(p.rows), 0)::bigint, COALESCE(sum(p.created), 0)::bigint,
        COALESCE(sum(p.updated), 0)::bigint, COALESCE(sum(p.unchanged), 0)::bigint,
        COALESCE(sum(p.failed), 0)::bigint, max(p.done_at_ms), i.import_id
     FROM imports i LEFT JOIN import_parts p ON p.space_id = i.space_id AND p.import_id = i.import_id
     WHERE i.space_id = $1";

/// The import's document, or `None` when the space has no such import.
pub async fn document(
    client: &impl GenericClient,
    space_id: &str,
    import_id: &str,
) -> Result<Option<Value>, tokio_postgres::Error> {
    let statement =
        client.prepare_cached(&format!("{COLUMNS} AND i.import_id = $2 GROUP BY i.space_id, i.import_id")).await?;
    Ok(client.query_opt(&statement, &[&space_id, &import_id]).await?.map(|row| from_row(&row)))
}

/// A page of the space's imports, newest first (by creation, then id), after `after` (the
/// last one of the previous page): at most `limit`, and whether more follow.
pub async fn page(
    client: &impl GenericClient,
    space_id: &str,
    after: Option<(i64, &str)>,
    limit: i64,
) -> Result<(Vec<Value>, Option<String>), tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!(
            "{COLUMNS} AND ($2::bigint IS NULL OR (i.created_at_ms, i.import_id) < ($2, $3))
             GROUP BY i.space_id, i.import_id ORDER BY i.created_at_ms DESC, i.import_id DESC LIMIT $4"
        ))
        .await?;
    let (at, id) = (after.map(|(at, _)| at), after.map_or("", |(_, id)| id));
    let rows = client.query(&statement, &[&space_id, &at, &id, &(limit + 1)]).await?;
    let more = rows.len() > usize::try_from(limit).unwrap_or(usize::MAX);
    let rows = &rows[..rows.len().min(usize::try_from(limit).unwrap_or(usize::MAX))];
    let next =
        more.then(|| rows.last().map(|row| platform::cursor::encode(row.get(2), row.get::<_, &str>(13)))).flatten();
    Ok((rows.iter().map(from_row).collect(), next))
}

fn from_row(row: &tokio_postgres::Row) -> Value {
    let import_id: String = row.get(13);
    let settings: Value = row.get(1);
    let (total, closed_at): (Option<i32>, Option<i64>) = (row.get(3), row.get(4));
    let (received, done): (i64, i64) = (row.get(5), row.get(6));
    let counts: [i64; 5] = [row.get(7), row.get(8), row.get(9), row.get(10), row.get(11)];
    let last_done: Option<i64> = row.get(12);
    let completed = total.is_some() && received == done;
    let status = match (total, completed) {
        (None, _) => "receiving",
        (Some(_), false) => "processing",
        (Some(_), true) => "completed",
    };
    let completed_at = completed.then(|| closed_at.max(last_done)).flatten().map(format_millis);
    let [rows, created, updated, unchanged, failed] = counts;
    json!({
        "id": import_id,
        "schemaId": row.get::<_, String>(0),
        "format": settings["format"],
        "fileName": settings["fileName"],
        "consent": settings["consent"],
        "columns": settings["columns"],
        "encoding": settings.get("encoding").and_then(Value::as_str).unwrap_or("utf-8"),
        "delimiter": settings["delimiter"],
        "status": status,
        "createdAt": format_millis(row.get(2)),
        "completedAt": completed_at,
        "parts": {"received": received, "done": done, "total": total},
        "rows": {
            "total": rows,
            "pending": rows - created - updated - unchanged - failed,
            "created": created,
            "updated": updated,
            "unchanged": unchanged,
            "failed": failed,
        },
    })
}
