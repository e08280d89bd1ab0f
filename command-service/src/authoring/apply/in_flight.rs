//! The runs in flight when an apply publishes a new revision of a workflow: counted by
//! revision and step from the engine's rows, checked against the new revision's `inFlight`
//! rule (`domain::workflows::check_in_flight`: a migration that leaves a step holding runs
//! without a place is refused, naming it), marked in the apply's own transaction when the rule
//! moves them (`migrate`, `exit`), and described for the person applying, whatever the rule.

use std::collections::BTreeMap;

use deadpool_postgres::Pool;
use domain::workflows::{Active, InFlightRule, WORKFLOW, WorkflowDef, check_in_flight};
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{AppendError, Guard};

use super::Plan;

/// The open runs of a workflow on revisions before `$2`, by revision and where they are: the
/// step in flight, else the step to execute next (`''`: not started).
const OPEN_RUNS: &str = "SELECT revision,
        CASE WHEN status = 'waiting' AND step_count = 0 THEN '' ELSE COALESCE(in_flight ->> 'stepId', step_id, '') END,
        in_flight ->> 'stepType', count(*)
    FROM workflow_runs WHERE workflow_id = $1 AND revision < $2 AND finished_at IS NULL
    GROUP BY 1, 2, 3 ORDER BY 1, 2";

/// Marks the open runs of a workflow on revisions before `$2` to move to it and makes them due
/// (the engine's next transition of each decides its move); a run in a wait keeps its due time
/// in `in_flight.untilMs`.
const MARK: &str = "UPDATE workflow_runs SET migrate_to = $2,
        in_flight = CASE WHEN in_flight IS NOT NULL AND due_at IS NOT NULL AND NOT in_flight ? 'untilMs'
                         THEN jsonb_set(in_flight, '{untilMs}', to_jsonb((extract(epoch FROM due_at) * 1000)::bigint))
                         ELSE in_flight END,
        due_at = LEAST(COALESCE(due_at, clock_timestamp()), clock_timestamp())
    WHERE workflow_id = $1 AND revision < $2 AND finished_at IS NULL";

/// Records that the revision `$2` of workflow `$1` (space `$3`) moved runs: rows inserted later
/// on an earlier revision are marked as they are inserted.
const MOVED: &str = "INSERT INTO workflow_controls (workflow_id, space_id, paused, moved_to) VALUES ($1, $3, false, $2)
    ON CONFLICT (workflow_id) DO UPDATE SET moved_to = GREATEST(workflow_controls.moved_to, EXCLUDED.moved_to)";

