//! The import tables as the intake writes them, for the API's handlers and the operator's
//! `import` command alike: creating an import, storing a part, closing the import. A part is
//! stored under a `FOR SHARE` lock of its import's row and a completion takes it `FOR UPDATE`,
//! so no part lands after the import is closed.

use deadpool_postgres::GenericClient;
use domain::catalog::SchemaEntry;
use domain::imports::Settings;
use platform::error::ApiError;
use sha2::{Digest, Sha256};

use super::decide::Refusal;

/// A database failure, or a refusal.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failed {
    #[error(transparent)]
    Database(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Refusal(#[from] Refusal),
}

/// Creates the import; `true` when it is new (or started again: it existed with other
/// settings and had written no row, so its parts and results were dropped), `false` when it
/// exists with these settings.
pub(crate) async fn create(
    client: &mut deadpool_postgres::Client,
    (space_id, import_id): (&str, &str),
    schema: &SchemaEntry,
    settings: &Settings,
    actor_key_id: Option<&str>,
) -> Result<bool, Failed> {
    let document = settings.document(&schema.schema_id);
    let digest = Sha256::digest(document.to_string().as_bytes()).to_vec();
    let inserted = client
        .execute(
            "INSERT INTO imports (space_id, import_id, schema_id, schema_type, format, settings, settings_digest,
                                  actor_key_id, created_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
            &[
                &space_id,
                &import_id,
                &schema.schema_id,
                &schema.schema_type,
                &settings.format.as_str(),
                &document,
                &digest,
                &actor_key_id,
                &platform::time::now_millis(),
            ],
        )
        .await?;
    if inserted == 1 {
        return Ok(true);
    }
    let stored: Option<Vec<u8>> = client
        .query_opt(
            "SELECT settings_digest FROM imports WHERE space_id = $1 AND import_id = $2",
            &[&space_id, &import_id],
        )
        .await?
        .map(|row| row.get(0));
    match stored {
        Some(stored) if stored == digest => Ok(false),
        Some(_) => start_again(client, (space_id, import_id), schema, (&document, &digest), actor_key_id).await,
        None => Err(Refusal::NotFound(import_id.to_owned()).into()),
    }
}

/// Replaces the settings of an import that wrote no row (every row failed, or none was
/// decided yet), dropping its parts and row results: the caller fixes its settings and sends
/// the file again under the same id. Taken under the worker's lock, so no part is decided
/// meanwhile; an import that wrote a row keeps its settings (409).
async fn start_again(
    client: &mut deadpool_postgres::Client,
    (space_id, import_id): (&str, &str),
    schema: &SchemaEntry,
    (document, digest): (&serde_json::Value, &Vec<u8>),
    actor_key_id: Option<&str>,
) -> Result<bool, Failed> {
    let transaction = under_worker_lock(client).await?;
    let written: bool = transaction
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM import_parts WHERE space_id = $1 AND import_id = $2
                            AND (created > 0 OR updated > 0))
                 OR EXISTS (SELECT 1 FROM import_rows WHERE space_id = $1 AND import_id = $2
                            AND status IN ('created', 'updated'))",
            &[&space_id, &import_id],
        )
        .await?
        .get(0);
    if written {
        return Err(Refusal::OtherSettings(import_id.to_owned()).into());
    }
    drop_import(&transaction, (space_id, import_id), &["import_rows", "import_parts"]).await?;
    transaction
        .execute(
            "UPDATE imports SET schema_id = $3, schema_type = $4, format = $5, settings = $6, settings_digest = $7,
                    actor_key_id = $8, created_at_ms = $9, parts_total = NULL, closed_at_ms = NULL
             WHERE space_id = $1 AND import_id = $2",
            &[
                &space_id,
                &import_id,
                &schema.schema_id,
                &schema.schema_type,
                &document["format"].as_str(),
                document,
                digest,
                &actor_key_id,
                &platform::time::now_millis(),
            ],
        )
        .await?;
    transaction.commit().await?;
    Ok(true)
}

/// A transaction holding the `imports` worker's lock: no part is decided until it ends.
async fn under_worker_lock(
    client: &mut deadpool_postgres::Client,
) -> Result<deadpool_postgres::Transaction<'_>, tokio_postgres::Error> {
    let transaction = client.transaction().await?;
    transaction.execute("SELECT pg_advisory_xact_lock($1)", &[&domain::imports::WORKER_LOCK]).await?;
    Ok(transaction)
}

/// Deletes the import's rows of `tables` (its row results, its parts, itself), in that order.
async fn drop_import(
    transaction: &deadpool_postgres::Transaction<'_>,
    (space_id, import_id): (&str, &str),
    tables: &[&str],
) -> Result<(), tokio_postgres::Error> {
    for table in tables {
        transaction
            .execute(&format!("DELETE FROM {table} WHERE space_id = $1 AND import_id = $2"), &[&space_id, &import_id])
            .await?;
    }
    Ok(())
}

/// Drops an import that is not completed (abandoned): its parts, its row results and itself,
/// under the worker's lock, so no part of it is being decided. Records its rows already wrote
/// stay. `Err` 404 when unknown, 409 when completed (its results are kept until they expire).
pub(crate) async fn delete(
    client: &mut deadpool_postgres::Client,
    (space_id, import_id): (&str, &str),
) -> Result<(), Failed> {
    let transaction = under_worker_lock(client).await?;
    let Some(row) = transaction
        .query_opt(
            "SELECT i.parts_total IS NOT NULL AND NOT EXISTS (
                 SELECT 1 FROM import_parts p WHERE p.space_id = i.space_id AND p.import_id = i.import_id
                 AND p.body IS NOT NULL)
             FROM imports i WHERE i.space_id = $1 AND i.import_id = $2 FOR UPDATE",
            &[&space_id, &import_id],
        )
        .await?
    else {
        return Err(Refusal::NotFound(import_id.to_owned()).into());
    };
    if row.get::<_, bool>(0) {
        return Err(Refusal::Completed(import_id.to_owned()).into());
    }
    drop_import(&transaction, (space_id, import_id), &["import_rows", "import_parts", "imports"]).await?;
    transaction.commit().await?;
    Ok(())
}

