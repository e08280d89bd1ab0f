-- A newer revision of a workflow moves the runs in flight on earlier ones (its `inFlight`
-- rule, `migrate` or `exit`): the apply that publishes it marks their rows with the revision
-- to move to and makes them due, in its own transaction; the engine's next transition of each
-- run decides the move from the log's definitions and clears the mark, at the run's stream
-- version, so a run moves once. A wait keeps its due time in `in_flight.untilMs`.
ALTER TABLE workflow_runs ADD COLUMN migrate_to bigint;
-- The unfinished runs of a workflow by revision: what an apply counts by step and marks.
CREATE INDEX workflow_runs_open ON workflow_runs (workflow_id, revision) WHERE finished_at IS NULL;
-- The latest revision of a workflow whose publish moved runs: a run requested on an earlier
-- revision after that publish (its trigger read a catalog that had not caught up) is marked
-- when its row is inserted, so it moves too.
ALTER TABLE workflow_controls ADD COLUMN moved_to bigint;
