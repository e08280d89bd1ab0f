-- Broadcast experiments (docs/decisions.md, "Broadcast experiments"). A run requested with an
-- experiment (the broadcast's at the request, as the catalog stores it) sends its test share
-- one variant each, waits, decides a winner (recorded once in the log:
-- `BroadcastExperimentDecided` on the run's own stream) and sends the winner to the rest.
ALTER TABLE broadcast_runs
    ADD COLUMN experiment jsonb,
    -- NULL without an experiment; `test` (sending the test share), `wait` (until `decide_at`),
    -- `winner` (sending the winner to the rest) or `stopped` (no winner: the rest got nothing).
    ADD COLUMN phase text,
    ADD COLUMN decide_at timestamptz,
    -- The log's head once every open and click taken by `decide_at` was in the log: the
    -- verdict reads the `emails` read model once it has applied that far.
    ADD COLUMN verdict_due bigint,
    -- The variant the rest is sent, once decided.
    ADD COLUMN winner text,
    -- The verdict as the API shows it, once decided.
    ADD COLUMN verdict jsonb,
    -- The rest of the audience when the experiment stopped without a winner.
    ADD COLUMN skipped_experiment_stopped bigint NOT NULL DEFAULT 0;
-- A test recipient's variant; NULL for the rest of the audience (sent the run's winner).
ALTER TABLE broadcast_recipients ADD COLUMN variant text;
CREATE INDEX broadcast_recipients_test_pending ON broadcast_recipients (run_id, contact_id)
    WHERE state = 'pending' AND variant IS NOT NULL;
