-- What domain verification last found in DNS, per domain and record purpose (spf, dkim,
-- dmarc, returnPath): the verification worker's own record, like the delivery tables.
CREATE TABLE domain_checks (
    domain_id text NOT NULL,
    purpose text NOT NULL,
    found jsonb NOT NULL,
    checked_at timestamptz NOT NULL,
    PRIMARY KEY (domain_id, purpose)
);