/// Checks and marks the runs in flight of every workflow `plan` publishes a new revision of;
/// answers a line per such workflow with runs in flight, saying what happens to them.
pub(super) async fn plan_in_flight(pool: &Pool, plan: &mut Plan<'_>) -> anyhow::Result<Vec<String>> {
    let published: Vec<(String, i64, String, String)> = plan
        .streams
        .iter()
        .flat_map(|stream| &stream.events)
        .filter_map(|new| match &new.event {
            LogEvent::ResourceDefined(resource) if resource.kind == WORKFLOW => Some((
                resource.resource_id.clone(),
                resource.revision,
                resource.definition_json.clone(),
                resource.space_id.clone(),
            )),
            _ => None,
        })
        .collect();
    let mut lines = Vec::new();
    if published.is_empty() {
        return Ok(lines);
    }
    let client = pool.get().await?;
    for (workflow_id, revision, json, space_id) in published {
        let new: WorkflowDef = serde_json::from_str(&json)?;
        if new.in_flight.moves_runs() {
            // Marked whether or not runs are open now: a run may be requested on an earlier
            // revision while the apply commits, or after it on a catalog not caught up yet.
            let conflict = || AppendError::Conflict {
                code: Code::ConcurrentModification,
                message: "the workflow's runs changed while the apply was planned".to_owned(),
            };
            let params = || -> Vec<platform::log::Param> { vec![Box::new(workflow_id.clone()), Box::new(revision)] };
            plan.guards.push(Guard::unique(MARK, params(), conflict()));
            let mut moved = params();
            moved.push(Box::new(space_id.clone()));
            plan.guards.push(Guard::unique(MOVED, moved, conflict()));
        }
        let rows = client.query(OPEN_RUNS, &[&workflow_id, &revision]).await?;
        if rows.is_empty() {
            // No run to move; the rule itself must still hold (its steps, a draft moves none).
            check_in_flight(&new, &[])
                .map_err(|error| anyhow::anyhow!("workflow {:?} revision {revision}: {}", new.slug, error.0))?;
            continue;
        }
        let earlier = earlier_revisions(&client, &workflow_id).await?;
        let active: Vec<Active> = rows
            .iter()
            .map(|row| {
                let (run_revision, step_id): (i64, String) = (row.get(0), row.get(1));
                let step_type = row.get::<_, Option<String>>(2).unwrap_or_else(|| {
                    earlier
                        .get(&run_revision)
                        .and_then(|definition| definition.step(&step_id))
                        .map_or(String::new(), |step| step.kind.type_name().to_owned())
                });
                Active { revision: run_revision, step_id, step_type, runs: row.get(3) }
            })
            .collect();
        check_in_flight(&new, &active)
            .map_err(|error| anyhow::anyhow!("workflow {:?} revision {revision}: {}", new.slug, error.0))?;
        lines.push(describe(&new, revision, &active));
    }
    Ok(lines)
}

/// Every revision of the workflow the log holds.
async fn earlier_revisions(
    client: &deadpool_postgres::Client,
    workflow_id: &str,
) -> anyhow::Result<BTreeMap<i64, WorkflowDef>> {
    let stream = super::resource_stream(WORKFLOW, workflow_id);
    let mut found = BTreeMap::new();
    for stored in platform::log::read_streams(client, &[stream]).await? {
        if let LogEvent::ResourceDefined(resource) = stored.decode()? {
            found.insert(resource.revision, serde_json::from_str(&resource.definition_json)?);
        }
    }
    Ok(found)
}

/// What the revision does with the runs in flight, as a person reads it.
fn describe(new: &WorkflowDef, revision: i64, active: &[Active]) -> String {
    let total: i64 = active.iter().map(|active| active.runs).sum();
    let head = format!("workflow {:?} revision {revision}: {total} run(s) in flight", new.slug);
    let place = |active: &Active| {
        if active.step_id.is_empty() { "not started".to_owned() } else { format!("at {}", active.step_id) }
    };
    match &new.in_flight {
        InFlightRule::Pin => {
            let revisions: std::collections::BTreeSet<i64> = active.iter().map(|active| active.revision).collect();
            let list: Vec<String> = revisions.iter().map(i64::to_string).collect();
            format!("{head} stay on revision(s) {} (inFlight pin)", list.join(", "))
        }
        InFlightRule::Exit => format!("{head} end, exited (inFlight exit)"),
        InFlightRule::Migrate { steps, replan } => {
            let moves: Vec<String> = active
                .iter()
                .map(|active| {
                    if active.step_id.is_empty() {
                        return format!("{} not started on revision {} → the new entry", active.runs, active.revision);
                    }
                    let to = domain::workflows::target(steps, new, (&active.step_id, &active.step_type), true)
                        .or_else(|_| domain::workflows::target(steps, new, (&active.step_id, &active.step_type), false))
                        .map_or_else(|_| "?".to_owned(), |step| step.id.clone());
                    let due = if replan.contains(&to) { ", wait planned again" } else { "" };
                    format!("{} {} on revision {} → {to}{due}", active.runs, place(active), active.revision)
                })
                .collect();
            format!("{head} move (inFlight migrate): {}", moves.join("; "))
        }
    }
}
