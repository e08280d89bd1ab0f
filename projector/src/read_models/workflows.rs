//! The workflows read model: each workflow as authored with its pause state and API document,
//! each of its revisions with its `inFlight` rule, each run with its status and the revision it
//! follows (with its migrations to newer ones), and each run's step history (one record per
//! execution, from its `WorkflowStepStarted` and `WorkflowStepFinished`). One read model, so
//! that one consistency check covers a workflow and its runs. Totals are maintained counters.
//! Every fold takes its times from the events' own fields (a revision's, from the stored time
//! of the event that defines it), so a rebuild gives the same rows.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use deadpool_postgres::Transaction;
use domain::workflows::{Status, WORKFLOW, WorkflowDef};
use platform::events::LogEvent;
use platform::log::StoredEvent;
use serde_json::{Value, json};

mod write;

use write::{ChangedRuns, NewRuns, write_counts, write_history, write_revision_counts, write_step_counts};

pub(super) const DDL: &str = "
CREATE TABLE {s}.workflows (
    workflow_id text PRIMARY KEY,
    space_id text NOT NULL,
    slug text NOT NULL,
    revision bigint NOT NULL,
    definition jsonb NOT NULL,
    paused boolean NOT NULL DEFAULT false,
    doc jsonb NOT NULL
);
CREATE TABLE {s}.workflow_counts (space_id text PRIMARY KEY, total bigint NOT NULL);
CREATE TABLE {s}.runs (
    run_id text PRIMARY KEY,
    workflow_id text NOT NULL,
    space_id text NOT NULL,
    status text NOT NULL,
    contact_id text,
    trigger_type text NOT NULL,
    trigger_id text NOT NULL,
    requested_at timestamptz NOT NULL,
    started_at timestamptz,
    finished_at timestamptz,
    step_count integer NOT NULL DEFAULT 0,
    current_step_id text,
    error jsonb
    -- and `revision`, `migrations`: see ADDITIONS.
);
CREATE TABLE {s}.run_counts (
    workflow_id text NOT NULL,
    status text NOT NULL,
    total bigint NOT NULL,
    PRIMARY KEY (workflow_id, status)
);
CREATE TABLE {s}.step_counts (
    workflow_id text NOT NULL,
    step_id text NOT NULL,
    -- `entered`, a finished step's status, or `skipped:<reason>` (the gate that refused a send,
    -- or the error code of another skip).
    measure text NOT NULL,
    total bigint NOT NULL,
    PRIMARY KEY (workflow_id, step_id, measure)
);
CREATE TABLE {s}.history (
    run_id text NOT NULL,
    index integer NOT NULL,
    step_id text NOT NULL,
    type text NOT NULL,
    status text NOT NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz,
    error jsonb,
    -- The email a send step scheduled (sent, held or skipped); null for other steps.
    email_id text,
    PRIMARY KEY (run_id, index)
);
";

/// A workflow by its slug, the runs lists' orders, and the open runs of each revision by step
/// (`GET /workflows/{id}/revisions`); `apply` reads workflows and runs by id alone. The last
/// is also in [`ADDITIONS`], which gives it to the versions made before it (named, so that
/// either statement finds the other's index).
const READ_INDEXES: &str = "
CREATE INDEX ON {s}.workflows (space_id, slug);
CREATE INDEX ON {s}.runs (workflow_id, requested_at DESC, run_id DESC);
CREATE INDEX ON {s}.runs (workflow_id, status, requested_at DESC, run_id DESC);
CREATE INDEX IF NOT EXISTS runs_open_by_revision ON {s}.runs (workflow_id, revision, current_step_id)
    WHERE status IN ('waiting', 'running', 'sleeping');
";

/// What revisions added, part of every new version and run on the versions that exist when a
/// projector starts (so each statement is idempotent):
///
/// - each run's `revision` (the one it follows: requested under, or migrated to) and its
///   `migrations` (`{fromRevision, toRevision, fromStepId, toStepId, replanned, until, at}` in
///   order);
/// - `revisions`: each revision of each workflow as defined, with its `inFlight` rule (as the
///   API shows it) and the time of its definition;
/// - `revision_run_counts`: runs by revision and status, kept like `run_counts`;
/// - the index of open runs by revision and step (see [`READ_INDEXES`]).
///
/// A version made before holds no revision, so the last statements fill in what the log and
/// the engine already know: a run's revision from the engine's own row of it (which holds the
/// revision the run follows); the current revision of each workflow from the workflow row,
/// defined when the workflow's authoring stream last changed; and, on the first start (while
/// `revision_run_counts` is empty), the earlier revisions that runs follow, with the counts.
/// Such a revision took runs, so it was published, and it was defined before any revision
/// could move runs, so its rule is `pin`; its time is that of the definition at its revision's
/// place in the authoring stream, where that stream holds definitions alone (each defines the
/// revision after the one before it). A revision that took no run and is not the current one
/// is not filled in: only a rebuild, which reads every definition, gives it.
const ADDITIONS: &str = r#"
-- A version made before revisions: the column is added and filled from the engine's rows once
-- (not a scan of every run at each start).
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                   WHERE table_schema = '{s}' AND table_name = 'runs' AND column_name = 'revision') THEN
        ALTER TABLE {s}.runs ADD COLUMN revision bigint;
        UPDATE {s}.runs r SET revision = w.revision FROM public.workflow_runs w WHERE w.run_id = r.run_id;
    END IF;
