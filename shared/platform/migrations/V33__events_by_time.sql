-- The log by the time of its appends, for the maintenance worker's reconciliation of
-- unresolved idempotency claims (did the operation append anything since its claim?): without
-- it, each pass read the whole log while any such claim stood. A BRIN index: the log is
-- appended in time order, so a range of pages summarises as a range of times; it costs an
-- append nothing until a range fills (autovacuum then summarises it) and is a few pages big.
CREATE INDEX events_recorded_at ON events USING brin (recorded_at) WITH (autosummarize = on);
