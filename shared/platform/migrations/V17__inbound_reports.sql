-- Mail that came back to a return path (bounces, complaints), written by the appends that
-- record it: a report delivered twice (its sender retried after our append but before our
-- answer reached it) is recorded once.
CREATE TABLE inbound_reports (
    digest text PRIMARY KEY,
    email_id text NOT NULL,
    kind text NOT NULL CHECK (kind IN ('hard_bounce', 'soft_bounce', 'complaint')),
    received_at timestamptz NOT NULL DEFAULT now()
);

-- Soft bounces by address (a keyed digest, never the address), for the rule that a run of
-- them within a window suppresses it. One row per email: one email's reports count once.
CREATE TABLE soft_bounces (
    space_id text NOT NULL,
    address_digest text NOT NULL,
    email_id text NOT NULL,
    bounced_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (space_id, address_digest, email_id)
);
CREATE INDEX inbound_reports_received ON inbound_reports (received_at);