END $$;
ALTER TABLE {s}.runs ADD COLUMN IF NOT EXISTS migrations jsonb NOT NULL DEFAULT '[]';
CREATE TABLE IF NOT EXISTS {s}.revisions (
    workflow_id text NOT NULL,
    revision bigint NOT NULL,
    space_id text NOT NULL,
    -- `published` or `draft`, as authored.
    status text NOT NULL,
    -- `{"runs": "pin"}`, `{"runs": "exit"}` or `{"runs": "migrate", "steps": {..}, "replan": [..]}`.
    in_flight jsonb NOT NULL,
    defined_at timestamptz NOT NULL,
    PRIMARY KEY (workflow_id, revision)
);
CREATE TABLE IF NOT EXISTS {s}.revision_run_counts (
    workflow_id text NOT NULL,
    revision bigint NOT NULL,
    status text NOT NULL,
    total bigint NOT NULL,
    PRIMARY KEY (workflow_id, revision, status)
);
CREATE INDEX IF NOT EXISTS runs_open_by_revision ON {s}.runs (workflow_id, revision, current_step_id)
    WHERE status IN ('waiting', 'running', 'sleeping');
INSERT INTO {s}.revisions (workflow_id, revision, space_id, status, in_flight, defined_at)
    SELECT w.workflow_id, w.revision, w.space_id, w.definition ->> 'status',
        COALESCE(w.definition -> 'inFlight', '{"runs": "pin"}'), d.defined_at
    FROM {s}.workflows w
    CROSS JOIN LATERAL (
        SELECT max(e.occurred_at) AS defined_at FROM public.events e
        WHERE e.stream_id = 'authoring/workflow/' || w.workflow_id AND e.event_type = 'ResourceDefined.v1') d
    WHERE d.defined_at IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM {s}.revisions v WHERE v.workflow_id = w.workflow_id AND v.revision = w.revision)
    ON CONFLICT (workflow_id, revision) DO NOTHING;
INSERT INTO {s}.revisions (workflow_id, revision, space_id, status, in_flight, defined_at)
    SELECT f.workflow_id, f.revision, f.space_id, 'published', '{"runs": "pin"}', e.occurred_at
    FROM (SELECT DISTINCT workflow_id, revision, space_id FROM {s}.runs
          WHERE revision IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {s}.revision_run_counts)) f
    JOIN public.events e ON e.stream_id = 'authoring/workflow/' || f.workflow_id AND e.stream_version = f.revision
        AND e.event_type = 'ResourceDefined.v1'
    WHERE NOT EXISTS (
        SELECT 1 FROM public.events o WHERE o.stream_id = e.stream_id AND o.event_type <> 'ResourceDefined.v1')
    ON CONFLICT (workflow_id, revision) DO NOTHING;
INSERT INTO {s}.revision_run_counts (workflow_id, revision, status, total)
    SELECT workflow_id, revision, status, count(*) FROM {s}.runs
    WHERE revision IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {s}.revision_run_counts)
    GROUP BY workflow_id, revision, status;
"#;

pub(super) const EVENT_TYPES: &[&str] = &[
    "ResourceDefined.v1",
    "WorkflowPaused.v1",
    "WorkflowUnpaused.v1",
    "WorkflowRunRequested.v1",
    "WorkflowRunStarted.v1",
    "WorkflowStepStarted.v1",
    "WorkflowRunSleeping.v1",
    "WorkflowStepFinished.v1",
    "WorkflowRunPaused.v1",
    "WorkflowRunResumed.v1",
    "WorkflowRunFinished.v1",
    "WorkflowRunAdvanced.v1",
    "WorkflowRunMigrated.v1",
    // A send step's held email skipped when it was decided again: the step's counts move it
    // from `completed` to `skipped`, so they agree with the step's delivery log.
    "EmailSkipped.v1",
];

fn at(ms: i64) -> chrono::DateTime<chrono::Utc> {
    platform::time::from_millis(ms)
}

fn error_of(code: &str, message: &str) -> Option<Value> {
    (!code.is_empty()).then(|| json!({"code": code, "message": message}))
}

/// A step's error, with the gate that refused a skipped send and its email when there is one.
fn step_error_of(finished: &platform::proto::WorkflowStepFinished) -> Option<Value> {
    let mut error = error_of(&finished.error_code, &finished.error_message)?;
    if !finished.gate.is_empty() {
        error["gate"] = Value::String(finished.gate.clone());
        // The skipped send's story (`GET /emails/{id}`) says what decided; absent in runs
        // recorded before skipped sends had one.
        if !finished.email_id.is_empty() {
            error["emailId"] = Value::String(finished.email_id.clone());
        }
    }
    Some(error)
}

