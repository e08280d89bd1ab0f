-- The append-only event log and the write-side tables that guard it.

-- The single counter row. Every append transaction updates it as its last write before
-- COMMIT, so positions become visible in order and without gaps.
CREATE TABLE log_head (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    position bigint NOT NULL
);
INSERT INTO log_head (singleton, position) VALUES (true, 0);

CREATE TABLE events (
    position bigint PRIMARY KEY,
    event_id uuid NOT NULL UNIQUE,
    stream_id text NOT NULL,
    stream_version bigint NOT NULL,
    event_type text NOT NULL,
    payload bytea NOT NULL,
    space_id text,
    actor_key_id text,
    actor_user_id text,
    request_id text,
    idempotency_key text,
    subject_id text,
    occurred_at timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (stream_id, stream_version)
);
CREATE INDEX events_subject ON events (subject_id, position) WHERE subject_id IS NOT NULL;

-- Log rows are never updated or deleted.
CREATE FUNCTION events_are_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the event log is append-only: % is not allowed', TG_OP;
END;
$$;
CREATE TRIGGER events_no_update_or_delete BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_are_append_only();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_are_append_only();

-- Current version of every stream: the optimistic-concurrency guard, taken per command
-- inside its savepoint so a lost race fails only that command.
CREATE TABLE streams (
    stream_id text PRIMARY KEY,
    version bigint NOT NULL
);

-- Write-side uniqueness of record identities (userId, email, phone, externalId) per schema.
CREATE TABLE record_identities (
    space_id text NOT NULL,
    schema_id text NOT NULL,
    kind text NOT NULL,
    value text NOT NULL,
    record_id text NOT NULL,
    PRIMARY KEY (space_id, schema_id, kind, value)
);

-- The latest log position written by each API key, for read-your-writes.
CREATE TABLE key_positions (
    key_id text PRIMARY KEY,
    position bigint NOT NULL
);

-- Projections: one row per (name, version). The row is the checkpoint and, locked
-- FOR UPDATE SKIP LOCKED for a batch, the lease. Exactly one version per name is live.
CREATE TABLE projections (
    name text NOT NULL,
    version integer NOT NULL,
    position bigint NOT NULL DEFAULT 0,
    status text NOT NULL CHECK (status IN ('building', 'live', 'retired', 'halted')),
    halted_reason text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);
CREATE UNIQUE INDEX projections_one_live ON projections (name) WHERE status = 'live';

-- Every committed projection batch, so overlapping work by two projector processes
-- would be visible (and is checked by the tests).
CREATE TABLE projection_batches (
    name text NOT NULL,
    version integer NOT NULL,
    first_position bigint NOT NULL,
    last_position bigint NOT NULL,
    worker text NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version, first_position)
);
