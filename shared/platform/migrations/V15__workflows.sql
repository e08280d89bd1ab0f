-- The workflow engine's working copy of each run (see ARCHITECTURE.md, Workflows): not a read
-- model, the engine's own state, like the outboxes. A run is requested in the log
-- (`WorkflowRunRequested`, whose append inserts its row); every later transition is appended
-- to the run's stream at its version together with the update of its row, so the row never
-- runs ahead of the log and no transition happens twice.
CREATE TABLE workflow_runs (
    run_id text PRIMARY KEY,
    workflow_id text NOT NULL,
    space_id text NOT NULL,
    -- The definition revision the run follows.
    revision bigint NOT NULL,
    contact_id text,
    -- `waiting`, `running`, `sleeping`, `completed`, `exited` or `failed`.
    status text NOT NULL,
    -- The step to execute next (or the one in flight or sleeping).
    step_id text,
    -- Step executions so far (the last history index).
    step_count integer NOT NULL DEFAULT 0,
    -- The run stream's version.
    version bigint NOT NULL,
    -- When the run steps next; null while it is parked by a pause or finished.
    due_at timestamptz,
    -- Parked because its workflow was paused (a `WorkflowRunPaused` was appended when it had
    -- started).
    paused boolean NOT NULL DEFAULT false,
    -- The step in flight: `{index, stepId, type, startedAtMs}` and, for a webhook call,
    -- `attempt` and `attempting` (committed before each attempt goes out).
    in_flight jsonb,
    -- A `wait_for_event`'s schema, and the log position after which an event counts.
    waiting_schema text,
    waiting_after bigint,
    -- The ready event that ended a `wait_for_event`.
    matched_event text,
    -- Passes made through each `goto`.
    passes jsonb NOT NULL DEFAULT '{}',
    -- The input and what steps produced (a `proto::Sealed` each, under the contact's key or
    -- the run's own): shredded with the key on erasure.
    input bytea NOT NULL,
    outputs bytea,
    lease_token uuid,
    lease_until timestamptz,
    requested_at timestamptz NOT NULL,
    finished_at timestamptz
);
CREATE INDEX workflow_runs_due ON workflow_runs (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX workflow_runs_parked ON workflow_runs (workflow_id) WHERE paused;
CREATE INDEX workflow_runs_waiting ON workflow_runs (contact_id, waiting_schema) WHERE waiting_schema IS NOT NULL;
CREATE INDEX workflow_runs_of_contact ON workflow_runs (contact_id) WHERE finished_at IS NULL;

-- Whether a workflow is paused, written by the pause and unpause commands' appends; the
-- engine reads it before each step.
CREATE TABLE workflow_controls (
    workflow_id text PRIMARY KEY,
    space_id text NOT NULL,
    paused boolean NOT NULL
);

-- Runs a trigger started per contact, for its re-entry rule (`once`, `once_at_a_time`).
CREATE TABLE workflow_entries (
    workflow_id text NOT NULL,
    contact_id text NOT NULL,
    run_id text NOT NULL,
    PRIMARY KEY (workflow_id, contact_id, run_id)
);
