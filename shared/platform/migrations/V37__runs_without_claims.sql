-- The processes that run a worker whose rows are shared out by hash rather than claimed one
-- by one (`liveness::Share`: the workflow engine's due runs). A process registers itself on
-- its first claim; a member counts while its `process_beats` row is fresh, so the rows of a
-- process that died go to the others within the dead-after bound. The maintenance worker
-- deletes members whose process has no beat row any more.
CREATE TABLE worker_members (
    worker text NOT NULL,
    process_id uuid NOT NULL,
    PRIMARY KEY (worker, process_id)
);

-- A run's row's own version: every transition's update of the row adds one and is guarded by
-- it, whether or not the transition appends (a webhook call's later attempts change only the
-- row). With no claim written before a transition, it is what keeps two processes from both
-- committing the same row-only change (both sending the same attempt).
ALTER TABLE workflow_runs ADD COLUMN row_version bigint NOT NULL DEFAULT 0;
