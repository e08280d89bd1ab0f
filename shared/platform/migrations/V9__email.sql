-- Email: the send outbox, the monthly allowance counters and double opt-in tokens.

-- One row per accepted send, inserted by a guard in the send's append. `pending` until a
-- hand-off claims it; `attempting` (leased) while one runs, committed before the relay is
-- contacted, so a row found `attempting` with an expired lease is a hand-off whose end was
-- never recorded: its outcome is unknown and it is never sent again blindly. Then `sent`,
-- `failed` or `unknown`, recorded with the matching log event.
CREATE TABLE email_outbox (
    email_id text PRIMARY KEY,
    space_id text NOT NULL,
    state text NOT NULL DEFAULT 'pending',
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    leased_until timestamptz,
    lease_token uuid,
    -- The idempotency claim of the send, completed with the outcome (null without a key).
    claim_scope_key text,
    claim_token uuid,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX email_outbox_due ON email_outbox (next_attempt_at) WHERE state IN ('pending', 'attempting');

-- Emails counted against a space's allowance per UTC month; the send's append increments it
-- only while it is under the allowance.
CREATE TABLE email_allowance_usage (
    space_id text NOT NULL,
    month text NOT NULL,
    used bigint NOT NULL,
    PRIMARY KEY (space_id, month)
);

-- Double opt-in links: a token's keyed digest (never the token), bound to one form and one
-- submission, valid until `expires_at`. Confirming sets `confirmed_at` once; following the
-- link again is still a success (D7).
CREATE TABLE form_tokens (
    token_digest text PRIMARY KEY,
    form_id text NOT NULL,
    submission_id text NOT NULL UNIQUE,
    space_id text NOT NULL,
    contact_id text NOT NULL,
    expires_at timestamptz NOT NULL,
    confirmed_at timestamptz
);