/// Applies a batch: authoring changes (definitions, pauses) one by one, and the runs' events
/// folded per run and per history record in memory, then written set-wise: a statement for
/// the new runs, one for the changed ones, one for the counters and two for the history,
/// whatever the batch holds. The fold is what applying the events one by one would leave.
pub(super) async fn apply(transaction: &Transaction<'_>, s: &str, events: &[StoredEvent]) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    let mut late_skips: BTreeMap<(String, String, String), i64> = BTreeMap::new();
    for event in events.iter().filter(|event| EVENT_TYPES.contains(&event.event_type.as_str())) {
        let decoded = event.decode()?;
        match decoded {
            LogEvent::EmailSkipped(skipped) => {
                if let Some(step) = late_skip(event.stream_version, &skipped) {
                    for measure in step.measures() {
                        *late_skips.entry((step.workflow_id.clone(), step.step_id.clone(), measure.0)).or_default() +=
                            measure.1;
                    }
                }
            }
            LogEvent::ResourceDefined(resource) if resource.kind == WORKFLOW => {
                define(transaction, s, &resource, event.occurred_at).await?
            }
            LogEvent::WorkflowPaused(paused) => set_paused(transaction, s, &paused.workflow_id, true).await?,
            LogEvent::WorkflowUnpaused(unpaused) => set_paused(transaction, s, &unpaused.workflow_id, false).await?,
            LogEvent::ResourceDefined(_) => {}
            // A transition's changes, each as the event it would have been on its own.
            other => runs.extend(domain::workflows::changes(other)),
        }
    }
    write_step_counts(transaction, s, late_skips).await?;
    if runs.is_empty() {
        return Ok(());
    }
    let mut fold = Fold::load(transaction, s, &runs).await?;
    for event in runs {
        fold.apply(event);
    }
    fold.write(transaction, s).await
}

/// A send step's email that was held, then skipped when it was decided again: the step had
/// finished `completed` (its email stored), and now counts as a skip by the gate that refused.
#[derive(Debug, PartialEq, Eq)]
struct LateSkip {
    workflow_id: String,
    step_id: String,
    gate: String,
}

impl LateSkip {
    /// The moves in the step's counters: out of `completed`, into `skipped` and its reason.
    fn measures(&self) -> [(String, i64); 3] {
        [("completed".to_owned(), -1), ("skipped".to_owned(), 1), (format!("skipped:{}", self.gate), 1)]
    }
}

/// The late skip `skipped` records, if it is one: a journey's email whose stream began with
/// its `EmailScheduled` (a send refused at once begins its stream with `EmailSkipped`, and
/// its step finished `skipped`).
fn late_skip(stream_version: i64, skipped: &platform::proto::EmailSkipped) -> Option<LateSkip> {
    let source = skipped.source.as_ref()?;
    (stream_version > 1 && source.origin == "workflow" && !source.parent_id.is_empty()).then(|| LateSkip {
        workflow_id: source.parent_id.clone(),
        step_id: source.step_id.clone(),
        gate: skipped.gate.clone(),
    })
}

/// Writes a workflow's new definition over its row, and its revision, defined at `defined_at`
/// (the time of the event that defines it).
async fn define(
    transaction: &Transaction<'_>,
    s: &str,
    resource: &platform::proto::ResourceDefined,
    defined_at: DateTime<Utc>,
) -> anyhow::Result<()> {
    let definition: WorkflowDef = serde_json::from_str(&resource.definition_json)?;
    let paused: bool = transaction
        .query_opt(&format!("SELECT paused FROM {s}.workflows WHERE workflow_id = $1"), &[&resource.resource_id])
        .await?
        .is_some_and(|row| row.get(0));
    let doc = definition.document(&resource.resource_id, resource.revision, paused);
    let statement = transaction
        .prepare_cached(&format!(
            "WITH written AS (
                 INSERT INTO {s}.workflows (workflow_id, space_id, slug, revision, definition, paused, doc)
                 VALUES ($1, $2, $3, $4, $5, false, $6)
                 ON CONFLICT (workflow_id) DO UPDATE SET slug = EXCLUDED.slug, revision = EXCLUDED.revision,
                     definition = EXCLUDED.definition, doc = EXCLUDED.doc
                 RETURNING space_id, (xmax = 0) AS inserted)
             INSERT INTO {s}.workflow_counts (space_id, total) SELECT space_id, 1 FROM written WHERE inserted
             ON CONFLICT (space_id) DO UPDATE SET total = workflow_counts.total + 1"
        ))
        .await?;
    let stored = serde_json::to_value(&definition)?;
    transaction
        .execute(
            &statement,
            &[&resource.resource_id, &resource.space_id, &definition.slug, &resource.revision, &stored, &doc],
        )
        .await?;
    let statement = transaction
        .prepare_cached(&format!(
            "INSERT INTO {s}.revisions (workflow_id, revision, space_id, status, in_flight, defined_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (workflow_id, revision) DO NOTHING"
        ))
        .await?;
    let status = match definition.status {
        Status::Published => "published",
        Status::Draft => "draft",
    };
    let in_flight = serde_json::to_value(&definition.in_flight)?;
    transaction
        .execute(
            &statement,
            &[&resource.resource_id, &resource.revision, &resource.space_id, &status, &in_flight, &defined_at],
        )
        .await?;
    Ok(())
}

