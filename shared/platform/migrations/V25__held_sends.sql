-- A marketing send the send policy holds: its email is stored with an outbox row `held`
-- until `next_attempt_at`, when the held sends worker decides it again (and leases the row
-- while it does, `leased_until` and `lease_token`). A held broadcast recipient is `held`.
CREATE INDEX email_outbox_held ON email_outbox (next_attempt_at) WHERE state = 'held';
