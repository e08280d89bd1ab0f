-- The slot a process fills (`platform::liveness::Beat::fills`): `command-service@host:port`,
-- or what `APP__INSTANCE` names. A process that starts in a slot deletes the beat rows of the
-- processes that filled it before (a missing row means dead), so work a killed process held
-- is taken over as soon as its replacement beats, not after the dead-after bound.
ALTER TABLE process_beats ADD COLUMN instance text;
