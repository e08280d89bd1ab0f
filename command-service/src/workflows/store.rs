//! What workflow commands read (the definition from the catalog, the pause state from the
//! workflow's stream) and the guards their appends carry (the engine's run row, the pause
//! control, waking parked runs).

use deadpool_postgres::GenericClient;
use domain::workflows::{WORKFLOW, WorkflowDef};
use platform::error::Code;
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

/// Whether the engine's pause control of the workflow says it is paused.
pub(crate) async fn paused(client: &impl GenericClient, workflow_id: &str) -> anyhow::Result<bool> {
    let statement = client.prepare_cached("SELECT paused FROM workflow_controls WHERE workflow_id = $1").await?;
    Ok(client.query_opt(&statement, &[&workflow_id]).await?.is_some_and(|row| row.get(0)))
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
    /// Where the run's first transition, made with the request, left it; `None`: requested,
    /// not started, due at once.
    pub first: Option<FirstState>,
}

/// A run's row after its first transition (the engine's decision, made at the trigger).
pub(crate) struct FirstState {
    pub status: &'static str,
    pub step_id: Option<String>,
    pub step_count: i32,
    /// The run stream's version after the request and the transition.
    pub version: i64,
    /// When the run is due next (`None`: finished).
    pub due_ms: Option<i64>,
    pub in_flight: Option<Value>,
    pub waiting_schema: Option<String>,
    /// A `wait_for_event` began: only events after this append count.
    pub new_wait: bool,
    pub passes: Value,
    pub outputs: Option<Vec<u8>>,
    pub finished: bool,
}

/// The engine's row of a new run (with a set form, so a batch of triggers inserts its rows in
/// one statement): `waiting` and due at once at version 1 of its stream, or where its first
/// transition left it. A run requested on a revision that a later publish moved runs from
/// (the trigger read a catalog that had not caught up) is marked to move too, and is due at
/// once unless it ended. A first transition is only written while the workflow is not paused
/// (the engine parks a paused workflow's runs before their first step): otherwise the row is
/// not inserted, and the trigger decides again knowing the pause.
pub(crate) fn insert_run(run: NewRun<'_>) -> Guard {
    let decided = run.first.is_some();
    let first = run.first.unwrap_or(FirstState {
        status: "waiting",
        step_id: None,
        step_count: 0,
        version: 1,
        due_ms: Some(run.requested_at_ms),
        in_flight: None,
        waiting_schema: None,
        new_wait: false,
        passes: Value::Object(serde_json::Map::new()),
        outputs: None,
        finished: false,
    });
    let row = vec![
        SetValue::Text(Some(run.run_id.to_owned())),
        SetValue::Text(Some(run.workflow_id.to_owned())),
        SetValue::Text(Some(run.space_id.to_owned())),
        SetValue::BigInt(run.revision),
        SetValue::Text(run.contact_id.map(str::to_owned)),
        SetValue::Text(Some(first.status.to_owned())),
        SetValue::Text(first.step_id.clone()),
        SetValue::Int(first.step_count),
        SetValue::BigInt(first.version),
        SetValue::BigInt(first.due_ms.unwrap_or(-1)),
        SetValue::Json(first.in_flight.clone().unwrap_or(Value::Null)),
        SetValue::Text(first.waiting_schema.clone()),
        SetValue::Int(i32::from(first.new_wait)),
        SetValue::Json(first.passes.clone()),
        SetValue::Bytes(first.outputs.clone().unwrap_or_default()),
        SetValue::Int(i32::from(first.finished)),
        SetValue::Bytes(run.input.clone()),
        SetValue::BigInt(run.requested_at_ms),
        SetValue::Int(i32::from(decided)),
    ];
    Guard::exactly_one(
        "INSERT INTO workflow_runs (run_id, workflow_id, space_id, revision, contact_id, status, step_id, step_count,
             version, due_at, in_flight, waiting_schema, waiting_after, passes, outputs, finished_at, input,
             requested_at, migrate_to)
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9,
                CASE WHEN m.moved_to IS NOT NULL AND NOT $16 THEN clock_timestamp()
                     WHEN $10::bigint IS NULL THEN NULL ELSE to_timestamp($10::bigint / 1000.0) END,
                $11, $12, CASE WHEN $13 THEN (SELECT position FROM log_head) END, $14, $15,
                CASE WHEN $16 THEN clock_timestamp() END, $17, to_timestamp($18::bigint / 1000.0), m.moved_to
         FROM (SELECT (SELECT c.moved_to FROM workflow_controls c
                       WHERE c.workflow_id = $2 AND c.moved_to > $4::bigint) AS moved_to) m
         WHERE NOT $19
            OR NOT EXISTS (SELECT 1 FROM workflow_controls c WHERE c.workflow_id = $2 AND c.paused FOR SHARE)",
        vec![
            Box::new(run.run_id.to_owned()),
            Box::new(run.workflow_id.to_owned()),
            Box::new(run.space_id.to_owned()),
            Box::new(run.revision),
            Box::new(run.contact_id.map(str::to_owned)),
            Box::new(first.status),
            Box::new(first.step_id),
            Box::new(first.step_count),
            Box::new(first.version),
            Box::new(first.due_ms),
            Box::new(first.in_flight),
            Box::new(first.waiting_schema),
            Box::new(first.new_wait),
            Box::new(first.passes),
            Box::new(first.outputs),
            Box::new(first.finished),
            Box::new(run.input),
            Box::new(run.requested_at_ms),
            Box::new(decided),
        ],
        AppendError::Conflict {
            code: Code::StreamMoved,
            message: "the workflow was paused while the run's first steps were decided".to_owned(),
        },
    )
    .with_set(
        "INSERT INTO workflow_runs (run_id, workflow_id, space_id, revision, contact_id, status, step_id, step_count,
             version, due_at, in_flight, waiting_schema, waiting_after, passes, outputs, finished_at, input,
             requested_at, migrate_to)
         SELECT u.run_id, u.workflow_id, u.space_id, u.revision, u.contact_id, u.status, u.step_id, u.step_count,
                u.version,
                CASE WHEN m.moved_to IS NOT NULL AND u.finished = 0 THEN clock_timestamp()
                     WHEN u.due_ms < 0 THEN NULL ELSE to_timestamp(u.due_ms::bigint / 1000.0) END,
                NULLIF(u.in_flight, 'null'::jsonb), u.waiting_schema,
                CASE WHEN u.new_wait = 1 THEN (SELECT position FROM log_head) END, u.passes,
                NULLIF(u.outputs, ''::bytea), CASE WHEN u.finished = 1 THEN clock_timestamp() END, u.input,
                to_timestamp(u.requested_at_ms::bigint / 1000.0), m.moved_to
         FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[],
                     $8::int4[], $9::bigint[], $10::bigint[], $11::jsonb[], $12::text[], $13::int4[], $14::jsonb[],
                     $15::bytea[], $16::int4[], $17::bytea[], $18::bigint[], $19::int4[])
             AS u(run_id, workflow_id, space_id, revision, contact_id, status, step_id, step_count, version, due_ms,
                  in_flight, waiting_schema, new_wait, passes, outputs, finished, input, requested_at_ms, decided)
         CROSS JOIN LATERAL (SELECT (SELECT c.moved_to FROM workflow_controls c
                                     WHERE c.workflow_id = u.workflow_id AND c.moved_to > u.revision) AS moved_to) m
         WHERE u.decided = 0
            OR NOT EXISTS (SELECT 1 FROM workflow_controls c WHERE c.workflow_id = u.workflow_id AND c.paused FOR SHARE)",
        row,
    )
}