/// The import's schema and settings.
pub(crate) async fn load(
    client: &impl GenericClient,
    space_id: &str,
    import_id: &str,
) -> Result<(String, Settings), ApiError> {
    let row = client
        .query_opt(
            "SELECT schema_id, settings FROM imports WHERE space_id = $1 AND import_id = $2",
            &[&space_id, &import_id],
        )
        .await?
        .ok_or_else(|| Refusal::NotFound(import_id.to_owned()))?;
    let settings = Settings::from_document(&row.get::<_, serde_json::Value>(1))
        .ok_or_else(|| ApiError::internal(&anyhow::anyhow!("import {import_id} has unreadable settings")))?;
    Ok((row.get(0), settings))
}

/// Stores part `part` holding `rows` rows; `Some(rows)` of the part stored before with the
/// same body, `None` when stored now.
pub(crate) async fn store_part(
    client: &mut deadpool_postgres::Client,
    (space_id, import_id): (&str, &str),
    part: i32,
    body: &[u8],
    rows: i32,
) -> Result<Option<i32>, Failed> {
    let digest = Sha256::digest(body).to_vec();
    let transaction = client.transaction().await?;
    // Held until the part is in: a completion waits for it, so no part lands after one.
    let closed: bool = transaction
        .query_opt(
            "SELECT parts_total IS NOT NULL FROM imports WHERE space_id = $1 AND import_id = $2 FOR SHARE",
            &[&space_id, &import_id],
        )
        .await?
        .ok_or_else(|| Refusal::NotFound(import_id.to_owned()))?
        .get(0);
    let existing = transaction
        .query_opt(
            "SELECT digest, rows FROM import_parts WHERE space_id = $1 AND import_id = $2 AND part = $3",
            &[&space_id, &import_id, &part],
        )
        .await?;
    let import_id = import_id.to_owned();
    match existing {
        Some(row) if row.get::<_, Vec<u8>>(0) == digest => return Ok(Some(row.get(1))),
        Some(_) => return Err(Refusal::OtherBody { import_id, part }.into()),
        None if closed => return Err(Refusal::Closed(import_id).into()),
        None => {}
    }
    // A concurrent upload of the same part loses here: it is told to retry, and its retry is
    // answered as a repeat when its body is the same.
    let inserted = transaction
        .execute(
            "INSERT INTO import_parts (space_id, import_id, part, body, digest, rows, received_at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
            &[&space_id, &import_id, &part, &body, &digest, &rows, &platform::time::now_millis()],
        )
        .await?;
    if inserted == 0 {
        return Err(Refusal::SentTwice { import_id, part }.into());
    }
    transaction.commit().await?;
    Ok(None)
}

/// Closes the import with `parts` parts, which must all have arrived; a repeat with the same
/// count changes nothing.
pub(crate) async fn close(
    client: &mut deadpool_postgres::Client,
    (space_id, import_id): (&str, &str),
    parts: i32,
) -> Result<(), Failed> {
    let transaction = client.transaction().await?;
    // Waits for parts being stored, and keeps new ones out until the import is closed.
    let total: Option<i32> = transaction
        .query_opt(
            "SELECT parts_total FROM imports WHERE space_id = $1 AND import_id = $2 FOR UPDATE",
            &[&space_id, &import_id],
        )
        .await?
        .ok_or_else(|| Refusal::NotFound(import_id.to_owned()))?
        .get(0);
    let row = transaction
        .query_one(
            "SELECT count(*), COALESCE(max(part), 0) FROM import_parts WHERE space_id = $1 AND import_id = $2",
            &[&space_id, &import_id],
        )
        .await?;
    let (received, highest): (i64, i32) = (row.get(0), row.get(1));
    let import_id = import_id.to_owned();
    match total {
        Some(total) if total == parts => return Ok(()),
        Some(total) => return Err(Refusal::CompletedWith { import_id, total }.into()),
        None if received != i64::from(parts) || highest != parts => {
            return Err(Refusal::PartsMissing { import_id, received, highest, parts }.into());
        }
        None => {}
    }
    transaction
        .execute(
            "UPDATE imports SET parts_total = $3, closed_at_ms = $4 WHERE space_id = $1 AND import_id = $2",
            &[&space_id, &import_id, &parts, &platform::time::now_millis()],
        )
        .await?;
    transaction.commit().await?;
    Ok(())
}

impl platform::refusal::Answered for Failed {}

/// An import write that failed: the database's answer, or the refusal.
impl platform::refusal::Refusal for Failed {
    fn code(&self) -> platform::error::Code {
        match self {
            Self::Database(_) => platform::error::Code::InternalError,
            Self::Refusal(refusal) => platform::refusal::Refusal::code(refusal),
        }
    }

    fn into_failure(self) -> Result<platform::refusal::Failure, Self> {
        match self {
            Self::Database(error) => Ok(platform::refusal::Failure::Database(error.into())),
            other => Err(other),
        }
    }
}