/// A run as the batch leaves it.
struct Run {
    workflow_id: String,
    /// Its status before the batch; `None` for a run the batch requested.
    initial: Option<String>,
    /// What a run the batch requested is inserted with.
    requested: Option<platform::proto::WorkflowRunRequested>,
    status: String,
    /// The revision it follows: the one it was requested under, or the last it migrated to.
    /// `None` only for a run stored before runs kept their revision whose revision the
    /// engine's table did not give either; such a run is in no revision's counters.
    revision: Option<i64>,
    /// Its revision before the batch: with `initial`, where the revision counters hold it.
    initial_revision: Option<i64>,
    /// Its moves to newer revisions, in order, as the API shows them.
    migrations: Vec<Value>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    error: Option<Value>,
    step_count: i32,
    current_step_id: Option<String>,
    changed: bool,
}

impl Run {
    /// The run's move between the revision counters (by revision and status): out of where it
    /// was counted before the batch (-1), into where the batch leaves it (+1). A migration
    /// moves it between revisions as a change of status moves it within one; a run the batch
    /// requested counts under the revision it was requested under.
    fn revision_moves(&self) -> Vec<((i64, String), i64)> {
        let before = self.initial_revision.zip(self.initial.clone());
        let after = self.revision.map(|revision| (revision, self.status.clone()));
        if before == after {
            return Vec::new();
        }
        before.map(|held| (held, -1)).into_iter().chain(after.map(|held| (held, 1))).collect()
    }
}

/// A history record as the batch leaves it.
struct Record {
    step_id: String,
    step_type: String,
    started_at: DateTime<Utc>,
    /// Its end, once finished in the batch.
    finished: Option<Finished>,
}

/// How a history record ended: its status, when, its error and its email (a send step's).
struct Finished {
    status: String,
    at: DateTime<Utc>,
    error: Option<Value>,
    email_id: Option<String>,
}

/// The batch's runs and history records.
#[derive(Default)]
struct Fold {
    runs: HashMap<String, Run>,
    records: BTreeMap<(String, i32), Record>,
}

fn run_of(event: &LogEvent) -> Option<&str> {
    Some(match event {
        LogEvent::WorkflowRunRequested(event) => &event.run_id,
        LogEvent::WorkflowRunStarted(event) => &event.run_id,
        LogEvent::WorkflowStepStarted(event) => &event.run_id,
        LogEvent::WorkflowRunSleeping(event) => &event.run_id,
        LogEvent::WorkflowStepFinished(event) => &event.run_id,
        LogEvent::WorkflowRunPaused(event) => &event.run_id,
        LogEvent::WorkflowRunResumed(event) => &event.run_id,
        LogEvent::WorkflowRunFinished(event) => &event.run_id,
        LogEvent::WorkflowRunMigrated(event) => &event.run_id,
        _ => return None,
    })
}

fn is_finished(status: &str) -> bool {
    ["completed", "exited", "failed"].contains(&status)
}

impl Fold {
    /// The runs the events touch, as stored before the batch.
    async fn load(transaction: &Transaction<'_>, s: &str, events: &[LogEvent]) -> anyhow::Result<Self> {
        let mut ids: Vec<&str> = events.iter().filter_map(run_of).collect();
        ids.sort_unstable();
        ids.dedup();
        let statement = transaction
            .prepare_cached(&format!(
                "SELECT r.run_id, r.workflow_id, r.status, r.started_at, r.finished_at, r.error, r.step_count,
                        r.current_step_id, r.revision, r.migrations
                 FROM unnest($1::text[]) AS q(run_id)
                 CROSS JOIN LATERAL (SELECT * FROM {s}.runs WHERE run_id = q.run_id OFFSET 0) r"
            ))
            .await?;
        let mut fold = Fold::default();
        for row in transaction.query(&statement, &[&ids]).await? {
            let status: String = row.get(2);
            let revision: Option<i64> = row.get(8);
            let migrations = match row.get::<_, Value>(9) {
                Value::Array(migrations) => migrations,
                _ => Vec::new(),
            };
            fold.runs.insert(
                row.get(0),
                Run {
                    workflow_id: row.get(1),
                    initial: Some(status.clone()),
                    requested: None,
                    status,
                    revision,
                    initial_revision: revision,
                    migrations,
                    started_at: row.get(3),
                    finished_at: row.get(4),
                    error: row.get(5),
                    step_count: row.get(6),
                    current_step_id: row.get(7),
                    changed: false,
                },
            );
        }
        Ok(fold)
    }

