//! What workflow commands read (the definition from the catalog, the pause state from the
//! workflow's stream) and the guards their appends carry (the engine's run row, the pause
//! control, waking parked runs).

use deadpool_postgres::GenericClient;
use domain::workflows::{WORKFLOW, WorkflowDef};
use platform::events::LogEvent;
use platform::log::{AppendError, Guard, SetValue};
use serde_json::Value;

/// A workflow of the space as the catalog holds it.
pub struct Found {
    pub workflow_id: String,
    pub revision: i64,
    pub definition: WorkflowDef,
}

fn found(row: Option<tokio_postgres::Row>) -> anyhow::Result<Option<Found>> {
    let Some(row) = row else { return Ok(None) };
    let definition: WorkflowDef = serde_json::from_value(row.get::<_, Value>(2))?;
    Ok(Some(Found { workflow_id: row.get(0), revision: row.get(1), definition }))
}

/// The workflow of the space whose entry has `reference_id`, from catalog version `catalog`,
/// with the catalog's revision read in the same statement.
pub(crate) async fn by_reference(
    client: &impl GenericClient,
    catalog: &str,
    space_id: &str,
    reference_id: &str,
) -> anyhow::Result<(i64, Option<Found>)> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT r.resource_id, r.revision, r.definition,
                    COALESCE((SELECT revision FROM public.projections WHERE name = 'catalog' AND status = 'live'), 0)
             FROM (VALUES (1)) AS one
             LEFT JOIN {catalog}.resources r
               ON r.kind = $1 AND r.space_id = $2 AND r.definition ->> 'referenceId' = $3"
        ))
        .await?;
    let row = client.query_one(&statement, &[&WORKFLOW, &space_id, &reference_id]).await?;
    let revision: i64 = row.get(3);
    let Some(workflow_id) = row.get::<_, Option<String>>(0) else { return Ok((revision, None)) };
    let definition: WorkflowDef = serde_json::from_value(row.get::<_, Value>(2))?;
    Ok((revision, Some(Found { workflow_id, revision: row.get(1), definition })))
}

/// Workflows kept in process by (space, reference id), so a trigger reads no catalog
/// statement (see [`domain::catalog::Kept`]).
pub type Kept = domain::catalog::Kept<Found>;

/// The workflow `workflow_id` of the space, from catalog version `catalog`.
pub async fn by_id(
    client: &impl GenericClient,
    catalog: &str,
    space_id: &str,
    workflow_id: &str,
) -> anyhow::Result<Option<Found>> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT resource_id, revision, definition FROM {catalog}.resources
             WHERE kind = $1 AND space_id = $2 AND resource_id = $3"
        ))
        .await?;
    found(client.query_opt(&statement, &[&WORKFLOW, &space_id, &workflow_id]).await?)
}

/// The workflow stream's version and whether it is paused, from the log.
pub(crate) async fn pause_state(client: &impl GenericClient, workflow_id: &str) -> anyhow::Result<(i64, bool)> {
    let events = platform::log::read_streams(client, &[domain::workflows::stream_id(workflow_id)]).await?;
    let mut state = (0, false);
    for stored in events {
        state.0 = stored.stream_version;
        match stored.decode()? {
            LogEvent::WorkflowPaused(_) => state.1 = true,
            LogEvent::WorkflowUnpaused(_) => state.1 = false,
            _ => {}
        }
    }
    Ok(state)
}

/// The engine's pause control of the workflow, set in the append that pauses or unpauses it.
pub fn control(workflow_id: &str, space_id: &str, paused: bool) -> Guard {
    Guard::exactly_one(
        "INSERT INTO workflow_controls (workflow_id, space_id, paused) VALUES ($1, $2, $3)
         ON CONFLICT (workflow_id) DO UPDATE SET paused = EXCLUDED.paused",
        vec![Box::new(workflow_id.to_owned()), Box::new(space_id.to_owned()), Box::new(paused)],
        AppendError::Failed("could not set the workflow's pause control".to_owned()),
    )
}

/// Wakes the runs a pause parked: due at once, so a wait that elapsed meanwhile completes.
pub(crate) fn wake_parked(workflow_id: &str) -> Guard {
    Guard::unique(
        "UPDATE workflow_runs SET due_at = clock_timestamp() WHERE workflow_id = $1 AND paused",
        vec![Box::new(workflow_id.to_owned())],
        AppendError::Failed("could not wake the parked runs".to_owned()),
    )
}

/// What a new run's row starts as.
pub(crate) struct NewRun<'a> {
    pub run_id: &'a str,
    pub workflow_id: &'a str,
    pub space_id: &'a str,
    pub revision: i64,
    pub contact_id: Option<&'a str>,
    /// The input's seal, encoded.
    pub input: Vec<u8>,
    pub requested_at_ms: i64,
}

/// The engine's row of a new run, `waiting` and due at once, at version 1 of its stream (with
/// a set form, so a batch of triggers inserts its rows in one statement). A run requested on a
/// revision that a later publish moved runs from (the trigger read a catalog that had not
/// caught up) is marked to move too.
pub(crate) fn insert_run(run: NewRun<'_>) -> Guard {
    let row = vec![
        SetValue::Text(Some(run.run_id.to_owned())),
        SetValue::Text(Some(run.workflow_id.to_owned())),
        SetValue::Text(Some(run.space_id.to_owned())),
        SetValue::BigInt(run.revision),
        SetValue::Text(run.contact_id.map(str::to_owned)),
        SetValue::Bytes(run.input.clone()),
        SetValue::BigInt(run.requested_at_ms),
    ];
    Guard::exactly_one(
        "INSERT INTO workflow_runs (run_id, workflow_id, space_id, revision, contact_id, status, version, due_at,
             input, requested_at, migrate_to)
         VALUES ($1, $2, $3, $4, $5, 'waiting', 1, clock_timestamp(), $6, to_timestamp($7::bigint / 1000.0),
             (SELECT c.moved_to FROM workflow_controls c WHERE c.workflow_id = $2 AND c.moved_to > $4::bigint))",
        vec![
            Box::new(run.run_id.to_owned()),
            Box::new(run.workflow_id.to_owned()),
            Box::new(run.space_id.to_owned()),
            Box::new(run.revision),
            Box::new(run.contact_id.map(str::to_owned)),
            Box::new(run.input),
            Box::new(run.requested_at_ms),
        ],
        AppendError::Failed("could not record the run".to_owned()),
    )
    .with_set(
        "INSERT INTO workflow_runs (run_id, workflow_id, space_id, revision, contact_id, status, version, due_at,
             input, requested_at, migrate_to)
         SELECT u.run_id, u.workflow_id, u.space_id, u.revision, u.contact_id, 'waiting', 1, clock_timestamp(),
                u.input, to_timestamp(u.requested_at_ms::bigint / 1000.0),
                (SELECT c.moved_to FROM workflow_controls c WHERE c.workflow_id = u.workflow_id AND c.moved_to > u.revision)
         FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::bytea[], $7::bigint[])
             AS u(run_id, workflow_id, space_id, revision, contact_id, input, requested_at_ms)",
        row,
    )
}
