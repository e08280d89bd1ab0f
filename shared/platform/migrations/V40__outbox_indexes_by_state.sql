-- The outbox's due index held `pending` and `attempting` rows together, so the outbox worker's
-- search for abandoned `attempting` rows read every pending row's entry on each step (a
-- broadcast or a held release leaves tens of thousands pending). Each state now has an index
-- of its own: pending rows by when they are due, attempting rows by when their lease ends.
CREATE INDEX email_outbox_pending ON email_outbox (next_attempt_at) WHERE state = 'pending';
CREATE INDEX email_outbox_attempting ON email_outbox (leased_until) WHERE state = 'attempting';
DROP INDEX email_outbox_due;
