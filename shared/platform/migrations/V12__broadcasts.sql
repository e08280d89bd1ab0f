-- Broadcast runs: the run engine's own record of its work (like the webhook and email
-- outboxes), not a read model. A run is requested in the log (`BroadcastRunRequested`, whose
-- append inserts the row and its start timer); it snapshots its audience into
-- `broadcast_recipients` when it starts, and each recipient leaves `pending` exactly once: in
-- the append of its email (`scheduled`, with the email id) or as `skipped` with a reason.
CREATE TABLE broadcast_runs (
    run_id text PRIMARY KEY,
    broadcast_id text NOT NULL,
    space_id text NOT NULL,
    -- `scheduled`, `sending`, `completed` or `failed` (its audience was gone at the start).
    status text NOT NULL DEFAULT 'scheduled',
    template_id text NOT NULL,
    sender_id text,
    audience jsonb NOT NULL,
    start_at timestamptz NOT NULL,
    requested_at timestamptz NOT NULL,
    started_at timestamptz,
    finished_at timestamptz,
    audience_count integer,
    error text
);
-- One active run per broadcast: a second send is refused while one is scheduled or sending.
CREATE UNIQUE INDEX broadcast_runs_active ON broadcast_runs (broadcast_id) WHERE status IN ('scheduled', 'sending');
CREATE INDEX broadcast_runs_of_broadcast ON broadcast_runs (broadcast_id, requested_at DESC, run_id DESC);
CREATE INDEX broadcast_runs_sending ON broadcast_runs (started_at) WHERE status = 'sending';

CREATE TABLE broadcast_recipients (
    run_id text NOT NULL,
    contact_id text NOT NULL,
    -- `pending`, `scheduled` (its email is in the outbox) or `skipped`.
    state text NOT NULL DEFAULT 'pending',
    -- Why skipped: `not_subscribed`, `suppressed`, `allowance`, `no_address`, `gone`.
    reason text,
    email_id text,
    PRIMARY KEY (run_id, contact_id)
);
CREATE INDEX broadcast_recipients_pending ON broadcast_recipients (run_id, contact_id) WHERE state = 'pending';
CREATE INDEX broadcast_recipients_email ON broadcast_recipients (email_id) WHERE email_id IS NOT NULL;
