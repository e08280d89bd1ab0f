-- The process that holds an outbox row: the one that appended it until its first hand-off,
-- then the one whose hand-off leased it (`platform::liveness`). A row whose holder stopped
-- beating is taken over at once, not after the hand-off grace or the lease: a pending email
-- of a process that died before its hand-off is handed off by the outbox worker, and an
-- attempting one is settled as unknown. NULL: a holder that does not beat (never presumed
-- dead; the grace and the lease apply).
ALTER TABLE email_outbox ADD COLUMN owner uuid;
-- The email of a keyed template send, by the idempotency claim its outcome completes: an
-- admission that meets the claim of a dead process asks whether the send was appended.
CREATE INDEX email_outbox_claim ON email_outbox (claim_scope_key) WHERE claim_scope_key IS NOT NULL;