    fn apply(&mut self, event: LogEvent) {
        match event {
            // A run stored before is requested again only by a replay: nothing changes.
            LogEvent::WorkflowRunRequested(requested) if !self.runs.contains_key(&requested.run_id) => {
                let run = Run {
                    workflow_id: requested.workflow_id.clone(),
                    initial: None,
                    requested: None,
                    status: "waiting".to_owned(),
                    revision: Some(requested.workflow_revision),
                    initial_revision: None,
                    migrations: Vec::new(),
                    started_at: None,
                    finished_at: None,
                    error: None,
                    step_count: 0,
                    current_step_id: None,
                    changed: true,
                };
                self.runs.insert(requested.run_id.clone(), Run { requested: Some(requested), ..run });
            }
            LogEvent::WorkflowRunStarted(started) => {
                self.set_status(&started.run_id, "running", Some(started.at_ms), None);
            }
            LogEvent::WorkflowStepStarted(started) => {
                self.records.entry((started.run_id.clone(), started.index)).or_insert_with(|| Record {
                    step_id: started.step_id.clone(),
                    step_type: started.step_type.clone(),
                    started_at: at(started.at_ms),
                    finished: None,
                });
                if let Some(run) = self.runs.get_mut(&started.run_id) {
                    run.step_count = run.step_count.max(started.index);
                    run.current_step_id = Some(started.step_id);
                    run.changed = true;
                }
            }
            LogEvent::WorkflowRunSleeping(sleeping) => self.set_status(&sleeping.run_id, "sleeping", None, None),
            LogEvent::WorkflowStepFinished(finished) => {
                let error = step_error_of(&finished);
                let record = self.records.entry((finished.run_id.clone(), finished.index)).or_insert_with(|| Record {
                    step_id: finished.step_id.clone(),
                    step_type: finished.step_type.clone(),
                    started_at: at(finished.started_at_ms),
                    finished: None,
                });
                let email_id = Some(finished.email_id.clone()).filter(|id| !id.is_empty());
                record.finished =
                    Some(Finished { status: finished.status.clone(), at: at(finished.at_ms), error, email_id });
                if let Some(run) = self.runs.get_mut(&finished.run_id) {
                    run.step_count = run.step_count.max(finished.index);
                    run.current_step_id = Some(finished.next_step_id.clone()).filter(|id| !id.is_empty());
                    run.changed = true;
                }
                self.set_status(&finished.run_id, "running", None, None);
            }
            LogEvent::WorkflowRunPaused(paused) => self.set_status(&paused.run_id, "waiting", None, None),
            LogEvent::WorkflowRunResumed(resumed) => self.set_status(&resumed.run_id, "running", None, None),
            LogEvent::WorkflowRunFinished(finished) => {
                let error = error_of(&finished.error_code, &finished.error_message);
                self.set_status(&finished.run_id, &finished.status, None, Some((finished.at_ms, error)));
            }
            LogEvent::WorkflowRunMigrated(migrated) => self.migrate(&migrated),
            _ => {}
        }
    }

    /// Moves a run to the revision it migrated to, at the step it goes to there: the step in
    /// flight's own end (`migrated`) and the next step's start follow as events of their own.
    /// A run moves to a revision once, so a move it has made already changes nothing.
    fn migrate(&mut self, migrated: &platform::proto::WorkflowRunMigrated) {
        let Some(run) = self.runs.get_mut(&migrated.run_id) else { return };
        if run.migrations.iter().any(|migration| migration["toRevision"] == migrated.to_revision) {
            return;
        }
        let step_id = |id: &str| Some(id.to_owned()).filter(|id| !id.is_empty());
        run.migrations.push(json!({
            "fromRevision": migrated.from_revision,
            "toRevision": migrated.to_revision,
            "fromStepId": step_id(&migrated.from_step_id),
            "toStepId": step_id(&migrated.to_step_id),
            "replanned": migrated.replanned,
            // When the wait it moved in ends now (kept or planned again); null when it moved
            // between steps.
            "until": (migrated.until_ms > 0).then(|| platform::time::format_millis(migrated.until_ms)),
            "at": platform::time::format_millis(migrated.at_ms),
        }));
        run.revision = Some(migrated.to_revision);
        // A run that had not started has no step to go to: it starts at the new entry.
        if let Some(to_step_id) = step_id(&migrated.to_step_id) {
            run.current_step_id = Some(to_step_id);
        }
        run.changed = true;
    }

    /// Moves a run to `status`, with its start or its end; a finished run stays finished.
    fn set_status(
        &mut self,
        run_id: &str,
        status: &str,
        started_at_ms: Option<i64>,
        end: Option<(i64, Option<Value>)>,
    ) {
        let Some(run) = self.runs.get_mut(run_id) else { return };
        if is_finished(&run.status) {
            return;
        }
        run.status = status.to_owned();
        run.started_at = run.started_at.or(started_at_ms.map(at));
        if let Some((at_ms, error)) = end {
            run.finished_at = Some(at(at_ms));
            run.error = error.or(run.error.take());
            run.current_step_id = None;
        }
        run.changed = true;
    }

