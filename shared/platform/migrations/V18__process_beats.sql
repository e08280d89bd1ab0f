-- Server processes that are alive: each writes its row on start and refreshes `beat_at`
-- every few seconds on a connection of its own (see `shared::liveness`). A row whose beat is
-- older than the dead-after bound, or a missing row, means the process is gone. Work a process
-- claims names it (`idempotency_records.owner`), so a claim of a dead process is settled
-- within seconds instead of after the long claim timeout.
CREATE TABLE process_beats (
    process_id uuid PRIMARY KEY,
    role text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    beat_at timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE idempotency_records ADD COLUMN owner uuid;
