-- Live load: each API process's rate of requests served (per second, over its last half
-- second), written only while it serves requests. Background work (the imports worker) reads
-- it to yield the machine to live traffic; a row older than a second means no live load from
-- that process. Not derived from the log: an operational signal, like the rate-limit windows.
CREATE TABLE live_load (
    instance text PRIMARY KEY,
    at timestamptz NOT NULL,
    per_second integer NOT NULL
);