    async fn write(self, transaction: &Transaction<'_>, s: &str) -> anyhow::Result<()> {
        let mut new = NewRuns::default();
        let mut changed = ChangedRuns::default();
        let mut counts: BTreeMap<(String, String), i64> = BTreeMap::new();
        let mut revision_counts: BTreeMap<(String, i64, String), i64> = BTreeMap::new();
        // Every run a history record of the batch belongs to, with its workflow (the counters'
        // key), so the history's statements join an array, not the runs table.
        let owners: (Vec<String>, Vec<String>) =
            self.runs.iter().map(|(run_id, run)| (run_id.clone(), run.workflow_id.clone())).unzip();
        for (run_id, mut run) in self.runs {
            if !run.changed {
                continue;
            }
            if let Some(initial) = &run.initial {
                if *initial != run.status {
                    *counts.entry((run.workflow_id.clone(), initial.clone())).or_default() -= 1;
                    *counts.entry((run.workflow_id.clone(), run.status.clone())).or_default() += 1;
                }
            } else {
                *counts.entry((run.workflow_id.clone(), run.status.clone())).or_default() += 1;
            }
            for ((revision, status), delta) in run.revision_moves() {
                *revision_counts.entry((run.workflow_id.clone(), revision, status)).or_default() += delta;
            }
            match run.requested.take() {
                Some(requested) => new.push(run_id, requested, run),
                None => changed.push(run_id, run),
            }
        }
        new.write(transaction, s).await?;
        changed.write(transaction, s).await?;
        write_counts(transaction, s, counts).await?;
        write_revision_counts(transaction, s, revision_counts).await?;
        write_history(transaction, s, self.records, &owners).await
    }
}

async fn set_paused(transaction: &Transaction<'_>, s: &str, workflow_id: &str, paused: bool) -> anyhow::Result<()> {
    let row = transaction
        .query_opt(&format!("SELECT revision, definition FROM {s}.workflows WHERE workflow_id = $1"), &[&workflow_id])
        .await?;
    let Some(row) = row else { return Ok(()) };
    let definition: WorkflowDef = serde_json::from_value(row.get(1))?;
    let doc = definition.document(workflow_id, row.get(0), paused);
    transaction
        .execute(
            &format!("UPDATE {s}.workflows SET paused = $2, doc = $3 WHERE workflow_id = $1"),
            &[&workflow_id, &paused, &doc],
        )
        .await?;
    Ok(())
}

read_model! {
    /// Workflows and their revisions, their runs and their step histories.
    Workflows = "workflows", batch, read_indexes = READ_INDEXES, additions = ADDITIONS
}

#[cfg(test)]
mod tests {
    use super::*;
    use platform::proto::{EmailSkipped, EmailSource};

