-- The marketing emails each contact was sent, as their appends record them (a guard of the
-- append that schedules the email), for the send policy's frequency caps: a send's decision
-- reads the contact's rows within the policy's longest window, one statement for a batch.
CREATE TABLE marketing_sends (
    contact_id text NOT NULL,
    at_ms bigint NOT NULL,
    email_id text NOT NULL,
    -- The email's topic; '' for none.
    topic_id text NOT NULL DEFAULT '',
    PRIMARY KEY (contact_id, at_ms, email_id)
);

-- A broadcast run's recipients the send policy skipped, by rule.
ALTER TABLE broadcast_runs
    ADD COLUMN skipped_frequency_cap bigint NOT NULL DEFAULT 0,
    ADD COLUMN skipped_quiet_hours bigint NOT NULL DEFAULT 0;
