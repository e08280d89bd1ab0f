-- Crypto-shredding: each data subject's data key, wrapped by the master key. Deleting the
-- row erases the subject: its personal fields in the log can no longer be decrypted.
CREATE TABLE subject_keys (
    subject_id text PRIMARY KEY,
    space_id text NOT NULL,
    wrapped_key bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Record deletion operations still being worked on by the eraser, and their outcome. The
-- row is inserted in the transaction of the RecordDeletionRequested event and moves to
-- `completed` in the transaction of RecordDeletionCompleted. `position` (the request's log
-- position) is set when the eraser has destroyed the key and blanked the write side's copies.
-- No personal data.
CREATE TABLE record_deletions (
    operation_id text PRIMARY KEY,
    record_id text NOT NULL UNIQUE,
    space_id text NOT NULL,
    schema_id text NOT NULL,
    state text NOT NULL CHECK (state IN ('pending', 'blocked', 'completed')),
    requested_at timestamptz NOT NULL DEFAULT now(),
    position bigint,
    erased_at timestamptz,
    completed_at timestamptz
);
CREATE INDEX record_deletions_open ON record_deletions (requested_at) WHERE state <> 'completed';

-- Deleting a record releases all of its identity claims at once.
CREATE INDEX record_identities_record ON record_identities (record_id);