    fn skipped(origin: &str) -> EmailSkipped {
        EmailSkipped {
            gate: "suppressed".to_owned(),
            source: Some(EmailSource {
                origin: origin.to_owned(),
                source_id: "run_1".to_owned(),
                parent_id: "wf_1".to_owned(),
                step_id: "welcome".to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_journeys_held_email_skipped_later_moves_its_step_from_completed_to_skipped_by_its_gate() {
        let late = late_skip(3, &skipped("workflow")).expect("a late skip");
        assert_eq!(late, LateSkip { workflow_id: "wf_1".into(), step_id: "welcome".into(), gate: "suppressed".into() });
        assert_eq!(
            late.measures(),
            [("completed".to_owned(), -1), ("skipped".to_owned(), 1), ("skipped:suppressed".to_owned(), 1)]
        );
        // Refused at once: the step finished `skipped` and counted it already.
        assert_eq!(late_skip(1, &skipped("workflow")), None);
        // A broadcast's held email is counted by its run.
        assert_eq!(late_skip(3, &skipped("broadcast")), None);
    }

    /// A history record as the test compares it: index, step, finished status.
    type Kept = (i32, String, Option<String>);

    /// The fold of run `run_1` of workflow `wf_1`, requested in the batch under revision 1,
    /// then `events` (a transition's as its changes).
    fn fold_of(events: Vec<LogEvent>) -> Fold {
        let mut fold = Fold::default();
        let requested = platform::proto::WorkflowRunRequested {
            run_id: "run_1".into(),
            workflow_id: "wf_1".into(),
            space_id: "spc_1".into(),
            workflow_revision: 1,
            ..Default::default()
        };
        fold.apply(LogEvent::WorkflowRunRequested(requested));
        for event in events {
            for change in domain::workflows::changes(event) {
                fold.apply(change);
            }
        }
        fold
    }

    /// What folding `events` leaves for run `run_1`: its status, step count, current step and
    /// end, and its history records.
    fn folded(events: Vec<LogEvent>) -> (String, i32, Option<String>, Option<String>, Vec<Kept>) {
        let fold = fold_of(events);
        let run = &fold.runs["run_1"];
        let records = fold
            .records
            .iter()
            .map(|((_, index), record)| {
                (*index, record.step_id.clone(), record.finished.as_ref().map(|finished| finished.status.clone()))
            })
            .collect();
        let finished = run.finished_at.map(|at| at.to_rfc3339());
        (run.status.clone(), run.step_count, run.current_step_id.clone(), finished, records)
    }

    #[test]
    fn a_transition_as_one_event_folds_as_its_changes_appended_one_by_one_did() {
        use platform::proto::{WorkflowRunFinished, WorkflowStepFinished, WorkflowStepStarted};
        let step = |index: i32, id: &str| WorkflowStepStarted {
            run_id: "run_1".into(),
            space_id: "spc_1".into(),
            index,
            step_id: id.into(),
            step_type: "wait".into(),
            at_ms: 1_000,
        };
        let finished = |index: i32, id: &str, next: &str| WorkflowStepFinished {
            run_id: "run_1".into(),
            space_id: "spc_1".into(),
            index,
            step_id: id.into(),
            status: "completed".into(),
            next_step_id: next.into(),
            started_at_ms: 1_000,
            at_ms: 2_000,
            ..Default::default()
        };
        let changes = vec![
            LogEvent::WorkflowStepFinished(finished(1, "nap", "out")),
            LogEvent::WorkflowStepStarted(step(2, "out")),
            LogEvent::WorkflowStepFinished(finished(2, "out", "")),
            LogEvent::WorkflowRunFinished(WorkflowRunFinished {
                run_id: "run_1".into(),
                space_id: "spc_1".into(),
                status: "exited".into(),
                at_ms: 2_000,
                ..Default::default()
            }),
        ];
        let first = LogEvent::WorkflowStepStarted(step(1, "nap"));
        // An earlier release appended each change as its own event; this one appends the
        // transition as one. Both fold the same.
        let one_by_one = folded([vec![first.clone()], changes.clone()].concat());
        let wrapped = domain::workflows::transition("run_1", "spc_1", changes);
        assert_eq!(wrapped.len(), 1);
        assert!(matches!(wrapped[0], LogEvent::WorkflowRunAdvanced(_)));
        let as_one = folded([vec![first], wrapped].concat());
        assert_eq!(as_one, one_by_one);
        assert_eq!(as_one.0, "exited");
        assert_eq!(as_one.1, 2);
        assert_eq!(
            as_one.4,
            vec![(1, "nap".into(), Some("completed".into())), (2, "out".into(), Some("completed".into()))]
        );
    }

    fn started(index: i32, id: &str, step_type: &str) -> LogEvent {
        LogEvent::WorkflowStepStarted(platform::proto::WorkflowStepStarted {
            run_id: "run_1".into(),
            space_id: "spc_1".into(),
            index,
            step_id: id.into(),
            step_type: step_type.into(),
            at_ms: 1_000,
        })
    }

    fn finished(index: i32, id: &str, status: &str, next: &str) -> LogEvent {
        LogEvent::WorkflowStepFinished(platform::proto::WorkflowStepFinished {
            run_id: "run_1".into(),
            space_id: "spc_1".into(),
            index,
            step_id: id.into(),
            step_type: "wait".into(),
            status: status.into(),
            next_step_id: next.into(),
            started_at_ms: 1_000,
            at_ms: 2_000,
            ..Default::default()
        })
    }

    fn run_finished(status: &str, error_code: &str) -> LogEvent {
        LogEvent::WorkflowRunFinished(platform::proto::WorkflowRunFinished {
            run_id: "run_1".into(),
            space_id: "spc_1".into(),
            status: status.into(),
            error_code: error_code.into(),
            error_message: if error_code.is_empty() { String::new() } else { format!("ended by {error_code}") },
            at_ms: 9_000,
        })
    }

    fn run_started() -> LogEvent {
        LogEvent::WorkflowRunStarted(platform::proto::WorkflowRunStarted {
            run_id: "run_1".into(),
            space_id: "spc_1".into(),
            at_ms: 1_000,
        })
    }

    fn sleeping() -> LogEvent {
        LogEvent::WorkflowRunSleeping(platform::proto::WorkflowRunSleeping {
            run_id: "run_1".into(),
            space_id: "spc_1".into(),
            ..Default::default()
        })
    }

    /// Run `run_1`'s move from revision 1 to 2, from step `from` to step `to`, at 5 s.
    fn migrated(from: &str, to: &str, replanned: bool) -> platform::proto::WorkflowRunMigrated {
        platform::proto::WorkflowRunMigrated {
            run_id: "run_1".into(),
            space_id: "spc_1".into(),
            from_revision: 1,
            to_revision: 2,
            from_step_id: from.into(),
            to_step_id: to.into(),
            replanned,
            until_ms: if replanned { 7_000 } else { 0 },
            at_ms: 5_000,
        }
    }

    #[test]
    fn a_run_migrated_in_its_wait_follows_the_new_revision_from_the_step_it_moved_to() {
        // As the engine appends a migrating transition: the move, the end of the step in
        // flight (`migrated`), the start of the step it moved to; then the run sleeps there.
        let transition = domain::workflows::transition(
            "run_1",
            "spc_1",
            vec![
                LogEvent::WorkflowRunMigrated(migrated("nap", "long-nap", true)),
                finished(1, "nap", "migrated", "long-nap"),
                started(2, "long-nap", "wait"),
            ],
        );
        let mut events = vec![run_started(), started(1, "nap", "wait"), sleeping()];
        events.extend(transition);
        events.push(sleeping());
        let fold = fold_of(events.clone());
        let run = &fold.runs["run_1"];
        assert_eq!(
            (run.status.as_str(), run.revision, run.current_step_id.as_deref()),
            ("sleeping", Some(2), Some("long-nap"))
        );
        assert_eq!(
            run.migrations,
            vec![json!({"fromRevision": 1, "toRevision": 2, "fromStepId": "nap", "toStepId": "long-nap",
                        "replanned": true, "until": "1970-01-01T00:00:07.000Z", "at": "1970-01-01T00:00:05.000Z"})]
        );
        // Its wait ends on the new revision and it completes there.
        events.extend([finished(2, "long-nap", "completed", ""), run_finished("completed", "")]);
        let (status, step_count, current_step_id, _, records) = folded(events.clone());
        assert_eq!((status.as_str(), step_count, current_step_id), ("completed", 2, None));
        assert_eq!(
            records,
            vec![(1, "nap".into(), Some("migrated".into())), (2, "long-nap".into(), Some("completed".into()))]
        );
        let fold = fold_of(events);
        let run = &fold.runs["run_1"];
        assert_eq!((run.revision, run.migrations.len()), (Some(2), 1));
        // Requested in the batch: counted once, under the revision it ends on.
        assert_eq!(run.revision_moves(), vec![((2, "completed".to_owned()), 1)]);
    }

    #[test]
    fn a_run_migrated_before_it_started_has_no_steps_in_its_move_and_a_repeated_move_changes_nothing() {
        let move_once = LogEvent::WorkflowRunMigrated(migrated("", "", false));
        let fold = fold_of(vec![move_once.clone(), move_once]);
        let run = &fold.runs["run_1"];
        assert_eq!((run.status.as_str(), run.revision, run.current_step_id.as_deref()), ("waiting", Some(2), None));
        assert_eq!(
            run.migrations,
            vec![json!({"fromRevision": 1, "toRevision": 2, "fromStepId": null, "toStepId": null,
                        "replanned": false, "until": null, "at": "1970-01-01T00:00:05.000Z"})]
        );
    }

    #[test]
    fn a_run_about_to_execute_a_step_goes_to_the_step_it_maps_to() {
        // Paused before `send`: it moves to `welcome` of the new revision, which it executes next.
        let events = vec![
            run_started(),
            started(1, "start", "incoming_webhook"),
            finished(1, "start", "completed", "send"),
            LogEvent::WorkflowRunMigrated(migrated("send", "welcome", false)),
        ];
        let (status, _, current_step_id, _, _) = folded(events);
        assert_eq!((status.as_str(), current_step_id.as_deref()), ("running", Some("welcome")));
    }

    #[test]
    fn a_run_a_new_revision_ended_is_exited_with_workflow_revised_on_its_own_revision() {
        let events =
            vec![run_started(), started(1, "nap", "wait"), sleeping(), run_finished("exited", "workflow_revised")];
        let fold = fold_of(events);
        let run = &fold.runs["run_1"];
        assert_eq!((run.status.as_str(), run.revision, run.current_step_id.as_deref()), ("exited", Some(1), None));
        assert_eq!(run.error, Some(json!({"code": "workflow_revised", "message": "ended by workflow_revised"})));
        assert!(run.migrations.is_empty());
        assert_eq!(run.revision_moves(), vec![((1, "exited".to_owned()), 1)]);
    }

    #[test]
    fn a_stored_runs_migration_moves_its_count_from_its_old_revision_to_its_new_one() {
        let stored = |status: &str, revision: Option<i64>| Run {
            workflow_id: "wf_1".into(),
            initial: Some(status.into()),
            requested: None,
            status: status.into(),
            revision,
            initial_revision: revision,
            migrations: Vec::new(),
            started_at: None,
            finished_at: None,
            error: None,
            step_count: 1,
            current_step_id: Some("nap".into()),
            changed: false,
        };
        let mut fold = Fold::default();
        fold.runs.insert("run_1".into(), stored("sleeping", Some(1)));
        fold.apply(LogEvent::WorkflowRunMigrated(migrated("nap", "nap", false)));
        fold.apply(finished(1, "nap", "migrated", "nap"));
        assert_eq!(
            fold.runs["run_1"].revision_moves(),
            vec![((1, "sleeping".to_owned()), -1), ((2, "running".to_owned()), 1)]
        );
        // A change of status alone moves it within its revision; none leaves the counters as they are.
        let mut fold = Fold::default();
        fold.runs.insert("run_1".into(), stored("sleeping", Some(1)));
        fold.apply(finished(1, "nap", "completed", "next"));
        assert_eq!(
            fold.runs["run_1"].revision_moves(),
            vec![((1, "sleeping".to_owned()), -1), ((1, "running".to_owned()), 1)]
        );
        assert_eq!(stored("sleeping", Some(1)).revision_moves(), Vec::new());
        // A run stored without a revision is in no revision's counters until it moves to one.
        let mut fold = Fold::default();
        fold.runs.insert("run_1".into(), stored("sleeping", None));
        fold.apply(finished(1, "nap", "completed", "next"));
        assert_eq!(fold.runs["run_1"].revision_moves(), Vec::new());
        fold.apply(LogEvent::WorkflowRunMigrated(migrated("next", "next", false)));
        assert_eq!(fold.runs["run_1"].revision_moves(), vec![((2, "running".to_owned()), 1)]);
    }
}
