-- Outgoing webhooks: the delivery engine's own state (see ARCHITECTURE.md, "Webhook
-- delivery"). The resource itself lives in the log (stream `webhook-<id>`) and in the
-- `webhooks` read model; these tables are the side-effect workers' outbox and bookkeeping.

-- Webhooks as the enqueue worker folds them from the log, in the transaction that advances
-- its checkpoint: at each log position it matches events against exactly the webhooks that
-- were live there, with the URL, filter and secret version of that moment.
CREATE TABLE webhook_endpoints (
    webhook_id text PRIMARY KEY,
    space_id text NOT NULL,
    trigger text NOT NULL,
    schema_id text,
    email_event_types text[] NOT NULL DEFAULT '{}',
    url text NOT NULL,
    -- The generated custom filter (never returned by the API); null: every event.
    filter jsonb,
    -- `live`, `paused` or `deleted`.
    status text NOT NULL,
    secret_version integer NOT NULL
);
CREATE INDEX webhook_endpoints_live ON webhook_endpoints (space_id, trigger) WHERE status = 'live';

-- Every signing secret of a webhook, as the log holds it: an encoded `Sealed` under the
-- webhook's own data key (subject `webhook-<id>`), so deleting the webhook shreds them.
-- A delivery keeps the version current at its enqueue. After a rotation the previous
-- secret signs beside the new one until `previous_valid_until`.
CREATE TABLE webhook_secrets (
    webhook_id text NOT NULL,
    version integer NOT NULL,
    sealed bytea NOT NULL,
    previous_valid_until timestamptz,
    PRIMARY KEY (webhook_id, version)
);

-- Delivery counters, updated in the transaction that records each attempt, so they are
-- exact under any number of delivery workers.
CREATE TABLE webhook_counters (
    webhook_id text PRIMARY KEY,
    total_calls bigint NOT NULL DEFAULT 0,
    failed_calls bigint NOT NULL DEFAULT 0,
    failed_calls_in_a_row bigint NOT NULL DEFAULT 0,
    -- When the current run of failed attempts began (the circuit breaker's window).
    failing_since timestamptz,
    last_called_at timestamptz,
    last_call_error_message text
);

-- The outbox: one row per (log event, webhook) that matched, keyed by a delivery id derived
-- from both, so enqueuing again inserts nothing. The body is sealed under the data key of
-- the event's subject (`subject_id`) when it has one: erasing the subject shreds its queued
-- and delivered payloads. A delivery in flight is leased (`leased_until`, `lease_token`);
-- a worker that dies loses its lease when it expires and another worker attempts again.
CREATE TABLE webhook_deliveries (
    delivery_id text PRIMARY KEY,
    webhook_id text NOT NULL,
    space_id text NOT NULL,
    position bigint NOT NULL,
    type text NOT NULL,
    url text NOT NULL,
    secret_version integer NOT NULL,
    subject_id text,
    body bytea NOT NULL,
    -- `pending`, `delivered`, `failed` (retries exhausted or not retryable) or `dropped`
    -- (its webhook was paused or deleted, or its subject erased).
    state text NOT NULL DEFAULT 'pending',
    attempts integer NOT NULL DEFAULT 0,
    -- The attempts made before the owner's latest replay: the retry schedule restarts there.
    attempt_base integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    leased_until timestamptz,
    lease_token uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    last_status integer,
    last_error text
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_leased ON webhook_deliveries (webhook_id)
    WHERE state = 'pending' AND leased_until IS NOT NULL;
CREATE INDEX webhook_deliveries_of_webhook ON webhook_deliveries (webhook_id, created_at DESC, delivery_id DESC);

-- Each HTTP attempt of a delivery (the delivery log). No bodies, no secrets.
CREATE TABLE webhook_attempts (
    delivery_id text NOT NULL,
    attempt integer NOT NULL,
    attempted_at timestamptz NOT NULL,
    status integer,
    latency_ms integer NOT NULL,
    error text,
    PRIMARY KEY (delivery_id, attempt)
);
