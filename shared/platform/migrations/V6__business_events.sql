-- Event receipts: one row per accepted occurrence, the write side's dedupe index for
-- `eventId` and the source of the pending and retained counts. `input_digest` is a keyed
-- digest of the normalised input and occurredAt (never the values), cleared when the
-- subject record is erased. A receipt is retired (deleted) once its retention has passed and
-- its preparation is over; its eventId may then be accepted again as a new occurrence.
CREATE TABLE event_receipts (
    space_id text NOT NULL,
    schema_id text NOT NULL,
    event_id text NOT NULL,
    id text NOT NULL UNIQUE,
    input_digest text,
    subject_id text,
    receipt jsonb NOT NULL,
    pending boolean NOT NULL,
    accepted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (space_id, schema_id, event_id)
);
CREATE INDEX event_receipts_subject ON event_receipts (subject_id) WHERE subject_id IS NOT NULL;
CREATE INDEX event_receipts_retirement ON event_receipts (accepted_at) WHERE NOT pending;

-- Event admission per scope (`fleet`, `space:<id>`, `schema:<id>`): a token bucket (tokens
-- and when they were last refilled, on the database's clock) and the counts the caps apply
-- to. Updated in the transaction of each acceptance, so every command-service instance
-- shares one budget and a rolled-back acceptance gives its capacity back.
CREATE TABLE event_admission (
    scope text PRIMARY KEY,
    tokens double precision NOT NULL,
    refilled_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    pending bigint NOT NULL DEFAULT 0,
    receipts bigint NOT NULL DEFAULT 0
);

-- AI credits spent per space (the log's `credits_spent` summed). A space's remaining credits
-- are its authored grant (`AiCreditsSet`) minus this.
CREATE TABLE ai_credit_spend (
    space_id text PRIMARY KEY,
    spent bigint NOT NULL DEFAULT 0
);

-- Checkpoints of log followers that are not projections (the preparation worker).
CREATE TABLE worker_checkpoints (
    name text PRIMARY KEY,
    position bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Identity binding: operations already applied (replayed by operationId) and per-space
-- capacity counts. No anonymous ids: aliases are named by a keyed digest.
CREATE TABLE identity_operations (
    space_id text NOT NULL,
    operation_id text NOT NULL,
    body_digest text NOT NULL,
    result jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (space_id, operation_id)
);
CREATE TABLE identity_aliases (
    space_id text NOT NULL,
    alias_digest text NOT NULL,
    contact_id text,
    revision bigint NOT NULL,
    -- The contact it was bound to was erased: the alias accepts no more changes.
    erased boolean NOT NULL DEFAULT false,
    PRIMARY KEY (space_id, alias_digest)
);
CREATE INDEX identity_aliases_contact ON identity_aliases (contact_id) WHERE contact_id IS NOT NULL;
CREATE TABLE identity_capacity (
    space_id text PRIMARY KEY,
    aliases bigint NOT NULL DEFAULT 0,
    changes bigint NOT NULL DEFAULT 0
);
