-- The skips of each broadcast run, counted as the run engine decides them (in the statement
-- that marks the recipients), so a run's counts are read, never counted at request time.
ALTER TABLE broadcast_runs
    ADD COLUMN skipped_not_subscribed bigint NOT NULL DEFAULT 0,
    ADD COLUMN skipped_suppressed bigint NOT NULL DEFAULT 0,
    ADD COLUMN skipped_allowance bigint NOT NULL DEFAULT 0,
    ADD COLUMN skipped_no_address bigint NOT NULL DEFAULT 0,
    ADD COLUMN skipped_gone bigint NOT NULL DEFAULT 0;

UPDATE broadcast_runs r SET
    skipped_not_subscribed = s.not_subscribed,
    skipped_suppressed = s.suppressed,
    skipped_allowance = s.allowance,
    skipped_no_address = s.no_address,
    skipped_gone = s.gone
FROM (
    SELECT run_id,
           count(*) FILTER (WHERE reason = 'not_subscribed') AS not_subscribed,
           count(*) FILTER (WHERE reason = 'suppressed') AS suppressed,
           count(*) FILTER (WHERE reason = 'allowance') AS allowance,
           count(*) FILTER (WHERE reason = 'no_address') AS no_address,
           count(*) FILTER (WHERE reason = 'gone') AS gone
    FROM broadcast_recipients WHERE state = 'skipped' GROUP BY run_id
) s
WHERE r.run_id = s.run_id;
