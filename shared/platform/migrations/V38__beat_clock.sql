-- Liveness in the database's available time, not the wall's (`platform::liveness`). While the
-- database is away (a failover, a restart) no process can beat, so by the wall every live
-- process looked dead the moment it came back, and its claims were taken over. The clock is
-- one row that every beat advances by the time since the last beat of any process, at most
-- `liveness::CLOCK_STEP` per beat: it stands still while nobody can beat. Each beat records
-- the clock's reading, and a process is presumed dead only once its beat is older than the
-- dead-after bound both by the wall and by this clock. A row without a reading (written
-- before this migration, or by a test) is judged by the wall alone.
CREATE TABLE beat_clock (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    available double precision NOT NULL DEFAULT 0,
    ticked_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO beat_clock DEFAULT VALUES;

ALTER TABLE process_beats ADD COLUMN available_at double precision;
