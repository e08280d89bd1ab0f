-- A broadcast run counts recipients without email consent apart from those not subscribed to
-- the template's topic: a sender can tell "never consented" from "left the topic". Runs
-- counted before keep both under `not_subscribed` (their recipients' reasons do not say which).
ALTER TABLE broadcast_runs ADD COLUMN skipped_no_consent bigint NOT NULL DEFAULT 0;
