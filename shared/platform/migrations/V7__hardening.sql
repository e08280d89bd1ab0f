-- Recorded idempotent responses are found by the record they describe when the record's
-- deletion is requested (and blanked in that transaction).
CREATE INDEX idempotency_records_resource ON idempotency_records ((response -> 'data' ->> 'id'))
    WHERE response IS NOT NULL;

-- Events a read model could not apply (poison events). While a dead letter is open, its
-- read-model version holds back the later events of the same space (`space_key`: the event's
-- space, or '' for events without one) and goes on with every other space. An operator's
-- retry sets `resolved_at`; a retry that fails again reopens the row. See ARCHITECTURE.md.
CREATE TABLE projection_dead_letters (
    name text NOT NULL,
    version integer NOT NULL,
    position bigint NOT NULL,
    space_key text NOT NULL,
    event_type text NOT NULL,
    error text NOT NULL,
    failed_at timestamptz NOT NULL DEFAULT now(),
    retries integer NOT NULL DEFAULT 0,
    resolved_at timestamptz,
    PRIMARY KEY (name, version, position)
);
CREATE INDEX projection_dead_letters_open ON projection_dead_letters (name, version, space_key, position)
    WHERE resolved_at IS NULL;

-- The due-time scheduler (projector/src/timers.rs): work that must happen at or after a time
-- (webhook and email retries, broadcast schedules, workflow waits). A timer is claimed FOR
-- UPDATE SKIP LOCKED by the transaction that runs it and deleted or rescheduled there.
CREATE TABLE timers (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    key text NOT NULL,
    due_at timestamptz NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    attempts integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (kind, key)
);
CREATE INDEX timers_due ON timers (kind, due_at);
