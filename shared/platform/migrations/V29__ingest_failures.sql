-- Messages of the Segment-compatible ingest that could not be applied, each kept with its
-- reason for `GET /v1/ingest-failures` and `platform status` (written in the same append as
-- the `IngestMessagesRefused` that records them on the log). The message is the caller's, as
-- sent: personal data, dropped with the row after 30 days (maintenance).
CREATE TABLE ingest_failures (
    failure_id bigserial PRIMARY KEY,
    space_id text NOT NULL,
    write_key_id text NOT NULL,
    message_id text NOT NULL,
    message_type text NOT NULL,
    code text NOT NULL,
    reason text NOT NULL,
    message jsonb NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ingest_failures_by_space ON ingest_failures (space_id, failure_id DESC);
CREATE INDEX ingest_failures_by_time ON ingest_failures (received_at);
-- A message refused again when its batch is sent again is listed once.
CREATE UNIQUE INDEX ingest_failures_once ON ingest_failures (space_id, write_key_id, message_id) WHERE message_id <> '';
