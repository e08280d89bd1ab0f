//! What broadcast commands read: the broadcast from the log (its authored definition and the
//! API's updates, in log order, with the versions of both streams), whether a run is active
//! (the write side's `broadcast_runs`), and the guards their appends carry.

use deadpool_postgres::GenericClient;
use domain::email::broadcasts::{apply_update, stream_id};
use domain::email::resources::{BROADCAST, BroadcastDef};
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{AppendError, Guard};

/// The stream the operator's apply writes a broadcast's definition to.
pub(crate) fn authored_stream(broadcast_id: &str) -> String {
    crate::authoring::resource_stream(BROADCAST, broadcast_id)
}

/// A broadcast as the log holds it when a command is decided.
#[derive(Debug, Clone)]
pub struct Current {
    /// The authored definition with every update the log holds folded over it, in log order.
    pub definition: BroadcastDef,
    /// Whether a run is scheduled or sending.
    pub run_active: bool,
}

/// A broadcast of the caller's space as the log holds it.
pub struct Loaded {
    pub current: Current,
    /// The version of the broadcast's own stream (0: nothing appended to it yet).
    pub version: i64,
    /// The version of its authoring stream, which the append requires unchanged.
    pub authored_version: i64,
}

/// The broadcast `broadcast_id` of `space_id` folded from the log, in one statement for both
/// streams, and whether it has an active run; `None` when it is not one of the space's.
pub async fn load(client: &impl GenericClient, space_id: &str, broadcast_id: &str) -> anyhow::Result<Option<Loaded>> {
    let authored = authored_stream(broadcast_id);
    let own = stream_id(broadcast_id);
    let events = platform::log::read_streams(client, &[authored.clone(), own.clone()]).await?;
    let (mut definition, mut version, mut authored_version) = (None::<BroadcastDef>, 0, 0);
    for stored in &events {
        if stored.stream_id == authored {
            authored_version = stored.stream_version;
        } else {
            version = stored.stream_version;
        }
        match stored.decode()? {
            LogEvent::ResourceDefined(resource) if resource.space_id == space_id => {
                definition = Some(serde_json::from_str(&resource.definition_json)?);
            }
            LogEvent::ResourceDefined(_) => definition = None,
            LogEvent::BroadcastUpdated(update) => definition = definition.map(|current| apply_update(current, &update)),
            _ => {}
        }
    }
    let Some(definition) = definition else { return Ok(None) };
    let run_active = has_active_run(client, broadcast_id).await?;
    Ok(Some(Loaded { current: Current { definition, run_active }, version, authored_version }))
}

/// Whether a run of the broadcast is scheduled or sending.
async fn has_active_run(client: &impl GenericClient, broadcast_id: &str) -> Result<bool, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM broadcast_runs WHERE broadcast_id = $1 AND status IN ('scheduled', 'sending'))",
        )
        .await?;
    Ok(client.query_one(&statement, &[&broadcast_id]).await?.get(0))
}

/// Refuses the append while a run is scheduled or sending (a concurrent send included).
pub(crate) fn no_active_run(broadcast_id: &str) -> Guard {
    Guard::exactly_one(
        "SELECT 1 WHERE NOT EXISTS (
             SELECT 1 FROM broadcast_runs WHERE broadcast_id = $1 AND status IN ('scheduled', 'sending'))",
        vec![Box::new(broadcast_id.to_owned())],
        run_active(),
    )
}

fn run_active() -> AppendError {
    AppendError::Conflict {
        code: Code::BroadcastRunActive,
        message: "a run of this broadcast is scheduled or sending; wait until it has completed".to_owned(),
    }
}

/// The run's row (one scheduled or sending run per broadcast, by a unique index) and its start
/// timer, due at `start_at`.
pub(crate) fn run_guards(run: &platform::proto::BroadcastRunRequested, audience: serde_json::Value) -> Vec<Guard> {
    let start_at = platform::time::from_millis(run.start_at_ms);
    vec![
        Guard::unique(
            "INSERT INTO broadcast_runs
                 (run_id, broadcast_id, space_id, template_id, sender_id, audience, start_at, requested_at, experiment)
             VALUES ($1, $2, $3, $4, NULLIF($5, ''), $6, $7, $8, NULLIF($9, '')::jsonb)",
            vec![
                Box::new(run.run_id.clone()),
                Box::new(run.broadcast_id.clone()),
                Box::new(run.space_id.clone()),
                Box::new(run.template_id.clone()),
                Box::new(run.sender_id.clone()),
                Box::new(audience),
                Box::new(start_at),
                Box::new(platform::time::from_millis(run.requested_at_ms)),
                Box::new(run.experiment_json.clone()),
            ],
            run_active(),
        ),
        Guard::exactly_one(
            "INSERT INTO timers (kind, key, due_at, payload) VALUES ($1, $2, $3, jsonb_build_object('runId', $2::text))",
            vec![Box::new(domain::email::broadcasts::RUN_TIMER), Box::new(run.run_id.clone()), Box::new(start_at)],
            AppendError::Failed("could not schedule the run".to_owned()),
        ),
    ]
}
