-- A recipient the send decision refuses leaves a story: its `EmailSkipped` is appended with
-- the recipient's move to `skipped` (the append's guard), and the run engine counts it into
-- its run afterwards, in the transaction that holds the run. `counted` marks the skipped
-- recipients not counted yet (a process that died between the two leaves some; the next step
-- counts them).
ALTER TABLE broadcast_recipients ADD COLUMN counted boolean NOT NULL DEFAULT true;
CREATE INDEX broadcast_recipients_uncounted ON broadcast_recipients (run_id) WHERE state = 'skipped' AND NOT counted;
