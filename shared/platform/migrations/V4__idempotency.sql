-- Idempotency claims and recorded outcomes. A claim is taken (and committed) before the
-- operation runs; its outcome is recorded in the same transaction as the operation's append,
-- guarded by the claim token, so an acknowledged write and its recorded response cannot
-- diverge and a claim taken over by reconciliation can no longer complete.
CREATE TABLE idempotency_records (
    scope_key text PRIMARY KEY,
    key_id text NOT NULL,
    method text NOT NULL,
    path text NOT NULL,
    idempotency_key text NOT NULL,
    body_hash text NOT NULL,
    operation_id text NOT NULL,
    claim_token uuid NOT NULL,
    state text NOT NULL CHECK (state IN ('processing', 'completed', 'unresolved')),
    status integer,
    response jsonb,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz
);
CREATE INDEX idempotency_records_completed ON idempotency_records (completed_at) WHERE state = 'completed';
CREATE INDEX idempotency_records_processing ON idempotency_records (claimed_at) WHERE state = 'processing';
