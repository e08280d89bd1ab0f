-- Recorded idempotent responses are found by the record they describe when the record's
-- deletion is requested (and blanked in that transaction).
CREATE INDEX idempotency_records_resource ON idempotency_records ((response -> 'data' ->> 'id'))
    WHERE response IS NOT NULL;
